package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/workers"
)

// endpointUnmatched is the kvgate_requests_total endpoint label of every request no route
// matched (one label: client-chosen paths never become series).
const endpointUnmatched = "unmatched"

// passthroughRoutes are vLLM's endpoints that need no KV-aware routing: they are sent,
// unchanged, to the least loaded routable worker (vllm/entrypoints/openai/api_server.py and
// the pooling, score, rerank, tokenize and speech-to-text routers).
var passthroughRoutes = []struct{ method, path string }{
	{http.MethodGet, "/version"},
	{http.MethodPost, "/v1/embeddings"},
	{http.MethodPost, "/tokenize"},
	{http.MethodPost, "/detokenize"},
	{http.MethodPost, "/pooling"},
	{http.MethodPost, "/classify"},
	{http.MethodPost, "/score"},
	{http.MethodPost, "/v1/score"},
	{http.MethodPost, "/rerank"},
	{http.MethodPost, "/v1/rerank"},
	{http.MethodPost, "/v2/rerank"},
	{http.MethodPost, "/v1/audio/transcriptions"},
	{http.MethodPost, "/v1/audio/translations"},
}

func (s *Server) addPassthrough(e *gin.Engine) {
	for _, r := range passthroughRoutes {
		e.Handle(r.method, r.path, s.handlePassthrough)
	}
}

// handlePassthrough forwards a request as it came (method, path, query, body, headers) to the
// routable worker with the fewest requests in flight, trying another one when a worker fails
// before answering, and relays the worker's status and body.
func (s *Server) handlePassthrough(c *gin.Context) {
	label := c.FullPath() // the route template: bounded
	start := time.Now()
	code := 0
	s.m.inFlight.WithLabelValues(label).Inc()
	defer func() {
		s.m.inFlight.WithLabelValues(label).Dec()
		s.m.requests.WithLabelValues(label, strconv.Itoa(code)).Inc()
		s.m.duration.WithLabelValues(label).Observe(time.Since(start).Seconds())
	}()
	body, e := s.readBody(c)
	if e != nil {
		code = e.Status
		writeError(c, e)
		return
	}
	p, model, e := s.passthroughPool(c.ContentType(), body)
	if e != nil {
		code = e.Status
		writeError(c, e)
		return
	}
	if c.Request.Method == http.MethodPost {
		// Work for a worker: one request, and a quarter of the body's bytes as its tokens (the
		// gateway does not tokenize these bodies).
		release, e := s.admitLimits(c, tenantOf(c), len(body)/4)
		if e != nil {
			code = e.Status
			writeError(c, e)
			return
		}
		defer release()
	}
	tried := map[string]bool{}
	var last *apiError
	for attempt := 0; attempt <= s.cfg.Proxy.MaxRetries; attempt++ {
		w, rank := leastLoaded(p, model, tried)
		if w == nil {
			break
		}
		tried[w.URL()] = true
		var ok bool
		code, ok, last = s.forwardAs(c, w, rank, body)
		if ok {
			return
		}
		if c.Request.Context().Err() != nil {
			code = codeClientGone
			return
		}
	}
	if last == nil {
		last = &apiError{Status: http.StatusServiceUnavailable,
			Message: fmt.Sprintf("no healthy worker: 0 of %d workers of model %s are routable", len(p.Registry.Workers()), p.Model)}
	}
	code = last.Status
	writeError(c, last)
}

// leastLoaded is the routable target of an untried worker of p with the fewest requests in
// flight.
func leastLoaded(p *pool, model string, tried map[string]bool) (*workers.Worker, int) {
	var best *router.Candidate
	for _, cand := range candidates(p, model, tried) {
		if best == nil || cand.InFlight < best.InFlight {
			cand := cand
			best = &cand
		}
	}
	if best == nil {
		return nil, 0
	}
	w := p.Registry.Get(best.Worker)
	if w == nil { // it left the fleet since the candidate list: pick among the others
		tried[best.Worker] = true
		return leastLoaded(p, model, tried)
	}
	return w, best.DPRank
}

// forwardAs sends one attempt; ok is false when nothing reached the client and another worker
// may be tried (the error says why).
func (s *Server) forwardAs(c *gin.Context, w *workers.Worker, rank int, body []byte) (int, bool, *apiError) {
	if w == nil {
		return 0, false, &apiError{Status: http.StatusInternalServerError, Message: "routable worker vanished"}
	}
	release := w.Acquire(rank)
	defer release()
	ctx, cancel := context.WithCancel(c.Request.Context())
	defer cancel()
	up, err := http.NewRequestWithContext(ctx, c.Request.Method, w.Endpoint(c.Request.URL.Path, c.Request.URL.RawQuery), bytes.NewReader(body))
	if err != nil {
		return 0, false, &apiError{Status: http.StatusInternalServerError, Message: "building upstream request: " + err.Error()}
	}
	copyRequestHeaders(up.Header, c.Request.Header)
	s.dropClientKey(up.Header)
	w.Authorize(up.Header)
	up.ContentLength = int64(len(body))
	resp, err := w.Client().Do(up)
	if err != nil {
		w.ReportFailure(err)
		s.m.upstreamErrors.WithLabelValues(w.URL(), errConnect).Inc()
		s.m.workerRequests.WithLabelValues(w.URL(), "0").Inc()
		return 0, false, &apiError{Status: http.StatusBadGateway, Message: fmt.Sprintf("worker %s failed: %v", w.URL(), err)}
	}
	defer resp.Body.Close()
	s.m.workerRequests.WithLabelValues(w.URL(), strconv.Itoa(resp.StatusCode)).Inc()
	copyResponseHeaders(c.Writer.Header(), resp.Header, true)
	c.Status(resp.StatusCode)
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := c.Writer.Write(buf[:n]); werr != nil {
				return codeClientGone, true, nil
			}
			c.Writer.Flush() // streamed transcriptions arrive as SSE
		}
		if errors.Is(rerr, io.EOF) {
			return resp.StatusCode, true, nil
		}
		if rerr != nil {
			if !c.Writer.Written() {
				return 0, false, &apiError{Status: http.StatusBadGateway, Message: fmt.Sprintf("worker %s broke off: %v", w.URL(), rerr)}
			}
			panic(http.ErrAbortHandler) // a truncated body must not look complete
		}
	}
}

// noRoute answers an unmatched client request with an OpenAI-shaped 404 (405 for a known
// path with another method), counted under endpoint "unmatched".
func (s *Server) noRoute(status int) gin.HandlerFunc {
	return func(c *gin.Context) {
		s.m.requests.WithLabelValues(endpointUnmatched, strconv.Itoa(status)).Inc()
		msg := fmt.Sprintf("no route %s %s", c.Request.Method, c.Request.URL.Path)
		if status == http.StatusMethodNotAllowed {
			msg = fmt.Sprintf("method %s not allowed on %s", c.Request.Method, c.Request.URL.Path)
		}
		writeError(c, &apiError{Status: status, Message: msg})
	}
}
