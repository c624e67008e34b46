package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/workers"
)

// errIdleTimeout is the cancel cause of an upstream request that went quiet for too long.
var errIdleTimeout = errors.New("no bytes from the worker within proxy.stream_idle_timeout")

// errFirstByteDeadline is the cancel cause of an attempt whose worker sent no body byte within
// the deadline derived from its predicted TTFT (firstByteDeadline).
var errFirstByteDeadline = errors.New("no first byte within the deadline derived from the predicted TTFT (proxy.first_byte_multiple, first_byte_floor)")

// errFirstTokenLate is the cancel cause of an attempt of a request that waited at the gateway
// and had no first token by its arrival plus flow_control.queue_timeout (flowTicket.firstTokenDue).
var errFirstTokenLate = errors.New("no first token within flow_control.queue_timeout of the request's arrival")

// outcome of one attempt on one worker.
type outcome int

const (
	served     outcome = iota // a response (success or the worker's own error) reached the client
	failed                    // nothing reached the client; another worker may be tried
	clientGone                // the client left; stop
	// late: a request that waited at the gateway had no first token by its deadline; nothing
	// reached the client, the upstream request is cancelled and the gateway answers 503.
	late
)

// proxy routes the request within pool p and relays the response, trying another worker when
// one fails before its first byte (at most proxy.max_retries times). It returns the status for
// metrics. With orNext, a request pinned to a response p's router does not know is left
// unanswered and proxy returns errPinElsewhere (another pool may hold the pin).
func (s *Server) proxy(c *gin.Context, p *pool, in *apireq.Request, rreq *router.Request, start time.Time, orNext bool) int {
	ctx := c.Request.Context()
	ticket, err := s.admitFlow(c, p, in, rreq, start)
	if err != nil {
		s.refundLimits(c) // answered by the queue: no worker saw it
	}
	if errors.Is(err, errFlowClientGone) {
		s.m.disconnects.WithLabelValues(string(in.Endpoint)).Inc()
		return codeClientGone
	}
	var ae *apiError
	if errors.As(err, &ae) {
		writeError(c, ae)
		return ae.Status
	}
	defer ticket.routed()
	if e := s.forwardPriority(c, in, ticket); e != nil {
		writeError(c, e)
		return e.Status
	}
	accessFrom(ctx).noteFlow(ticket)
	tried := map[string]bool{}
	maxAttempts := 1 + s.cfg.Proxy.MaxRetries
	var last *apiError
	for attempt := 0; attempt < maxAttempts; attempt++ {
		cands := candidates(p, rreq.Model, tried)
		if attempt == 0 && ticket.isBound() {
			// Late binding: the queue gave this request the target that freed.
			cands = onlyTarget(cands, ticket.target)
		} else if attempt == 0 && ticket != nil && ticket.allowed != nil {
			// Let through at once, to the candidates that admit it and beat waiting for the
			// worker holding its prefix (flowcontrol.Queue.Place).
			cands = onlyTargets(cands, ticket.allowed)
		}
		if len(cands) == 0 && last != nil && last.engineRestart {
			// Every worker was tried and the last one's engine was restarting (as all of a
			// fleet's may at once after a deploy): an engine that restarts in place is back
			// within moments, so try them again after a pause.
			if !sleepCtx(ctx, time.Duration(attempt)*restartRetryPause) {
				break
			}
			clear(tried)
			cands = candidates(p, rreq.Model, tried)
		}
		if len(cands) == 0 {
			if orNext && attempt == 0 {
				return errPinElsewhere
			}
			break
		}
		if attempt > 0 {
			s.m.retries.WithLabelValues(string(in.Endpoint)).Inc()
		}
		d, life, err := p.Router.Route(ctx, rreq, cands)
		ticket.routed()
		if errors.Is(err, router.ErrUnknownResponse) && orNext && attempt == 0 {
			return errPinElsewhere
		}
		if errors.Is(err, router.ErrUnknownResponse) {
			// A hard pin: only the worker storing the response can serve it. A retry after it
			// failed keeps that failure; otherwise it is vLLM's 404 for an unknown id.
			if last == nil {
				last = responseNotFound(rreq.PinResponseID)
			}
			s.log.Info("response pin not servable", "err", err)
			break
		}
		if err != nil {
			last = &apiError{Status: http.StatusInternalServerError, Message: "routing failed: " + err.Error()}
			break
		}
		w := p.Registry.Get(d.Chosen.Worker)
		if w == nil {
			// The worker left the fleet (discovery removed it) between the candidate list and
			// the decision: nothing was sent, so another worker may take the request.
			last = &apiError{Status: http.StatusServiceUnavailable, Message: fmt.Sprintf("worker %q left the fleet", d.Chosen.Worker)}
			life.Failed(last)
			tried[d.Chosen.Worker] = true
			attempt-- // not an attempt: tried only grows, so this ends when no candidate is left
			continue
		}
		tried[w.URL()] = true
		ticket.placed(d.Chosen.Target, rreq)
		scope := retryScope{again: attempt+1 < maxAttempts}
		scope.other = scope.again && len(candidates(p, rreq.Model, tried)) > 0
		res, code, e := s.attempt(c, &call{in: in, d: d, life: life, w: w, start: start, scope: scope, flow: ticket})
		switch res {
		case served:
			return code
		case clientGone:
			s.m.disconnects.WithLabelValues(string(in.Endpoint)).Inc()
			return codeClientGone
		case late:
			writeError(c, e) // no retry: any other worker would be later still
			return e.Status
		}
		last = e
		if s.cutCtx.Err() != nil {
			break // the shutdown deadline cut it: no other worker either
		}
		s.log.Warn("worker failed before the first byte", "worker", w.URL(), "attempt", attempt+1, "err", e.Message)
	}
	if ctx.Err() != nil {
		s.m.disconnects.WithLabelValues(string(in.Endpoint)).Inc()
		return codeClientGone
	}
	if last == nil {
		last = &apiError{
			Status:  http.StatusServiceUnavailable,
			Message: fmt.Sprintf("no healthy worker: 0 of %d workers of model %s are routable", len(p.Registry.Workers()), p.Model),
		}
	}
	writeError(c, last)
	return last.Status
}

// firstByteDeadline is how long an attempt may wait for the worker's first body byte: the
// predicted TTFT (for a non-stream request, plus max_tokens × the predicted inter-token time,
// since its body comes after the generation) times proxy.first_byte_multiple, plus
// proxy.first_byte_floor. None (false) when the multiple is 0, the policy predicts no time, or
// a non-stream request sets no max_tokens: then only the proxy timeouts bound the wait.
func (s *Server) firstByteDeadline(a *call) (time.Duration, bool) {
	p := s.cfg.Proxy
	if p.FirstByteMultiple <= 0 {
		return 0, false
	}
	ttft, itl, ok := a.life.Predicted()
	if !ok {
		return 0, false
	}
	ms := ttft
	if !a.in.Stream {
		if a.in.MaxTokens <= 0 {
			return 0, false
		}
		ms += float64(a.in.MaxTokens) * itl
	}
	return time.Duration(p.FirstByteMultiple*ms*float64(time.Millisecond)) + p.FirstByteFloor.D(), true
}

// missedFirstByte counts a first-byte deadline w missed (and ejects it after
// proxy.first_byte_eject_after in a row) and returns the attempt's error.
func (s *Server) missedFirstByte(w *workers.Worker) *apiError {
	s.m.upstreamErrors.WithLabelValues(w.URL(), errFirstByte).Inc()
	if w.ReportDeadlineMiss(errFirstByteDeadline.Error(), s.cfg.Proxy.FirstByteEjectAfter) {
		s.log.Warn("worker ejected: it missed its first-byte deadline repeatedly while its /health passed",
			"worker", w.URL(), "misses", s.cfg.Proxy.FirstByteEjectAfter)
	}
	return &apiError{Status: http.StatusGatewayTimeout, Message: fmt.Sprintf("worker %s: %v", w.URL(), errFirstByteDeadline)}
}

// errPinElsewhere is proxy's result when, asked to, it left a pinned request unanswered because
// the pool does not know the response (see proxy's orNext).
const errPinElsewhere = -1

// candidates lists routable targets of p's workers not yet tried for this request. A request
// for an adapter (a model other than the pool's names) goes only to workers that list it: an
// adapter loaded on some workers at runtime is unknown to the others.
func candidates(p *pool, model string, tried map[string]bool) []router.Candidate {
	adapter := model != "" && !slices.Contains(p.names, model)
	var out []router.Candidate
	for _, t := range p.Registry.Routable() {
		if tried[t.Worker] {
			continue
		}
		if adapter {
			if w := p.Registry.Get(t.Worker); w == nil || !slices.Contains(w.Models(), model) {
				continue
			}
		}
		out = append(out, router.Candidate{Target: t.Target, InFlight: t.InFlight})
	}
	return out
}

// retryScope says where a failed attempt may still go.
type retryScope struct {
	other bool // an untried worker is routable and the attempt budget allows it
	again bool // the attempt budget allows another try, even of a worker already tried
}

// restartRetryPause is the pause per attempt before a worker whose engine was restarting is
// tried again.
const restartRetryPause = 250 * time.Millisecond

// sleepCtx waits d or until ctx ends; it reports whether the wait completed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func retryableStatus(code int) bool {
	return code == http.StatusBadGateway || code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout
}

// call is one attempt of a request on one worker: what send and the relays need of it.
type call struct {
	in     *apireq.Request
	d      router.Decision
	life   router.Lifecycle // the routing side's record of this attempt
	w      *workers.Worker
	start  time.Time // when the client request arrived (time to first byte)
	scope  retryScope
	cancel context.CancelCauseFunc // cancels the upstream request (idle timeout)
	uc     *usageCapture           // nil: the response carries no usage worth reading
	ids    *responseIDs            // nil: the response's id is not pinned
	flow   *flowTicket             // nil: not through flow control
}

// attempt sends the request to one worker. Headers are committed to the client only once the
// worker's first body byte arrived, so a worker that dies before that can be replaced. The
// attempt's Lifecycle hears Done or Failed exactly once, even if the relay panics (an aborted
// client connection).
func (s *Server) attempt(c *gin.Context, a *call) (res outcome, code int, e *apiError) {
	clientCtx := c.Request.Context()
	ctx, cancel := context.WithCancelCause(clientCtx)
	defer cancel(nil)
	defer s.watchCut(cancel)()

	release := a.w.Acquire(a.d.Chosen.DPRank)
	defer release()
	defer func() {
		if (res == failed || res == late) && e != nil { // late: nothing of the worker's reached the client
			a.life.Failed(e)
			return
		}
		a.life.Done()
	}()
	a.cancel, a.uc = cancel, &usageCapture{}
	if a.in.Endpoint == apireq.Responses && a.in.Store {
		a.ids = &responseIDs{found: a.life.Produced, items: s.items.put}
	}
	res, code, e = s.send(ctx, c, a)
	if res == served && code == http.StatusOK {
		if u, ok := a.uc.usage(); ok {
			a.life.UsageSeen(u)
		}
		s.correctLimits(c, a.uc)
		a.flow.correct(a.uc)
	}
	return res, code, e
}

// send forwards the request and relays the response; see attempt.
func (s *Server) send(ctx context.Context, c *gin.Context, a *call) (outcome, int, *apiError) {
	in, w, d, cancel := a.in, a.w, a.d, a.cancel
	clientCtx := c.Request.Context()
	method, path := upstreamTarget(c, in)
	up, err := http.NewRequestWithContext(ctx, method, w.Endpoint(path, c.Request.URL.RawQuery), bytes.NewReader(in.Body))
	if err != nil {
		return failed, 0, &apiError{Status: http.StatusInternalServerError, Message: "building upstream request: " + err.Error()}
	}
	copyRequestHeaders(up.Header, c.Request.Header)
	s.dropClientKey(up.Header)
	w.Authorize(up.Header) // the worker's key replaces the client's; without one it passes through
	// The session id goes to the worker in the parser's forward header (X-Session-ID: vLLM reads
	// it for the session_id of its KV events).
	s.requests.Forward(up.Header, in.Session)
	if ip, _, err := net.SplitHostPort(c.Request.RemoteAddr); err == nil {
		if prior := c.Request.Header.Get("X-Forwarded-For"); prior != "" {
			ip = prior + ", " + ip
		}
		up.Header.Set("X-Forwarded-For", ip)
	}
	up.ContentLength = int64(len(in.Body))
	a.life.Sent()

	// A stream's idle timer starts when the request is sent: a worker that stalls before its
	// headers is as silent as one that stalls mid-stream, and nothing reached the client yet,
	// so another worker can be tried. A non-stream reply comes only when generation ends, so
	// its wait for headers is bounded by proxy.response_header_timeout instead.
	idle := s.cfg.Proxy.StreamIdleTimeout.D()
	var idleTimer *time.Timer
	if idle > 0 && in.Stream {
		idleTimer = time.AfterFunc(idle, func() { cancel(errIdleTimeout) })
		defer idleTimer.Stop()
	}
	// The worker's own prediction bounds the wait for its first byte: a worker that stalls
	// with /health passing is replaced in about the time it should have taken, not minutes.
	var firstByte *time.Timer
	if dl, ok := s.firstByteDeadline(a); ok {
		firstByte = time.AfterFunc(dl, func() { cancel(errFirstByteDeadline) })
		defer firstByte.Stop()
	}
	// A request that waited at the gateway was promised its first token by its arrival plus
	// queue_timeout; the time model's prediction at dispatch is not a promise, so the worker
	// is held to it here: past it the upstream request is cancelled (vLLM aborts a request
	// whose client disconnected) and the client answered 503. The first byte stops the timer
	// (a Responses stream's first output: its opening events are held until then), before any
	// status reached the client (headers are committed only after it), so the answer is a
	// plain error response in the route's shape, never a broken stream.
	var due *time.Timer
	if at, ok := a.flow.firstTokenDue(in.Stream); ok {
		due = time.AfterFunc(time.Until(at), func() { cancel(errFirstTokenLate) })
		defer due.Stop()
	}
	resp, err := w.Client().Do(up)
	if err != nil {
		if clientCtx.Err() != nil {
			return clientGone, 0, nil
		}
		if context.Cause(ctx) == errFirstTokenLate {
			return late, 0, s.firstTokenLate(clientCtx, a.flow)
		}
		if cutByShutdown(ctx) {
			return failed, 0, shutdownCutError()
		}
		if context.Cause(ctx) == errFirstByteDeadline {
			return failed, 0, s.missedFirstByte(w)
		}
		if context.Cause(ctx) == errIdleTimeout {
			err = fmt.Errorf("no response headers within proxy.stream_idle_timeout %s: %w", idle, errIdleTimeout)
		}
		w.ReportFailure(err)
		s.m.upstreamErrors.WithLabelValues(w.URL(), errConnect).Inc()
		s.m.workerRequests.WithLabelValues(w.URL(), "0").Inc()
		return failed, 0, &apiError{Status: http.StatusBadGateway, Message: fmt.Sprintf("worker %s failed: %v", w.URL(), err)}
	}
	defer resp.Body.Close()
	s.m.workerRequests.WithLabelValues(w.URL(), strconv.Itoa(resp.StatusCode)).Inc()
	if retryableStatus(resp.StatusCode) && a.scope.other {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		s.m.upstreamErrors.WithLabelValues(w.URL(), errStatus).Inc()
		return failed, 0, &apiError{Status: resp.StatusCode, Message: fmt.Sprintf("worker %s answered %d", w.URL(), resp.StatusCode)}
	}

	body := io.Reader(resp.Body)
	if idle > 0 {
		if idleTimer == nil {
			idleTimer = time.AfterFunc(idle, func() { cancel(errIdleTimeout) })
			defer idleTimer.Stop()
		} else {
			idleTimer.Reset(idle)
		}
		body = &idleReader{r: resp.Body, d: idle, timer: idleTimer}
	}
	buf := make([]byte, 32<<10)
	n, rerr := readSome(body, buf)
	if n == 0 && rerr != nil {
		switch {
		case clientCtx.Err() != nil:
			return clientGone, 0, nil
		case cutByShutdown(ctx):
			return failed, 0, shutdownCutError()
		case context.Cause(ctx) == errFirstTokenLate:
			return late, 0, s.firstTokenLate(clientCtx, a.flow)
		case errors.Is(rerr, io.EOF) && resp.StatusCode == http.StatusInternalServerError && a.scope.again:
			// vLLM answers the requests in flight when its engine dies with a bare 500 and no
			// body (the EngineDeadError and EngineGenerateError handlers of
			// vllm/entrypoints/launcher.py); the simulator does the same on its restart fault.
			// The request never ran to completion and nothing reached the client: retry it.
			// A 500 with an error body is the worker's own answer and is passed through.
			s.m.upstreamErrors.WithLabelValues(w.URL(), errStatus).Inc()
			return failed, 0, &apiError{Status: http.StatusBadGateway, engineRestart: true,
				Message: fmt.Sprintf("worker %s failed the request before its first byte (500 without a body: engine died or restarted)", w.URL())}
		case errors.Is(rerr, io.EOF) && resp.StatusCode != http.StatusOK:
			// An empty error body is still the worker's answer: pass the status through.
		case context.Cause(ctx) == errFirstByteDeadline:
			return failed, 0, s.missedFirstByte(w)
		default:
			cause := rerr
			if context.Cause(ctx) == errIdleTimeout {
				cause = errIdleTimeout
			}
			w.ReportFailure(cause)
			s.m.upstreamErrors.WithLabelValues(w.URL(), errBeforeFirstByte).Inc()
			return failed, 0, &apiError{Status: http.StatusBadGateway, Message: fmt.Sprintf("worker %s closed the response before its first byte: %v", w.URL(), cause)}
		}
	}
	if firstByte != nil && !firstByte.Stop() && context.Cause(ctx) == errFirstByteDeadline {
		return failed, 0, s.missedFirstByte(w)
	}
	mediatype, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	stream := mediatype == "text/event-stream"
	responsesStream := stream && resp.StatusCode == http.StatusOK && string(in.Endpoint) == pathResponses
	if due != nil && responsesStream {
		// A Responses stream opens before the prefill (isResponsesToken): its opening events
		// are held until its first output, so the deadline can still be kept with a plain 503.
		buf, n, rerr = holdResponsesOpening(body, buf, n, rerr)
		if clientCtx.Err() != nil {
			return clientGone, 0, nil
		}
		if context.Cause(ctx) == errFirstTokenLate {
			return late, 0, s.firstTokenLate(clientCtx, a.flow)
		}
	}
	if due != nil && !due.Stop() && context.Cause(ctx) == errFirstTokenLate {
		return late, 0, s.firstTokenLate(clientCtx, a.flow) // fired with the first byte: the rest is cut
	}
	w.ReportSuccess()

	// An Anthropic stream opens with message_start, a Responses stream with response.created
	// and response.in_progress, before any token: their first token is the first
	// content_block_delta, or the first Responses delta (relaySSE reports it). Anything else:
	// the first byte.
	access := accessFrom(c.Request.Context())
	access.noteRoute(w.URL(), d)
	firstToken := func() {
		access.noteFirstToken(time.Since(a.start))
		a.life.FirstToken()
	}
	if !(responsesStream || stream && resp.StatusCode == http.StatusOK && anthropicRoute(c)) {
		firstToken()
		firstToken = nil
	}
	h := c.Writer.Header()
	copyResponseHeaders(h, resp.Header, stream)
	if s.cfg.Proxy.ExposeRoutingHeaders {
		h.Set("X-Kvgate-Worker", w.URL())
		h.Set(router.HeaderCachedBlocks, router.CachedBlocksHeader(d))
	}
	if !stream && resp.StatusCode >= 400 && anthropicRoute(c) && rerr == nil {
		// Read the rest of a worker's error (bounded) so it can be given Anthropic's shape.
		rest, err := io.ReadAll(io.LimitReader(body, maxUsageBody))
		buf = append(buf[:n:n], rest...)
		n, rerr = len(buf), err
		if err == nil {
			rerr = io.EOF
			if len(rest) == maxUsageBody {
				rerr = nil // larger than any error body: relayed as it is
			}
		}
	}
	if !stream && resp.StatusCode >= 400 && anthropicRoute(c) && errors.Is(rerr, io.EOF) {
		if out, ok := anthropicWorkerError(resp.StatusCode, buf[:n]); ok {
			buf, n = out, len(out)
			h.Del("Content-Length")
			h.Set("Content-Type", "application/json")
		}
	}
	if stream {
		h.Set("X-Accel-Buffering", "no")
		if h.Get("Cache-Control") == "" {
			h.Set("Cache-Control", "no-cache")
		}
	}
	c.Status(resp.StatusCode)
	s.m.ttfb.WithLabelValues(string(in.Endpoint)).Observe(time.Since(a.start).Seconds())

	uc := a.uc
	ids := a.ids
	if resp.StatusCode != http.StatusOK {
		uc, ids = nil, nil // error bodies carry no usage and name no stored response
	}
	if stream && resp.StatusCode == http.StatusOK {
		return s.relaySSE(ctx, c, w, string(in.Endpoint), buf[:n], body, rerr, uc, firstToken, a.life.Chunk, ids), resp.StatusCode, nil
	}
	first := buf[:n]
	if ids != nil && errors.Is(rerr, io.EOF) {
		ids.fromBody(first) // the whole body came in the first read
	}
	if ids != nil && rerr == nil {
		// Pin the stored response before the client has all of it (a follow-up may come at
		// once): read the body whole, bounded; a larger one is relayed as it comes.
		src := body
		rest, err := io.ReadAll(io.LimitReader(src, maxUsageBody))
		first = append(append([]byte(nil), first...), rest...)
		body, rerr = errReader{io.EOF}, err
		if err == nil && len(rest) == maxUsageBody {
			body = src
		}
		ids.fromBody(first)
	}
	return s.relayBody(ctx, c, w, first, body, rerr, uc), resp.StatusCode, nil
}

// readSome reads until it gets at least one byte or an error.
func readSome(r io.Reader, buf []byte) (int, error) {
	for {
		n, err := r.Read(buf)
		if n > 0 || err != nil {
			return n, err
		}
	}
}

// maxHeldOpening bounds the bytes of a Responses stream's opening events held back
// (holdResponsesOpening); vLLM's two are a few KiB with the echoed request fields.
const maxHeldOpening = 256 << 10

// holdResponsesOpening reads on after buf[:n] until it holds a complete event with output
// (isResponsesToken), the body ends or fails, or maxHeldOpening bytes are held; it returns the
// grown buffer, its length and the read error. Each complete event is looked at once.
func holdResponsesOpening(body io.Reader, buf []byte, n int, rerr error) ([]byte, int, error) {
	scanned := 0 // buf[:scanned]: complete events without output
	for rerr == nil && n < maxHeldOpening {
		complete, found := firstResponsesOutput(buf[scanned:n])
		if found {
			break
		}
		scanned += complete
		if n == len(buf) {
			buf = append(buf, make([]byte, len(buf))...)
		}
		var m int
		m, rerr = body.Read(buf[n:min(len(buf), maxHeldOpening)])
		n += m
	}
	return buf, n, rerr
}

// firstResponsesOutput frames b's complete events as relaySSE does (lines up to a blank one)
// and reports whether one carries output (isResponsesToken); complete is the length of the
// complete events before it, or of all of them.
func firstResponsesOutput(b []byte) (complete int, found bool) {
	pos := 0
	for line := range bytes.Lines(b) {
		if line[len(line)-1] != '\n' {
			break // a line still arriving
		}
		pos += len(line)
		if isBlankLine(line) {
			if isResponsesToken(b[complete:pos]) {
				return complete, true
			}
			complete = pos
		}
	}
	return complete, false
}

// relayBody copies a non-stream response through. A worker failure mid-body aborts the client
// connection, so the client sees a broken response rather than a silently truncated one.
func (s *Server) relayBody(ctx context.Context, c *gin.Context, w *workers.Worker, first []byte, body io.Reader, firstErr error, uc *usageCapture) outcome {
	if _, err := c.Writer.Write(first); err != nil {
		return clientGone
	}
	uc.body(first)
	if firstErr == nil {
		var dst io.Writer = c.Writer
		if uc != nil {
			dst = io.MultiWriter(c.Writer, uc) // copies what reached the client, bounded
		}
		_, firstErr = io.Copy(dst, body)
	}
	if firstErr == nil || errors.Is(firstErr, io.EOF) {
		return served
	}
	if c.Request.Context().Err() != nil || isWriteError(firstErr) {
		return clientGone
	}
	if cutByShutdown(ctx) {
		s.log.Warn("response cut at the shutdown deadline; aborting client connection", "worker", w.URL())
		panic(http.ErrAbortHandler) // a JSON body cut short has no way to say why
	}
	kind := errMidStream
	if context.Cause(ctx) == errIdleTimeout {
		kind = errIdle
	}
	w.ReportFailure(firstErr)
	s.m.upstreamErrors.WithLabelValues(w.URL(), kind).Inc()
	s.log.Warn("worker failed mid-response; aborting client connection", "worker", w.URL(), "err", firstErr)
	panic(http.ErrAbortHandler)
}

// isWriteError reports whether io.Copy failed writing to the client (not reading upstream).
func isWriteError(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && ne.Op == "write"
}

// maxPendingEvent bounds how much of one SSE event is held back waiting for its end.
const maxPendingEvent = 1 << 20

// relaySSE relays an event stream one complete event at a time, flushing after each, so a
// client never sees half an event. If the worker breaks off (error, EOF before [DONE], idle
// timeout) the stream ends with an OpenAI error event and [DONE].
//
// firstToken, when set, is called once, on the first Anthropic content_block_delta or
// Responses delta (isResponsesToken), or when the stream ends without one; chunk after each
// event that reached the client once the first token was reported (the routing side's
// inter-token sample).
func (s *Server) relaySSE(ctx context.Context, c *gin.Context, w *workers.Worker, endpoint string, first []byte, body io.Reader, firstErr error, uc *usageCapture, firstToken, chunk func(), ids *responseIDs) outcome {
	if firstToken != nil {
		defer func() {
			if firstToken != nil {
				firstToken()
			}
		}()
	}
	src := io.MultiReader(bytes.NewReader(first), body)
	if firstErr != nil {
		src = io.MultiReader(bytes.NewReader(first), errReader{firstErr})
	}
	r := bufio.NewReaderSize(src, 64<<10)
	event := make([]byte, 0, 4096)
	sawDone := false
	anthropic := anthropicRoute(c)
	emit := func() bool {
		if len(event) < 32 && bytes.Contains(event, []byte("data: [DONE]")) {
			sawDone = true
		}
		if anthropic && bytes.HasPrefix(event, []byte("event: message_stop")) {
			sawDone = true // an Anthropic stream ends with message_stop, no [DONE]
		}
		if firstToken != nil && (anthropic && bytes.HasPrefix(event, []byte("event: content_block_delta")) ||
			endpoint == pathResponses && isResponsesToken(event)) {
			firstToken()
			firstToken = nil
		}
		if endpoint == pathResponses && isResponsesEnd(event) {
			sawDone = true // a Responses stream has no [DONE]
		}
		ids.fromEvent(event) // before the client sees it: a follow-up may come at once
		if _, err := c.Writer.Write(event); err != nil {
			return false
		}
		c.Writer.Flush()
		if firstToken == nil {
			chunk()
		}
		uc.event(event) // after the flush: reading usage never delays an event
		event = event[:0]
		return true
	}
	var err error
	for {
		var line []byte
		line, err = r.ReadSlice('\n')
		event = append(event, line...)
		if (len(line) > 0 && isBlankLine(line)) || len(event) > maxPendingEvent {
			if !emit() {
				return clientGone
			}
			if sawDone {
				// The client has the whole response; whatever happens next is not its
				// problem. Drain the terminator so the connection can be reused.
				_, _ = io.Copy(io.Discard, io.LimitReader(r, 4096))
				return served
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			break
		}
	}
	if errors.Is(err, io.EOF) && len(event) > 0 && event[len(event)-1] == '\n' {
		// Last event without its blank line: complete lines, pass them on.
		event = append(event, '\n')
		if !emit() {
			return clientGone
		}
	}
	if errors.Is(err, io.EOF) && sawDone {
		return served
	}
	if c.Request.Context().Err() != nil {
		return clientGone
	}
	if cutByShutdown(ctx) {
		// The worker is not at fault: no failure reported against it.
		s.log.Warn("stream cut at the shutdown deadline", "worker", w.URL(), "endpoint", endpoint)
		if _, werr := c.Writer.Write(shutdownCutEvent(anthropicRoute(c))); werr == nil {
			c.Writer.Flush()
		}
		return served
	}
	kind, msg := errMidStream, fmt.Sprintf("worker %s broke off the stream: %v", w.URL(), err)
	switch {
	case context.Cause(ctx) == errIdleTimeout:
		kind, msg = errIdle, fmt.Sprintf("worker %s sent nothing for %s; stream abandoned", w.URL(), s.cfg.Proxy.StreamIdleTimeout)
	case errors.Is(err, io.EOF):
		end := "[DONE]"
		if anthropic {
			end = "message_stop"
		}
		msg = fmt.Sprintf("worker %s ended the stream before %s", w.URL(), end)
	}
	w.ReportFailure(errors.New(msg))
	s.m.upstreamErrors.WithLabelValues(w.URL(), kind).Inc()
	s.log.Warn("stream failed after it started", "worker", w.URL(), "endpoint", endpoint, "err", msg)
	ev := sseErrorEvent(&apiError{Status: http.StatusBadGateway, Message: msg})
	if anthropicRoute(c) {
		ev = anthropicSSEError(&apiError{Status: http.StatusBadGateway, Message: msg})
	}
	if _, werr := c.Writer.Write(ev); werr == nil {
		c.Writer.Flush()
	}
	return served
}

func isBlankLine(line []byte) bool {
	return len(line) == 1 || (len(line) == 2 && line[0] == '\r')
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// idleReader pushes back its timer (whose function fails the request) each time a Read
// returns data, so the timer fires only after d without any.
type idleReader struct {
	r     io.Reader
	d     time.Duration
	timer *time.Timer
}

func (ir *idleReader) Read(p []byte) (int, error) {
	n, err := ir.r.Read(p)
	if n > 0 {
		ir.timer.Reset(ir.d)
	}
	return n, err
}
