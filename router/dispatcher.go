package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/sessions"
)

// Dispatcher is what the server calls to route (it implements Router): it runs a policy, accounts
// the chosen target's load, teaches the approximate index, makes the session updates, scrapes
// worker metrics, closes the loop on the workers' reported usage, and serves the debug views.
// One Dispatcher serves one gateway; it is safe for concurrent use.
type Dispatcher struct {
	policy   Policy
	kv       *KVPolicy // nil when the policy is not KV-aware
	load     *LoadTracker
	approx   *indexers.ApproxIndex
	sessions *sessions.Tracker     // nil: no session tracking
	events   *indexers.Subscribers // nil: no KV-event subscriptions
	feedback *feedback
	holds    *holdTable    // the prefills in flight (KV-aware policies; nil otherwise)
	pins     *pinTable     // Responses API response id → the target storing it
	metrics  *routeMetrics // nil: not registered
	scraper  *Scraper
	fleet    atomic.Pointer[Fleet] // shared with peer replicas (SetFleet); nil: one replica
	sweep    time.Duration
	log      *slog.Logger
	busy     KVConfig  // the busy thresholds Busy applies (flow control)
	changes  listeners // OnLoadChange's functions
}

// DispatcherOptions configure a Dispatcher. Exactly one of Policy and KV is required.
type DispatcherOptions struct {
	// Policy selects targets when the dispatcher runs a simple policy (round robin, random, least
	// loaded); a KV-aware policy goes in KV instead.
	Policy Policy
	// KV is the KV-aware policy the dispatcher runs; its load tracker and approximate index are the
	// dispatcher's (Load and Approx below are then ignored).
	KV *KVPolicy
	// Load accounts in-flight load for non-KV policies (a new tracker when nil).
	Load *LoadTracker
	// Approx is taught every routing decision when set (non-KV policies only; see Policy).
	Approx *indexers.ApproxIndex
	// Sessions, when set, hears every request's identity (Start), every routed attempt
	// (Lifecycle.Sent: OnRouted) and end-of-session requests (End), and backs DebugSession.
	Sessions *sessions.Tracker
	// Events, when set, is the KV-event subscriptions shown by DebugTargets and
	// DebugFleet.
	Events *indexers.Subscribers
	// Registerer receives the dispatcher's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Log receives tokenization-mismatch warnings and scrape failures (slog.Default when nil).
	Log *slog.Logger
	// Targets lists the routing targets whose workers' /metrics Run scrapes; nil disables
	// scraping. MetricsClient does the scraping (http.DefaultClient when nil) every
	// MetricsInterval (the KV policy's metrics_interval, else 1s).
	Targets         func() []kvkey.Target
	MetricsClient   *http.Client
	MetricsInterval time.Duration
	// OnWorkerRestart hears a worker whose scraped process_start_time_seconds changed (a
	// restart that /health may never have shown); see Scraper.OnRestart.
	OnWorkerRestart func(worker string)
	// MismatchLogBurst is how many prompt-token mismatches are logged before the log is limited
	// to one line per MismatchLogEvery (defaults 5 and 1m).
	MismatchLogBurst int
	MismatchLogEvery time.Duration
	// Pins bounds the Responses API pins (response id → target; router.responses.*). The zero
	// value keeps none.
	Pins PinConfig
	// SharedPins, when set, shares every pin with the fleet's other replicas and answers a
	// local miss (several replicas, the cluster section).
	SharedPins SharedPins
	// Busy holds the busy thresholds (busy_waiting_requests, busy_kv_usage,
	// busy_prefill_tokens, metrics_max_age) that Busy applies for a policy that is not
	// KV-aware; a KV policy's own config is used otherwise. The zero value marks nothing busy.
	Busy KVConfig
}

// NewDispatcher builds a dispatcher around a policy.
func NewDispatcher(o DispatcherOptions) (*Dispatcher, error) {
	if (o.Policy == nil) == (o.KV == nil) {
		return nil, errors.New("router dispatcher: exactly one of Policy and KV is required")
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	e := &Dispatcher{policy: o.Policy, load: o.Load, approx: o.Approx, sessions: o.Sessions, events: o.Events,
		sweep: time.Second, log: log, pins: newPinTable(o.Pins, o.SharedPins)}
	interval := o.MetricsInterval
	if kv := o.KV; kv != nil {
		e.policy, e.kv = kv, kv
		e.load = kv.Load()
		e.approx = kv.Approx()
		o.Busy = kv.Config()
		if interval == 0 {
			interval = kv.Config().MetricsInterval.D()
		}
	}
	if e.load == nil {
		e.load = NewLoadTracker(DefaultKVConfig().LoadExpiry.D())
	}
	e.busy = o.Busy
	if interval <= 0 {
		interval = time.Second
	}
	fb, err := newFeedback(o.Registerer, log, o.MismatchLogBurst, o.MismatchLogEvery)
	if err != nil {
		return nil, err
	}
	e.feedback = fb
	if e.kv != nil && e.kv.timed != nil && o.Registerer != nil {
		tm, err := newTimeMetrics(o.Registerer)
		if err != nil {
			return nil, err
		}
		e.kv.timed.metrics = tm
	}
	if e.kv != nil {
		e.holds = newHoldTable(e.kv.cfg.Hold.MinBlocks)
		if o.Registerer != nil {
			if e.metrics, err = newRouteMetrics(o.Registerer); err != nil {
				return nil, err
			}
		}
	}
	if o.Targets != nil {
		e.scraper = &Scraper{Tracker: e.load, Client: o.MetricsClient, Interval: interval, Targets: o.Targets, Log: log,
			OnRestart: o.OnWorkerRestart}
	}
	return e, nil
}

// Policy returns the dispatcher's policy.
func (e *Dispatcher) Policy() Policy { return e.policy }

// Load returns the dispatcher's load tracker (for the debug endpoint and tests).
func (e *Dispatcher) Load() *LoadTracker { return e.load }

// Name is the wrapped policy's name.
func (e *Dispatcher) Name() string { return e.policy.Name() }

// Start records the request's session identity before it is routed, and returns the function
// that ends the session after the request when the request is its last (EndsSession): a
// retry inside the request still sees the session.
func (e *Dispatcher) Start(req *Request) (end func()) {
	if e.sessions == nil || req.SessionID == "" {
		return func() {}
	}
	e.sessions.Observe(sessions.Identity{SessionID: req.SessionID, ParentID: req.ParentSessionID, Final: req.EndsSession})
	if !req.EndsSession {
		return func() {}
	}
	id := req.SessionID
	return func() { e.sessions.End(id) }
}

// Route picks a target (Pick) and begins the attempt's accounting (Begin); the returned
// Lifecycle makes the session update when the request is sent, ends the prefill load at the
// first token, feeds the reported usage back, and releases the load at Done or Failed.
//
// Under a KV-aware policy a request whose prompt shares at least router.hold.min_blocks blocks
// with a prefill in flight may wait here, on ctx, until that prefix is computed (routeKV).
func (e *Dispatcher) Route(ctx context.Context, req *Request, cands []Candidate) (Decision, Lifecycle, error) {
	d, lc, err := e.route(ctx, req, cands)
	if err == nil {
		e.logDecision(ctx, req, d)
	}
	return d, lc, err
}

// logDecision writes the whole decision record (every candidate's overlap, load, eviction and
// cost) at debug level: what explains, after a run, why a request went where it did. The
// record names targets and block counts only, never prompt text.
func (e *Dispatcher) logDecision(ctx context.Context, req *Request, d Decision) {
	if !e.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	b, err := json.Marshal(d)
	if err != nil {
		return
	}
	e.log.DebugContext(ctx, "routed", "session", req.SessionID, "parent", req.ParentSessionID,
		"target", d.Chosen.Target.String(), "decision", string(b))
}

func (e *Dispatcher) route(ctx context.Context, req *Request, cands []Candidate) (Decision, Lifecycle, error) {
	if req.PinResponseID != "" {
		return e.routePinned(ctx, req, cands)
	}
	if e.sessions != nil {
		// The fleet's bindings of this session and its parent, when the replica's view of
		// them is known to lag (after a reconnect): read within the store's deadline, outside
		// every lock, before the hints are taken.
		e.sessions.SyncShared(ctx, req.SessionID, req.ParentSessionID)
	}
	if e.holds != nil {
		return e.routeKV(ctx, req, cands)
	}
	d, err := e.pick(ctx, req, cands)
	if err != nil {
		return Decision{}, nil, err
	}
	return d, e.commit(d, req, 0, ""), nil
}

// Pick runs the policy and times it; it accounts nothing (POST /debug/route calls it as is).
// Policies with their own state (round robin) still advance it. Under a KV-aware policy, when
// a prefill in flight shares the prompt's prefix, the decision's Hold says what the sibling
// hold would do now (previewHold; nothing waits).
func (e *Dispatcher) Pick(ctx context.Context, req *Request, candidates []Candidate) (Decision, error) {
	d, err := e.pick(ctx, req, candidates)
	if err == nil && e.holds != nil {
		d.Hold = e.previewHold(req, d)
	}
	return d, err
}

// pick is Pick without the hold's preview (the routing paths judge the hold themselves).
func (e *Dispatcher) pick(ctx context.Context, req *Request, candidates []Candidate) (Decision, error) {
	if len(candidates) == 0 {
		return Decision{}, errNoCandidates
	}
	start := time.Now()
	if f := e.fleet.Load(); f != nil && e.kv == nil && f.Peers != nil {
		candidates = withPeerInFlight(candidates, f.Peers)
	}
	d, err := e.policy.Pick(ctx, req, candidates)
	if err != nil {
		return Decision{}, fmt.Errorf("route with %s: %w", e.policy.Name(), err)
	}
	e.feedback.decided(e.policy.Name(), time.Since(start))
	return d, nil
}

func (e *Dispatcher) begin(d Decision, req *Request) *Handle {
	if e.kv != nil {
		return e.kv.begin(d, req)
	}
	h := e.load.Begin(d.Chosen.Target, req, CachedBlocks(d))
	if e.approx != nil && len(req.BlockHashes) > 0 {
		e.approx.Record(d.Chosen.Target, req.BlockHashes)
		if f := e.fleet.Load(); f != nil && f.Approx != nil {
			f.Approx.RoutedApprox(d.Chosen.Target, req.BlockHashes)
		}
	}
	return h
}

// SetFleet shares this gateway's load (and approximate-mode routing) with peer replicas and
// scores with theirs added: the KV-aware policies add every peer quantity they use (see
// KVPolicy.SetFleet), least_loaded adds the peers' requests in flight to each candidate's.
// Call it before routing starts.
func (e *Dispatcher) SetFleet(f Fleet) {
	e.fleet.Store(&f)
	if e.kv != nil {
		e.kv.SetFleet(f)
		return
	}
	e.load.SetPublisher(f.Load)
}

// withPeerInFlight is a copy of cands with the peers' requests in flight added to each.
func withPeerInFlight(cands []Candidate, peers *PeerLoads) []Candidate {
	out := make([]Candidate, len(cands))
	for i, c := range cands {
		c.InFlight += int(peers.Sum(c.Target).Requests)
		out[i] = c
	}
	return out
}

// Forget drops what approximate mode assumed about t (its worker may have restarted with an
// empty cache, e.g. after a health flap) and returns t's latency fit to the prior profile.
func (e *Dispatcher) Forget(t kvkey.Target) {
	if e.approx != nil {
		e.approx.Forget(t)
	}
	if e.kv != nil && e.kv.recent != nil {
		e.kv.recent.forget(t)
	}
	if e.kv != nil && e.kv.timed != nil && e.kv.timed.workset != nil {
		e.kv.timed.workset.forget(t)
	}
	if e.kv != nil && e.kv.timed != nil {
		e.kv.timed.reset(t)
	}
}

// Run scrapes worker metrics and sweeps expired load and approximate entries until ctx ends.
func (e *Dispatcher) Run(ctx context.Context) {
	if e.scraper != nil {
		go e.scraper.Run(ctx)
	}
	tick := time.NewTicker(e.sweep)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if e.kv != nil {
				e.kv.checkRestarts()
				if e.kv.timed != nil && e.kv.timed.workset != nil {
					e.kv.timed.workset.expire(e.kv.now().Add(-e.kv.cfg.Approximate.TTL.D()))
				}
				e.holds.expire(e.kv.now().Add(-e.kv.cfg.LoadExpiry.D()))
			}
			if n := e.load.Expire(); n > 0 {
				e.log.Warn("router: force-released stale request load", "count", n)
			}
			if e.approx != nil {
				e.approx.Expire()
			}
		}
	}
}

// The server holds a Dispatcher as its Router.
var _ Router = (*Dispatcher)(nil)
