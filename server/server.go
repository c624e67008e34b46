package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/keylimits"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/workers"
)

// RequestEnricher fills the routing inputs a policy needs beyond the candidates (prompt
// tokens, block hashes) before Pick. An error made by BadRequest fails the request with 400
// (the request is wrong, e.g. its chat template raised an error, and the worker would refuse
// it too); any other error is logged and the request is routed without the enrichment: a
// tokenizer problem must never fail a request the worker could serve.
type RequestEnricher interface {
	Enrich(ctx context.Context, in *apireq.Request, req *router.Request) error
}

// Options are the parts a Server is built from.
type Options struct {
	Config configs.Config
	// Pools are the served models, each with its own fleet and routing; the first is the
	// default model (a request without "model"). Empty: one pool of Config.Model and
	// Config.BlockSize with Registry, Router and Enricher below.
	Pools    []Pool
	Registry *workers.Registry
	// Router is the routing side (a *router.Dispatcher): the server calls Start per request,
	// Route per attempt and reports the attempt's steps on its Lifecycle; the debug endpoints
	// read its views.
	Router   router.Router
	Enricher RequestEnricher // optional
	Logger   *slog.Logger    // optional
	// Metrics is the Prometheus registry GET /metrics serves; the server registers its own
	// series on it. Nil makes a new one (other components then register on Server.Metrics).
	Metrics *prometheus.Registry
	// Details are further components /health and GET /debug/workers report (the cluster
	// link); a degraded one is shown, never a reason to answer 503.
	Details []HealthDetail
	// Readiness are the components GET /ready asks besides the server's own checks (draining,
	// and each model pool's "at least one routable worker", which NoFleetReadiness leaves out
	// for callers that check their pools themselves).
	Readiness []ReadinessCheck
	// NoFleetReadiness drops the built-in check that every pool's registry has a routable
	// worker (a caller that checks its pools itself asks those instead).
	NoFleetReadiness bool
}

// HealthDetail is a component whose state /health and GET /debug/workers report under its
// name (the cluster node: NATS connected or degraded).
type HealthDetail interface {
	HealthDetail() (name string, detail any, degraded bool)
}

// Server is the gateway's HTTP front. Each Server owns its gin engine and Prometheus registry.
type Server struct {
	cfg      configs.Config
	pools    []*pool        // the served models; pools[0] is the default
	requests *apireq.Parser // the request model: one parse per body, session identity
	log      *slog.Logger
	m        *metrics
	engine   *gin.Engine // the client listener: OpenAI API, /health, /metrics
	admin    *gin.Engine // the admin listener: /debug/*

	clientKeys keySet             // empty: the client listener is open
	tenants    *tenants           // the client keys' names and cache salts, in clientKeys order
	limits     *keylimits.Limiter // the client keys' limits (nil: no key has any)
	adminToken keySet             // empty: the admin listener is open
	tokenize   *tokenizeSlots     // caps concurrent enrichments (tokenizations)
	items      *itemIndex         // Responses output item → the stored response holding it
	details    []HealthDetail
	checks     []ReadinessCheck // what GET /ready asks besides the shutdown phase

	state  atomic.Int32    // the client listener's shutdown phase (phaseServing...)
	cutCtx context.Context // done when the shutdown deadline cuts running requests
	cut    context.CancelFunc
}

// New builds a server; it does not start probing or listening (see Serve).
func New(opts Options) (*Server, error) {
	pools, err := newPools(opts)
	if err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:      opts.Config,
		pools:    pools,
		requests: apireq.NewParser(identityConfig(opts.Config.Sessions)),
		log:      opts.Logger,
		tokenize: newTokenizeSlots(opts.Config.Limits),
		// One entry per output item of a stored response, bounded like the response pins.
		items:   newItemIndex(opts.Config.Router.Responses.MaxPins),
		details: opts.Details,
	}
	s.m = newMetrics(s.allWorkers, opts.Metrics)
	if opts.Config.FlowControl.Enabled {
		fm := newFlowMetrics(s.m.reg)
		for _, p := range s.pools {
			p.flow = newFlowGate(opts.Config.FlowControl, p, fm, s.log)
		}
	}
	s.cutCtx, s.cut = context.WithCancel(context.Background())
	if !opts.NoFleetReadiness {
		for _, p := range s.pools {
			s.checks = append(s.checks, registryReadiness{p})
		}
	}
	s.checks = append(s.checks, opts.Readiness...)
	if err := s.requests.SetInlineSystem(opts.Config.Anthropic.InlineSystem); err != nil {
		return nil, fmt.Errorf("server: anthropic.inline_system: %w", err)
	}
	entries, err := opts.Config.ClientKeys()
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	keys := make([]string, len(entries))
	for i, k := range entries {
		keys[i] = k.Key
	}
	s.clientKeys = newKeySet(keys)
	if s.tenants, err = newTenants(opts.Config, entries); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s.limits = newKeyLimiter(entries, opts.Config.Cluster.PeerTimeout.D())
	if opts.Config.AdminToken != "" {
		s.adminToken = newKeySet([]string{opts.Config.AdminToken})
	}
	gin.SetMode(gin.ReleaseMode) // no route dump on stdout; gin keeps its mode globally
	e := s.newEngine()
	s.registerProbes(e) // before CORS and auth: probes carry no credentials
	if opts.Config.AccessLog {
		e.Use(s.accessLog) // before auth: a 401 is logged too
	}
	if o := opts.Config.CORS.AllowedOrigins; len(o) > 0 {
		// Before auth: a preflight carries no credentials.
		e.Use(s.cors(o))
	}
	if len(s.clientKeys) > 0 {
		e.Use(s.clientAuth, s.identifyTenant, s.limitHeaders)
	}
	e.POST(pathChat, s.handleCompletion(pathChat))
	e.POST(pathCompletions, s.handleCompletion(pathCompletions))
	s.registerMessages(e)
	e.POST(pathResponses, s.handleCompletion(pathResponses))
	e.GET(pathResponses+"/:id", s.handleResponseByID)
	e.DELETE(pathResponses+"/:id", s.handleResponseByID)
	e.POST(pathResponses+"/:id/cancel", s.handleResponseByID)
	e.GET(pathResponses+"/:id/input_items", s.handleResponseByID)
	e.GET("/v1/models", s.handleModels)
	e.GET("/v1/models/*id", s.handleModel)
	s.addPassthrough(e)
	e.GET("/", handleRoot)
	e.NoRoute(headAsGet(e, s.noRoute(http.StatusNotFound)))
	e.NoMethod(headAsGet(e, s.noRoute(http.StatusMethodNotAllowed)))
	e.GET("/health", s.handleHealth)
	e.HEAD("/health", s.handleHealth)
	// The per-worker series reveal when which worker cached how much of a prompt: on the
	// client listener only with metrics.detailed_public, always on the admin one.
	var public prometheus.Gatherer = publicGatherer{s.m.reg}
	if opts.Config.Metrics.DetailedPublic {
		public = s.m.reg
	}
	e.GET("/metrics", gin.WrapH(promhttp.HandlerFor(public, promhttp.HandlerOpts{})))
	s.engine = e

	// The debug endpoints reveal routing and cache state (which prompts are cached where), so
	// they live on their own listener, never on the client one.
	a := s.newEngine()
	if len(s.adminToken) > 0 {
		a.Use(s.adminAuth)
	}
	a.POST("/debug/route", s.handleDebugRoute)
	a.GET("/debug/workers", s.handleDebugWorkers)
	a.GET("/debug/sessions/*id", s.handleDebugSession)
	a.GET("/metrics", gin.WrapH(promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{})))
	s.admin = a
	return s, nil
}

// newEngine is a gin engine with the server's panic recovery and JSON 404/405 answers.
func (s *Server) newEngine() *gin.Engine {
	e := gin.New()
	e.HandleMethodNotAllowed = true
	e.ContextWithFallback = true
	e.Use(s.recovery)
	e.NoRoute(headAsGet(e, func(c *gin.Context) {
		writeError(c, &apiError{Status: http.StatusNotFound, Message: fmt.Sprintf("no route %s %s", c.Request.Method, c.Request.URL.Path)})
	}))
	e.NoMethod(headAsGet(e, func(c *gin.Context) {
		writeError(c, &apiError{Status: http.StatusMethodNotAllowed, Message: fmt.Sprintf("method %s not allowed on %s", c.Request.Method, c.Request.URL.Path)})
	}))
	return e
}

// headAsGet answers a HEAD request on a path without a HEAD route as the GET route there
// answers it, headers and status only (RFC 9110 §9.3.2; HEAD / is the first request Claude
// Code sends): the request is handled again as a GET, on a copy, so net/http still knows the
// client asked for HEAD and sends no body. Anything else, and a HEAD where no GET route
// matches either, goes to fallback.
func headAsGet(e *gin.Engine, fallback gin.HandlerFunc) gin.HandlerFunc {
	return func(c *gin.Context) {
		if c.Request.Method != http.MethodHead {
			fallback(c)
			return
		}
		r := c.Request.Clone(c.Request.Context())
		r.Method = http.MethodGet
		c.Request = r
		c.Status(http.StatusOK) // gin preset 404 or 405; the GET handler's own status decides
		e.HandleContext(c)
	}
}

// handleRoot answers GET (and HEAD) / with 200, so a client's reachability check of the base
// URL succeeds.
func handleRoot(c *gin.Context) {
	c.JSON(http.StatusOK, gin.H{"status": "ok"})
}

// Handler returns the client listener's HTTP handler (for tests and embedding).
func (s *Server) Handler() http.Handler { return s.engine }

// AdminHandler returns the admin listener's HTTP handler: /debug/*, behind admin_token when
// one is set (for tests and embedding; Serve runs it on admin_listen).
func (s *Server) AdminHandler() http.Handler { return s.admin }

// Engine exposes the client listener's gin engine so other packages can add routes before
// Serve; routes added here are public (and behind auth.api_keys when set).
func (s *Server) Engine() *gin.Engine { return s.engine }

// AdminEngine exposes the admin listener's gin engine, for further diagnostic routes.
func (s *Server) AdminEngine() *gin.Engine { return s.admin }

// Metrics is the server's own Prometheus registry; other components may register on it.
func (s *Server) Metrics() *prometheus.Registry { return s.m.reg }

// recovery turns a panic into a 500 (or an aborted connection if the response had started),
// so no panic reaches a client as a dropped connection without a reason.
func (s *Server) recovery(c *gin.Context) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if r == http.ErrAbortHandler {
			panic(r) // deliberate abort of a broken response; net/http closes the connection
		}
		s.log.Error("panic in handler", "path", c.Request.URL.Path, "panic", r)
		if !c.Writer.Written() {
			writeError(c, &apiError{Status: http.StatusInternalServerError, Message: "internal error"})
			return
		}
		panic(http.ErrAbortHandler)
	}()
	c.Next()
}

// Serve serves the client listener on ln until ctx ends, then shuts down in three steps:
// GET /ready turns 503 at once while requests are still accepted for shutdown_drain_delay
// (load balancers stop sending); then the listener closes (GET /live turns 503) and running
// requests get up to shutdown_timeout; requests still running then are cut, a stream with a
// final error event, and the remaining connections closed. It returns nil after a clean
// shutdown, the cut included.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if n := s.cfg.Limits.MaxConnsPerIP; n > 0 {
		ln = newPerIPListener(ln, n, s.log)
	}
	return s.serve(ctx, ln, s.engine, true)
}

// ServeAdmin serves the admin listener (/debug/*) on ln until ctx ends, then stops accepting
// and lets running requests finish for up to shutdown_timeout. It has no drain step: give it
// a ctx that ends when Serve returns to keep it up while the client listener drains.
func (s *Server) ServeAdmin(ctx context.Context, ln net.Listener) error {
	return s.serve(ctx, ln, s.admin, false)
}

// cutGrace bounds how long requests cut at the shutdown deadline get to write their final
// error event before their connections are closed.
const cutGrace = 2 * time.Second

func (s *Server) serve(ctx context.Context, ln net.Listener, h http.Handler, client bool) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       120 * time.Second,
		// No WriteTimeout: streams may run for minutes.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ErrorLog:    slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	if client {
		s.drain(srv, errc)
	}
	s.log.Info("closing the listener; running requests may finish", "addr", ln.Addr().String(), "deadline", s.cfg.ShutdownTimeout.D())
	sdCtx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout.D())
	defer cancel()
	err := srv.Shutdown(sdCtx)
	if errors.Is(err, context.DeadlineExceeded) && client {
		s.log.Warn("shutdown_timeout reached; cutting the running requests (streams end with an error event)")
		s.cut()
		graceCtx, cancelGrace := context.WithTimeout(context.Background(), cutGrace)
		defer cancelGrace()
		err = srv.Shutdown(graceCtx)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		s.log.Warn("closing the remaining connections", "addr", ln.Addr().String())
		err = srv.Close()
	}
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", serr)
	}
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// drain is the client listener's first shutdown step: /ready turns 503 and, for
// shutdown_drain_delay, requests are still served (each on a connection closed after its
// response, so clients reconnect through the updated endpoints). A listener that fails
// meanwhile ends the wait.
func (s *Server) drain(srv *http.Server, errc chan error) {
	s.state.Store(phaseDraining)
	delay := s.cfg.ShutdownDrainDelay.D()
	s.log.Info("draining: /ready answers 503; still accepting requests", "drain_delay", delay)
	srv.SetKeepAlivesEnabled(false)
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case err := <-errc:
			t.Stop()
			errc <- err // serve reads it after Shutdown
		}
	}
	s.state.Store(phaseStopping)
}
