package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/router"
)

// codeClientGone is the status recorded (never sent) when the client went away (nginx's 499).
const codeClientGone = 499

// handleCompletion serves POST /v1/chat/completions and /v1/completions: read and validate
// the body, route, and proxy it byte-for-byte to the chosen worker.
func (s *Server) handleCompletion(endpoint string) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		s.m.inFlight.WithLabelValues(endpoint).Inc()
		code := 0
		defer func() {
			s.m.inFlight.WithLabelValues(endpoint).Dec()
			s.m.requests.WithLabelValues(endpoint, strconv.Itoa(code)).Inc()
			s.m.duration.WithLabelValues(endpoint).Observe(time.Since(start).Seconds())
		}()
		fail := func(e *apiError) {
			code = e.Status
			writeError(c, e)
		}

		body, e := s.readBody(c)
		if e != nil {
			fail(e)
			return
		}
		tn := tenantOf(c)
		if e := s.precheckLimits(c, tn, len(body)); e != nil {
			fail(e)
			return
		}
		p, in, rreq, e := s.prepare(c.Request.Context(), endpoint, body, c.Request.Header, tn)
		if e != nil {
			fail(e)
			return
		}
		// The key's limits come before the routing side and any queue: a refused request
		// occupies neither.
		release, e := s.admitLimits(c, tn, tokenEstimate(in, rreq.PromptTokens))
		if e != nil {
			fail(e)
			return
		}
		defer release()
		// The routing side hears the request before its first attempt; end runs after its
		// last (an end-of-session request releases its session then).
		end := p.Router.Start(rreq)
		defer end()
		code = s.proxy(c, p, in, rreq, start, false)
	}
}

// prepare parses and validates a body, picks the pool serving its model and builds the routing
// request (session ids, and the pool enricher's prompt tokens and block hashes when it has
// one), holding tokenization slots (limits.max_concurrent_tokenizations) while it does. tn is
// the client key's tenant (nil without client keys): its cache salt goes into the hashes and
// the forwarded body, its name onto the request's Responses pins.
func (s *Server) prepare(ctx context.Context, endpoint string, body []byte, h http.Header, tn *tenant) (*pool, *apireq.Request, *router.Request, *apiError) {
	if endpoint == pathResponses {
		// Items referenced by id come from the stored responses holding them (itemrefs.go),
		// the key's own only: the worker gets, and the gateway renders, the whole conversation.
		var e *apiError
		if body, e = s.resolveItemReferences(ctx, body, h, tn.owner()); e != nil {
			return nil, nil, nil, e
		}
	}
	// Parsing and tokenizing cost CPU and a few times the body in memory: bounded together.
	release, e := s.tokenize.acquire(ctx, len(body))
	if e != nil {
		return nil, nil, nil, e
	}
	defer release()
	in, e := parseRequest(s.requests, endpoint, body)
	if e != nil {
		return nil, nil, nil, e
	}
	p, e := s.resolvePool(in.Model)
	if e != nil {
		return nil, nil, nil, e
	}
	// Session identity comes from the same parse of the body.
	if e := s.requests.Identify(in, h); e != nil {
		return nil, nil, nil, fromRequestError(e)
	}
	if e := tn.isolate(in); e != nil {
		return nil, nil, nil, e
	}
	id := in.Session
	model := in.Model
	if model == "" {
		model = p.Model
	}
	rreq := &router.Request{
		Model:           model,
		BlockSize:       p.BlockSize,
		SessionID:       id.SessionID,
		ParentSessionID: id.ParentID,
		EndsSession:     id.Final,
		PinResponseID:   in.PreviousResponseID,
		Owner:           tn.owner(),
		Stream:          in.Stream,
		Header:          h,
	}
	if p.Enricher != nil {
		in.MaxModelLen = s.maxModelLen(p, model)
		if err := p.Enricher.Enrich(ctx, in, rreq); err != nil {
			ae, isAPI := asRequestError(err)
			if !isAPI {
				isAPI = errors.As(err, &ae)
			}
			if isAPI {
				// The request itself is wrong (e.g. the chat template rejects it): the worker
				// would answer 400 too, so answer now with the same message.
				return nil, nil, nil, ae
			}
			s.log.Warn("request enrichment failed; routing without it", "endpoint", endpoint, "model", p.Model, "err", err)
		}
	}
	accessFrom(ctx).noteRequest(model, id.SessionID, rreq.PromptTokens)
	return p, in, rreq, nil
}

// decide runs the routing steps of one request without proxying it — parse, validate,
// enrich, Pick among the routable targets — and returns the decision record and the routing
// request it built; POST /debug/route answers with it. Nothing is accounted and no session
// state changes (Pick only reads), though policies with state (round robin) advance. A request
// error is returned as an error whose message is the client-facing one.
func (s *Server) decide(ctx context.Context, endpoint string, body []byte, h http.Header, tn *tenant) (router.Decision, *router.Request, error) {
	p, _, rreq, e := s.prepare(ctx, endpoint, body, h, tn)
	if e != nil {
		return router.Decision{}, nil, e
	}
	cands := candidates(p, rreq.Model, nil)
	if len(cands) == 0 {
		return router.Decision{}, nil, &apiError{Status: http.StatusServiceUnavailable, Message: "no healthy worker"}
	}
	d, err := p.Router.Pick(ctx, rreq, cands)
	if err != nil {
		return router.Decision{}, nil, fmt.Errorf("routing failed: %w", err)
	}
	return d, rreq, nil
}

// readBody reads the whole body, bounded by proxy.max_body_bytes (413 beyond) and by
// limits.body_read_timeout (408 beyond).
func (s *Server) readBody(c *gin.Context) ([]byte, *apiError) {
	limit := int64(s.cfg.Proxy.MaxBodyBytes)
	tooLarge := &apiError{
		Status:  http.StatusRequestEntityTooLarge,
		Message: fmt.Sprintf("request body exceeds the gateway limit of %d bytes (proxy.max_body_bytes)", limit),
	}
	if c.Request.ContentLength > limit {
		return nil, tooLarge
	}
	lift := s.bodyDeadline(c)
	r := http.MaxBytesReader(c.Writer, c.Request.Body, limit)
	var (
		body []byte
		err  error
	)
	if n := c.Request.ContentLength; n > 0 {
		// net/http holds the body to its Content-Length: read it into one exact buffer rather
		// than growing one by doubling (io.ReadAll would allocate about twice the body).
		body = make([]byte, n)
		_, err = io.ReadFull(r, body)
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("body shorter than its Content-Length %d: %w", n, err)
		}
	} else {
		body, err = io.ReadAll(r)
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge
		}
		if e := s.bodyTimeoutError(err); e != nil {
			c.Header("Connection", "close") // the rest of the body is still on its way
			return nil, e
		}
		return nil, badRequest("", "reading request body: "+err.Error())
	}
	lift()
	return body, nil
}

// hopHeaders are connection-scoped and never forwarded (RFC 9110 §7.6.1), plus headers the
// gateway sets itself.
var hopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func isHopHeader(name string, conn string) bool {
	for _, h := range hopHeaders {
		if strings.EqualFold(h, name) {
			return true
		}
	}
	for _, f := range strings.Split(conn, ",") {
		if f = strings.TrimSpace(f); f != "" && strings.EqualFold(f, name) {
			return true
		}
	}
	return false
}

func copyRequestHeaders(dst, src http.Header) {
	conn := src.Get("Connection")
	for k, vs := range src {
		switch {
		case isHopHeader(k, conn), k == "Content-Length", k == "Host",
			// The worker must answer uncompressed so SSE framing stays visible.
			k == "Accept-Encoding":
			continue
		}
		dst[k] = slices.Clone(vs)
	}
}

func copyResponseHeaders(dst, src http.Header, stream bool) {
	conn := src.Get("Connection")
	for k, vs := range src {
		if isHopHeader(k, conn) || (stream && k == "Content-Length") {
			continue
		}
		dst[k] = slices.Clone(vs)
	}
}
