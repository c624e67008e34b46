package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/flowcontrol"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
)

// flowGate is one pool's flow control (flow_control): a request that finds every candidate
// busy (router.Capacity.Busy) waits in the pool's queue (flowcontrol.Queue, the state machine)
// until a target frees; then the queue chooses which waiting request that target takes, and
// the request is routed there (late binding). The gate does the I/O around the queue: the
// waits, their timers and client contexts, the dispatcher goroutine and the metrics.
//
// Dispatching: one goroutine per pool runs while requests wait (none when the queue is
// empty). It wakes on every load change the router reports (a first token, a finished
// request, a fresh scrape), on every new waiting request and every flow_control.poll_interval,
// and hands each free target, one at a time, to the request the queue chooses. A target handed
// to a request is reserved until that request's Route has accounted its load there (the
// ticket's routed), so one freed slot is never given twice.
//
// Locks: mu guards running and reserved only and is never held while calling out; the
// queue's own lock is a leaf (docs/ARCHITECTURE.md, "Lock order").
type flowGate struct {
	cfg  flowcontrol.Config
	q    *flowcontrol.Queue[kvkey.Target]
	p    *pool
	capa router.Capacity
	// ret and fp are cache protection's (flow_control.protect_cache; nil when off): ret
	// the router's working sets, nil when it keeps none (then every footprint within
	// protect_window counts as cached), fp each session's last prompt per target.
	ret  router.Retention
	fp   *flowcontrol.Footprints[kvkey.Target, footMark]
	m    *flowMetrics
	log  *slog.Logger
	kick chan struct{} // buffered 1: wake the dispatcher

	mu       sync.Mutex
	running  bool                 // the dispatcher goroutine runs
	reserved map[kvkey.Target]int // targets handed to a request not yet routed
}

// flowWaiter is a waiting request's side of the queue (flowcontrol.Entry.Value).
type flowWaiter struct {
	done chan flowResult // buffered 1; written once
}

// flowResult is what the dispatcher tells a waiting request.
type flowResult struct {
	target   kvkey.Target
	d        flowcontrol.Dispatch[kvkey.Target]
	noWorker bool // no routable worker is left: answer 503
	evicted  bool // a higher priority took its place in a full queue: answer 429
	late     bool // no worker can give it its first token by its deadline: answer 503
}

// flowTicket is a request the gate let through. A dispatched one names its target and holds
// the target's reservation until routed is called.
type flowTicket struct {
	g      *flowGate
	target kvkey.Target
	bound  bool // dispatched to target (else let through at once: route freely)
	// allowed narrows a request let through at once to the candidates that admit it and
	// beat waiting for its prefix holder (nil: any candidate).
	allowed []kvkey.Target
	choice  string        // direct, or the queue's binding choice (flowcontrol.Choice*)
	waited  time.Duration // at the gateway
	// due is when a dispatched request's first token must have come (flowcontrol.Dispatch.Due:
	// its arrival plus queue_timeout; zero: none to hold it to).
	due time.Time
	// protected names the cache-protection rule that kept the request off a target
	// (flowcontrol.ProtectedBy*), "" when none did.
	protected string
	once      sync.Once
	class     flowClass
	cost      float64
}

// routed releases the reservation once the request's first Route returned (its load is then
// accounted, so Busy sees it). Safe on a nil ticket and more than once.
func (t *flowTicket) routed() {
	if t == nil || !t.bound {
		return
	}
	t.once.Do(func() { t.g.release(t.target) })
}

// correct replaces the service charged to the request's tenant (prompt plus max_tokens,
// weighted) with the worker's reported usage, when the response carried one. Safe on a nil
// ticket.
func (t *flowTicket) correct(uc *usageCapture) {
	if t == nil {
		return
	}
	u, ok := uc.usage()
	total, okTotal := uc.totalTokens()
	if !ok || !okTotal {
		return
	}
	actual := t.g.cfg.InputWeight*float64(u.PromptTokens) + t.g.cfg.OutputWeight*float64(max(total-u.PromptTokens, 0))
	t.g.q.Charge(t.class.tenant, actual-t.cost)
}

// newFlowGate builds p's gate, or returns nil when flow control is off or p's router has no
// Capacity (then nothing ever waits at the gateway).
func newFlowGate(cfg flowcontrol.Config, p *pool, m *flowMetrics, log *slog.Logger) *flowGate {
	capa, ok := p.Router.(router.Capacity)
	if !cfg.Enabled || !ok {
		return nil
	}
	g := &flowGate{cfg: cfg, q: flowcontrol.NewQueue[kvkey.Target](flowcontrol.LimitsOf(cfg), time.Now), p: p,
		capa: capa, m: m, log: log, kick: make(chan struct{}, 1), reserved: map[kvkey.Target]int{}}
	if cfg.ProtectCache {
		g.fp = flowcontrol.NewFootprints[kvkey.Target, footMark](cfg.ProtectWindow.D())
		g.ret, _ = p.Router.(router.Retention)
	}
	capa.OnLoadChange(g.wake)
	return g
}

// wake makes the dispatcher look again (never blocks).
func (g *flowGate) wake() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// Shed reasons (kvgate_flow_shed_total{reason}) and dispatch reasons
// (kvgate_flow_dispatched_total{reason}).
const (
	shedFull       = "queue_full"
	shedTimeout    = "timeout"
	shedClientGone = "client_gone"
	shedNoWorker   = "no_worker"
	shedEvicted    = "evicted"
	// shedDeadline: by the time model no worker could give it its first token within
	// queue_timeout of its arrival any more (flowcontrol.Queue.Late).
	shedDeadline = "deadline"
	// shedFirstTokenLate: dispatched after waiting, but its worker had not sent its first
	// token by queue_timeout after its arrival: the gateway cancelled the upstream request
	// and answered 503 (flowTicket.firstTokenDue, Server.firstTokenLate).
	shedFirstTokenLate = "first_token_late"

	dispatchDirect = "direct" // a candidate had room and nobody waited: not queued
	dispatchFreed  = "freed"  // waited, then a freed target took it
)

// errFlowClientGone is admit's error when the client left while its request waited.
var errFlowClientGone = errors.New("client left while waiting at the gateway")

// Why a request waited at the gateway (kvgate_flow_queued_total{reason}).
const (
	queuedSaturated    = "saturated"     // no candidate admits it (its class's predicted-wait bound, busy thresholds)
	queuedPrefixHolder = "prefix_holder" // one admits it, but waiting for a better-cached one is predicted sooner
	queuedBehind       = "behind"        // others were waiting already: the queue's order decides
)

// admit lets the request through at once when nobody waits and a candidate admits it
// (flowcontrol.Queue.Place: under its class's predicted-wait bound and, priced by the time
// model, no slower than waiting for its prefix holder; the route is then narrowed to such
// candidates), and otherwise queues it until a target takes it (a bound ticket), the queue
// is full (429), a higher priority evicts it (429), flow_control.queue_timeout passed since
// its arrival at start (503 timeout), the time model predicts that no worker can give it its
// first token before then any more (503 deadline), no worker is left (503), or the client
// left (errFlowClientGone). A nil ticket and error: route as without flow control.
func (g *flowGate) admit(ctx context.Context, in *apireq.Request, rreq *router.Request, bytes int, cls flowClass, start time.Time) (*flowTicket, error) {
	if g == nil || rreq.PinResponseID != "" {
		return nil, nil // a pinned request can go to one worker only: nothing to bind late
	}
	cands := candidates(g.p, rreq.Model, nil)
	if len(cands) == 0 {
		return nil, nil // proxy answers 503 (no healthy worker) as without flow control
	}
	cost := g.cfg.InputWeight*float64(rreq.PromptTokens) + g.cfg.OutputWeight*float64(max(in.MaxTokens, 0))
	t := &flowTicket{g: g, class: cls, cost: cost}
	g.q.Arrive(cls.priority, cls.tenant, cost)
	var gain, own map[kvkey.Target]float64
	gains := func() map[kvkey.Target]float64 {
		if gain == nil {
			gain, own = g.gains(ctx, rreq, cands)
		}
		return gain
	}
	fc := flowcontrol.Class{Priority: cls.priority, Tenant: cls.tenant, Named: cls.named}
	reason := queuedBehind
	if g.q.Len() == 0 {
		pl := g.q.Place(fc, g.states(cands), gains)
		if len(pl.Allowed) > 0 {
			g.q.Charge(cls.tenant, cost)
			g.m.dispatched.WithLabelValues(dispatchDirect).Inc()
			if !pl.All {
				t.allowed = pl.Allowed
			}
			t.choice, t.protected = dispatchDirect, pl.Protected
			if pl.Protected != "" {
				g.m.protected.WithLabelValues(pl.Protected).Inc()
			}
			return t, nil
		}
		reason = pl.Reason
	}
	g.m.queued.WithLabelValues(reason).Inc()
	w := &flowWaiter{done: make(chan flowResult, 1)}
	deadline := start.Add(g.cfg.QueueTimeout.D())
	e := &flowcontrol.Entry[kvkey.Target]{Priority: cls.priority, Tenant: cls.tenant, Named: cls.named, Bytes: int64(bytes), Cost: cost,
		Gain: gains(), Prefill: own, Deadline: deadline, Value: w}
	prio := flowcontrol.PriorityLabel(cls.priority)
	evicted, err := g.q.Push(e)
	if err != nil {
		g.m.shed.WithLabelValues(shedFull).Inc()
		accessFrom(ctx).noteShed(shedFull)
		return nil, &apiError{Status: http.StatusTooManyRequests, RetryAfter: g.cfg.RetryAfterSeconds(), Message: err.Error()}
	}
	for _, x := range evicted {
		x.Value.(*flowWaiter).done <- flowResult{evicted: true}
	}
	g.m.depth.WithLabelValues(prio).Inc()
	g.m.bytes.WithLabelValues(prio).Add(float64(bytes))
	left := func() {
		g.m.depth.WithLabelValues(prio).Dec()
		g.m.bytes.WithLabelValues(prio).Sub(float64(bytes))
	}
	g.start()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var r flowResult
	select {
	case r = <-w.done:
	case <-timer.C:
		if g.q.Remove(e) {
			left()
			g.shed(ctx, shedTimeout, e)
			return nil, &apiError{Status: http.StatusServiceUnavailable, RetryAfter: g.cfg.RetryAfterSeconds(),
				Message: fmt.Sprintf("every worker stayed busy for %s, the gateway's longest wait for a first token (flow_control.queue_timeout)", g.cfg.QueueTimeout.D())}
		}
		r = <-w.done // dispatched (or evicted) as the timer fired: take it
	case <-ctx.Done():
		if g.q.Remove(e) {
			left()
			g.shed(ctx, shedClientGone, e)
			return nil, errFlowClientGone
		}
		r = <-w.done
		left()
		if !r.noWorker && !r.evicted && !r.late {
			g.release(r.target)
		}
		g.shed(ctx, shedClientGone, e)
		return nil, errFlowClientGone
	}
	left()
	switch {
	case r.noWorker:
		g.shed(ctx, shedNoWorker, e)
		return nil, &apiError{Status: http.StatusServiceUnavailable, RetryAfter: g.cfg.RetryAfterSeconds(),
			Message: fmt.Sprintf("no healthy worker of model %s is left for the requests waiting at the gateway", g.p.Model)}
	case r.evicted:
		g.shed(ctx, shedEvicted, e)
		return nil, &apiError{Status: http.StatusTooManyRequests, RetryAfter: g.cfg.RetryAfterSeconds(),
			Message: "the gateway's queue is full: a request of a higher priority took this one's place (flow_control.max_requests, max_bytes)"}
	case r.late:
		g.shed(ctx, shedDeadline, e)
		return nil, &apiError{Status: http.StatusServiceUnavailable, RetryAfter: g.cfg.RetryAfterSeconds(),
			Message: fmt.Sprintf("every worker stays too busy to start this request's first token within %s of its arrival (flow_control.queue_timeout)", g.cfg.QueueTimeout.D())}
	}
	waited := time.Since(e.Enqueued())
	g.m.wait.WithLabelValues(dispatchFreed).Observe(waited.Seconds())
	g.m.dispatched.WithLabelValues(dispatchFreed).Inc()
	g.m.binding.WithLabelValues(r.d.Choice).Inc()
	if r.d.Protected != "" {
		g.m.protected.WithLabelValues(r.d.Protected).Inc()
	}
	t.target, t.bound, t.choice, t.waited, t.protected, t.due = r.target, true, r.d.Choice, waited, r.d.Protected, r.d.Due
	return t, nil
}

// gains is the request's cache gain on each candidate by the time model (0 where it has
// none; exactly the candidates are eligible: an adapter's workers), and own its remaining
// prefill there (nil without a time model).
func (g *flowGate) gains(ctx context.Context, rreq *router.Request, cands []router.Candidate) (gain, own map[kvkey.Target]float64) {
	gain, own = g.capa.Gains(ctx, rreq, cands)
	if gain == nil {
		gain = make(map[kvkey.Target]float64, len(cands))
	}
	for _, c := range cands {
		gain[c.Target] += 0
	}
	notCandidate := func(k kvkey.Target, _ float64) bool { return !isCandidate(cands, k) }
	maps.DeleteFunc(gain, notCandidate)
	maps.DeleteFunc(own, notCandidate)
	return gain, own
}

// shed counts a request that left the queue without being dispatched, and notes the reason
// for its access log line.
func (g *flowGate) shed(ctx context.Context, reason string, e *flowcontrol.Entry[kvkey.Target]) {
	accessFrom(ctx).noteShed(reason)
	g.m.shed.WithLabelValues(reason).Inc()
	g.m.wait.WithLabelValues(reason).Observe(time.Since(e.Enqueued()).Seconds())
}

func isCandidate(cands []router.Candidate, t kvkey.Target) bool {
	for _, c := range cands {
		if c.Target == t {
			return true
		}
	}
	return false
}

// states is each candidate's load for the queue's dispatch; a reserved target (handed to a
// request not yet routed) is saturated.
func (g *flowGate) states(cands []router.Candidate) map[kvkey.Target]flowcontrol.TargetState {
	out := make(map[kvkey.Target]flowcontrol.TargetState, len(cands))
	for _, c := range cands {
		g.mu.Lock()
		r := g.reserved[c.Target]
		g.mu.Unlock()
		s := g.cfg.State(flowLoad(g.capa.Saturation(c.Target)))
		s.Saturated = s.Saturated || r > 0
		s.Guards = g.guards(c.Target)
		out[c.Target] = s
	}
	return out
}

// release ends a target's reservation and wakes the dispatcher.
func (g *flowGate) release(t kvkey.Target) {
	g.mu.Lock()
	if g.reserved[t]--; g.reserved[t] <= 0 {
		delete(g.reserved, t)
	}
	g.mu.Unlock()
	g.wake()
}

// start runs the dispatcher unless it runs, and wakes it.
func (g *flowGate) start() {
	g.mu.Lock()
	if !g.running {
		g.running = true
		go g.dispatch()
	}
	g.mu.Unlock()
	g.wake()
}

// dispatch hands free targets to waiting requests until the queue is empty.
func (g *flowGate) dispatch() {
	tick := time.NewTicker(g.cfg.PollInterval.D())
	defer tick.Stop()
	for {
		g.pump()
		g.mu.Lock()
		if g.q.Len() == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		select {
		case <-g.kick:
		case <-tick.C:
		}
	}
}

// pump dispatches while a free target and a request it may take are there.
func (g *flowGate) pump() {
	for {
		cands := candidates(g.p, "", nil)
		if len(cands) == 0 {
			for _, e := range g.q.Drain() {
				e.Value.(*flowWaiter).done <- flowResult{noWorker: true}
			}
			return
		}
		states := g.states(cands)
		// Within a poll of its deadline a request is left to its own timer.
		for _, e := range g.q.Late(states, g.cfg.PollInterval.D()) {
			e.Value.(*flowWaiter).done <- flowResult{late: true}
		}
		e, d, ok := g.q.Next(states)
		if !ok {
			return
		}
		g.mu.Lock()
		g.reserved[d.Target]++
		g.mu.Unlock()
		g.log.Debug("flow dispatch", "target", d.Target.String(), "choice", d.Choice, "here_ms", d.HereMs,
			"elsewhere_ms", d.ElseMs, "weigh", d.Weigh, "gain_ms", d.GainMs, "top_gain_ms", d.TopGainMs,
			"contended", d.Contended, "protected", d.Protected, "priority", e.Priority,
			"waited_ms", ms(time.Since(e.Enqueued())))
		e.Value.(*flowWaiter).done <- flowResult{target: d.Target, d: d}
	}
}

// flowMetrics are the flow-control series (kvgate_flow_*).
type flowMetrics struct {
	depth      *prometheus.GaugeVec     // priority
	bytes      *prometheus.GaugeVec     // priority
	wait       *prometheus.HistogramVec // outcome
	dispatched *prometheus.CounterVec   // reason
	shed       *prometheus.CounterVec   // reason
	binding    *prometheus.CounterVec   // choice
	queued     *prometheus.CounterVec   // reason
	protected  *prometheus.CounterVec   // by
}

func newFlowMetrics(reg prometheus.Registerer) *flowMetrics {
	m := &flowMetrics{
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvgate_flow_queue_requests", Help: "Requests waiting at the gateway for a worker with room (flow_control), by priority.",
		}, []string{"priority"}),
		bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvgate_flow_queue_bytes", Help: "Request body bytes waiting at the gateway (flow_control), by priority.",
		}, []string{"priority"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_flow_wait_seconds", Help: "Time requests waited at the gateway, by outcome: freed (dispatched), timeout, deadline, client_gone, no_worker, evicted.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"outcome"}),
		dispatched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_flow_dispatched_total", Help: "Requests flow control let through, by reason: direct (a candidate had room, nobody waited), freed (waited, then a freed worker took it).",
		}, []string{"reason"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_flow_shed_total", Help: "Requests that left the gateway's queue undispatched, by reason: queue_full (429), evicted (429: a higher priority took its place), timeout (503: queue_timeout since its arrival), deadline (503: by the time model no worker could give it its first token within queue_timeout of its arrival any more), client_gone, no_worker (503); and streamed requests dispatched after waiting whose worker had not sent their first token by queue_timeout after their arrival: first_token_late (503, the upstream request cancelled).",
		}, []string{"reason"}),
		binding: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_flow_binding_total", Help: "Waiting requests dispatched to a freed worker, by the priced choice: holder (its soonest prefill end by the time model, on the worker holding most of its prefix), faster (its soonest, though another worker holds more of its prefix), late_holder (its soonest among the workers where its first token is predicted by its deadline, the worker holding most of its prefix not being one of them), aged (its wait credit outweighed a sooner one elsewhere), unpriced (no time model).",
		}, []string{"choice"}),
		queued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_flow_queued_total", Help: "Requests that waited at the gateway, by reason: saturated (no worker admitted it), prefix_holder (one did, but waiting for the worker holding its prefix was predicted sooner), behind (others were waiting).",
		}, []string{"reason"}),
	}
	m.protected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvgate_flow_protected_total", Help: "Requests let through whose placement cache protection (flow_control.protect_cache) narrowed: kept off a worker holding the recent prompt of a class that outranks them, by the rule: priority, tenant.",
	}, []string{"by"})
	reg.MustRegister(m.depth, m.bytes, m.wait, m.dispatched, m.shed, m.binding, m.queued, m.protected)
	return m
}

// firstTokenDue is when a streamed request that waited at the gateway must have its first
// token (its arrival plus queue_timeout, flowcontrol.Dispatch.Due); ok is false for any
// other: a request let through at once, one with no deadline to hold it to, or a non-stream
// one, whose first byte comes only after its whole generation. Safe on a nil ticket.
func (t *flowTicket) firstTokenDue(stream bool) (time.Time, bool) {
	if !t.isBound() || !stream || t.due.IsZero() {
		return time.Time{}, false
	}
	return t.due, true
}

// firstTokenLate counts a request whose worker missed its firstTokenDue (the upstream
// request is cancelled) and returns the 503 to answer.
func (s *Server) firstTokenLate(ctx context.Context, t *flowTicket) *apiError {
	t.g.m.shed.WithLabelValues(shedFirstTokenLate).Inc()
	accessFrom(ctx).noteShed(shedFirstTokenLate)
	return &apiError{Status: http.StatusServiceUnavailable, RetryAfter: t.g.cfg.RetryAfterSeconds(),
		Message: fmt.Sprintf("no first token within %s of this request's arrival (flow_control.queue_timeout): it waited at the gateway for a worker, which had not started answering by then; the request was cancelled there", t.g.cfg.QueueTimeout.D())}
}

// isBound reports whether the ticket names the target the request must go to first.
func (t *flowTicket) isBound() bool { return t != nil && t.bound }

// onlyTargets is cands narrowed to ts, or cands when none of ts is among them.
func onlyTargets(cands []router.Candidate, ts []kvkey.Target) []router.Candidate {
	var out []router.Candidate
	for _, c := range cands {
		if slices.Contains(ts, c.Target) {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return cands
	}
	return out
}

// onlyTarget is cands narrowed to t, or cands when t is not among them (it left the fleet).
func onlyTarget(cands []router.Candidate, t kvkey.Target) []router.Candidate {
	for _, c := range cands {
		if c.Target == t {
			return []router.Candidate{c}
		}
	}
	return cands
}

// admitFlow runs the request through its pool's flow gate (nothing without one): see
// flowGate.admit. The error is errFlowClientGone or an *apiError to answer.
func (s *Server) admitFlow(c *gin.Context, p *pool, in *apireq.Request, rreq *router.Request, start time.Time) (*flowTicket, error) {
	if p.flow == nil {
		return nil, nil
	}
	cls, e := s.classify(c.Request.Header, tenantOf(c), p.flow.capa.Program(rreq))
	if e != nil {
		return nil, e
	}
	t, err := p.flow.admit(c.Request.Context(), in, rreq, len(in.Body), cls, start)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// flowLoad is the router's reading of a target's load in flow control's terms.
func flowLoad(s router.Saturation) flowcontrol.Load {
	return flowcontrol.Load{Busy: s.Busy, PrefillTokens: s.PrefillTokens, Waiting: s.Waiting, HasWaiting: s.HasWaiting,
		WaitMs: s.WaitMs, HasWait: s.HasWait, Requests: s.Requests, TTFTRatio: s.TTFTRatio}
}
