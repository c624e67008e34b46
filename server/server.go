package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/configs"
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
	Config   configs.Config
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
	// Readiness are the components GET /ready asks besides the server's own checks.
	Readiness []ReadinessCheck
}

// HealthDetail is a component whose state /health and GET /debug/workers report under its
// name (the cluster node: NATS connected or degraded).
type HealthDetail interface {
	HealthDetail() (name string, detail any, degraded bool)
}

// Server is the gateway's HTTP front. Each Server owns its gin engine and Prometheus registry.
type Server struct {
	cfg      configs.Config
	reg      *workers.Registry
	router   router.Router
	enricher RequestEnricher
	requests *apireq.Parser // the request model: one parse per body, session identity
	log      *slog.Logger
	m        *metrics
	engine   *gin.Engine // the client listener: OpenAI API, /health, /metrics
	admin    *gin.Engine // the admin listener: /debug/*

	clientKeys keySet         // empty: the client listener is open
	adminToken keySet         // empty: the admin listener is open
	tokenize   *tokenizeSlots // caps concurrent enrichments (tokenizations)
	details    []HealthDetail
}

// New builds a server; it does not start probing or listening (see Serve).
func New(opts Options) (*Server, error) {
	if opts.Registry == nil || opts.Router == nil {
		return nil, errors.New("server: registry and router are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:      opts.Config,
		reg:      opts.Registry,
		router:   opts.Router,
		enricher: opts.Enricher,
		requests: apireq.NewParser(identityConfig(opts.Config.Sessions)),
		log:      opts.Logger,
		m:        newMetrics(opts.Registry, opts.Metrics),
		tokenize: newTokenizeSlots(opts.Config.Limits),
		details:  opts.Details,
	}
	if err := s.requests.SetInlineSystem(opts.Config.Anthropic.InlineSystem); err != nil {
		return nil, fmt.Errorf("server: anthropic.inline_system: %w", err)
	}
	keys, err := opts.Config.ClientAPIKeys()
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s.clientKeys = newKeySet(keys)
	if opts.Config.AdminToken != "" {
		s.adminToken = newKeySet([]string{opts.Config.AdminToken})
	}
	gin.SetMode(gin.ReleaseMode) // no route dump on stdout; gin keeps its mode globally
	e := s.newEngine()
	if o := opts.Config.CORS.AllowedOrigins; len(o) > 0 {
		// Before auth: a preflight carries no credentials.
		e.Use(s.cors(o))
	}
	if len(s.clientKeys) > 0 {
		e.Use(s.clientAuth)
	}
	e.POST(pathChat, s.handleCompletion(pathChat))
	e.POST(pathCompletions, s.handleCompletion(pathCompletions))
	s.registerMessages(e)
	e.POST(pathResponses, s.handleCompletion(pathResponses))
	e.GET(pathResponses+"/:id", s.handleResponseByID)
	e.DELETE(pathResponses+"/:id", s.handleResponseByID)
	e.POST(pathResponses+"/:id/cancel", s.handleResponseByID)
	e.GET("/v1/models", s.handleModels)
	e.GET("/v1/models/*id", s.handleModel)
	s.addPassthrough(e)
	e.NoRoute(s.noRoute(http.StatusNotFound))
	e.NoMethod(s.noRoute(http.StatusMethodNotAllowed))
	e.GET("/health", s.handleHealth)
	e.HEAD("/health", s.handleHealth)
	metricsHandler := promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{})
	e.GET("/metrics", gin.WrapH(metricsHandler))
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
	s.admin = a
	return s, nil
}

// newEngine is a gin engine with the server's panic recovery and JSON 404/405 answers.
func (s *Server) newEngine() *gin.Engine {
	e := gin.New()
	e.HandleMethodNotAllowed = true
	e.ContextWithFallback = true
	e.Use(s.recovery)
	e.NoRoute(func(c *gin.Context) {
		writeError(c, &apiError{Status: http.StatusNotFound, Message: fmt.Sprintf("no route %s %s", c.Request.Method, c.Request.URL.Path)})
	})
	e.NoMethod(func(c *gin.Context) {
		writeError(c, &apiError{Status: http.StatusMethodNotAllowed, Message: fmt.Sprintf("method %s not allowed on %s", c.Request.Method, c.Request.URL.Path)})
	})
	return e
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

// Serve serves the client listener on ln until ctx ends, then shuts down gracefully: it stops
// accepting, lets running requests finish for up to shutdown_timeout, then closes what remains
// (which cancels their upstream requests). It returns nil after a clean shutdown.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if n := s.cfg.Limits.MaxConnsPerIP; n > 0 {
		ln = newPerIPListener(ln, n, s.log)
	}
	return s.serve(ctx, ln, s.engine)
}

// ServeAdmin serves the admin listener (/debug/*) on ln until ctx ends, as Serve does.
func (s *Server) ServeAdmin(ctx context.Context, ln net.Listener) error {
	return s.serve(ctx, ln, s.admin)
}

func (s *Server) serve(ctx context.Context, ln net.Listener, h http.Handler) error {
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
	s.log.Info("shutting down", "deadline", s.cfg.ShutdownTimeout.D())
	sdCtx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout.D())
	defer cancel()
	err := srv.Shutdown(sdCtx)
	if errors.Is(err, context.DeadlineExceeded) {
		s.log.Warn("shutdown deadline reached; closing remaining connections")
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
