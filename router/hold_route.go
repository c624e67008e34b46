package router

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
)

// holdPoll is how often a held request checks whether the KV events already announced the
// shared prefix on the target (a non-streamed leader's first byte comes only after its whole
// generation).
const holdPoll = 5 * time.Millisecond

// Hold outcomes, as in HoldRecord.Outcome and kvgate_router_holds_total.
const (
	holdReleased     = "released"
	holdExpired      = "expired"
	holdBusy         = "busy"
	holdDisabled     = "disabled"
	holdLeaderFailed = "leader_failed"
	holdUnrouted     = "unrouted"
	holdUnavailable  = "unavailable"
	holdCancelled    = "cancelled"
	holdCached       = "cached"
)

// routeMetrics are the hold, duplicate-prefill and regret counters of the KV-aware policies.
// A nil *routeMetrics counts nothing.
type routeMetrics struct {
	holds, dup, regret *prometheus.CounterVec
}

func newRouteMetrics(reg prometheus.Registerer) (*routeMetrics, error) {
	m := &routeMetrics{
		holds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_router_holds_total",
			Help: "Requests that found their prompt's prefix being prefilled on a target, by what the hold did (released, cached, expired, busy, disabled, leader_failed, unrouted, unavailable, cancelled).",
		}, []string{"outcome"}),
		dup: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_router_duplicate_prefill_tokens_total",
			Help: "Prompt tokens of a prefix being prefilled (or cached) on another target, or in flight on the chosen one, that the chosen target computes again, by reason (hold_expired, busy, no_hold).",
		}, []string{"reason"}),
		regret: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_router_cache_regret_blocks_total",
			Help: "Per routing decision, the best G1 overlap of any candidate minus the chosen target's (when > 0), by why the choice differed (load, busy, hint, temperature, hold, hold_expired).",
		}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{m.holds, m.dup, m.regret} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register router hold metrics: %w", err)
		}
	}
	return m, nil
}

func (m *routeMetrics) hold(outcome string) {
	if m != nil {
		m.holds.WithLabelValues(outcome).Inc()
	}
}

// decided counts a committed decision's regret and duplicate prefill.
func (m *routeMetrics) decided(d Decision, dupTokens int, dupReason string) {
	if m == nil {
		return
	}
	if d.Regret != nil && d.Regret.Blocks > 0 {
		m.regret.WithLabelValues(d.Regret.Reason).Add(float64(d.Regret.Blocks))
	}
	if dupTokens > 0 {
		m.dup.WithLabelValues(dupReason).Add(float64(dupTokens))
	}
}

// routeKV is Route for the KV-aware policies: it tracks the prefills in flight and holds a
// request whose prefix is one of them (Dispatcher.follow).
func (e *Dispatcher) routeKV(ctx context.Context, req *Request, cands []Candidate) (Decision, Lifecycle, error) {
	pf, leader := e.holds.claim(req.BlockHashes, e.kv.now())
	if pf != nil && !leader {
		return e.follow(ctx, req, cands, pf)
	}
	d, err := e.Pick(ctx, req, cands)
	if err != nil {
		if pf != nil {
			e.holds.finish(pf, false)
		}
		return Decision{}, nil, err
	}
	a := e.commit(d, req, 0, "")
	if pf != nil {
		a.lead = pf
		pred := 0.0
		if a.obs != nil {
			pred = a.obs.predMs
		}
		e.holds.route(pf, d.Chosen.Target, pred)
	}
	return d, a, nil
}

// commit begins the attempt of decision d and counts its regret and duplicate prefill:
// inflight is the prefix blocks a prefill in flight holds that this request will compute again
// unless the chosen target has them (0 when none), reason the duplicate's label.
func (e *Dispatcher) commit(d Decision, req *Request, inflight int, reason string) *attempt {
	a := &attempt{e: e, req: req, d: d, h: e.begin(d, req)}
	if e.kv != nil {
		if a.obs = e.kv.beginTime(d, req); a.obs != nil {
			a.h.attach(a.obs) // one expiry (LoadTracker.Expire) ends both
		}
	}
	chosen := CachedBlocks(d)
	best := inflight
	if d.Regret != nil {
		best = max(best, d.Regret.BestG1)
		if reason == "" {
			reason = "no_hold"
			if d.Regret.Reason == holdBusy {
				reason = holdBusy
			}
		}
	}
	e.metrics.decided(d, max(best-chosen, 0)*blockSizeOf(req), reason)
	return a
}

// follow routes a request whose first blocks are being prefilled by pf's leader on a target T:
// unless T is busy (or the hold is off), it routes the request to T once that prefix is
// computed there (the leader's first token, or KV events covering it), waiting at most the
// leader's predicted remaining TTFT plus router.hold.margin, then routes it anew. The wait ends
// with ctx; its timers are stopped on every return.
func (e *Dispatcher) follow(ctx context.Context, req *Request, cands []Candidate, pf *prefill) (Decision, Lifecycle, error) {
	cfg := e.kv.cfg.Hold
	start := time.Now()
	if !isClosed(pf.routedCh) {
		t := time.NewTimer(cfg.Margin.D())
		select {
		case <-pf.routedCh:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			e.metrics.hold(holdCancelled)
			return Decision{}, nil, fmt.Errorf("route: held for a shared prefix: %w", ctx.Err())
		}
		t.Stop()
	}
	routed, target, begun, predMs, done, computed := e.holds.snapshot(pf)
	shared := sharedBlocks(req.BlockHashes, pf.hashes)
	d, err := e.Pick(ctx, req, cands)
	if err != nil {
		return Decision{}, nil, err
	}
	rec := &HoldRecord{Target: target, SharedBlocks: shared}
	finish := func(d Decision, outcome string, inflight int, dupReason string) (Decision, Lifecycle, error) {
		rec.Outcome = outcome
		rec.WaitedMs = float64(time.Since(start)) / float64(time.Millisecond)
		d.Hold = rec
		e.metrics.hold(outcome)
		return d, e.commit(d, req, inflight, dupReason), nil
	}
	if !routed {
		rec.Target = kvkey.Target{}
		return finish(d, holdUnrouted, 0, "")
	}
	row, ok := scoreOf(d, target)
	switch {
	case bestG1(d) >= shared:
		// The shared prefix is already cached somewhere (an earlier request computed it): the
		// cost weighs that cache; nothing to wait for.
		return finish(d, holdCached, 0, "")
	case !ok:
		return finish(d, holdUnavailable, 0, "")
	case done && !computed:
		return finish(d, holdLeaderFailed, 0, "")
	case row.Busy:
		return finish(d, holdBusy, dupUnlessOn(d, target, shared), holdBusy)
	case done:
		return finish(e.release(d, target, shared, start), holdReleased, 0, "")
	case !cfg.Enabled:
		return finish(d, holdDisabled, dupUnlessOn(d, target, shared), "no_hold")
	}
	wait := time.NewTimer(holdDeadline(begun, predMs, cfg.Margin.D(), e.kv.now()))
	defer wait.Stop()
	poll := time.NewTicker(holdPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			e.metrics.hold(holdCancelled)
			return Decision{}, nil, fmt.Errorf("route: held for a shared prefix: %w", ctx.Err())
		case <-pf.doneCh:
			if _, _, _, _, _, computed := e.holds.snapshot(pf); !computed {
				if d, err = e.Pick(ctx, req, cands); err != nil {
					return Decision{}, nil, err
				}
				return finish(d, holdLeaderFailed, 0, "")
			}
		case <-poll.C:
			if !e.resident(target, req.BlockHashes[:shared]) {
				continue
			}
		case <-wait.C:
			if d, err = e.Pick(ctx, req, cands); err != nil {
				return Decision{}, nil, err
			}
			if d.Regret != nil {
				d.Regret.Reason = "hold_expired"
			}
			return finish(d, holdExpired, dupUnlessOn(d, target, shared), "hold_expired")
		}
		d, err = e.Pick(ctx, req, cands)
		if err != nil {
			return Decision{}, nil, err
		}
		if row, ok := scoreOf(d, target); !ok || row.Busy {
			return finish(d, holdBusy, dupUnlessOn(d, target, shared), holdBusy)
		}
		return finish(e.release(d, target, shared, start), holdReleased, 0, "")
	}
}

// dupUnlessOn is the shared blocks a request routed by d computes again elsewhere: all of them
// when d chose another target than the leader's, none when it chose the leader's (there the
// worker's own scheduler decides whether it waits for the blocks or computes them in the same
// step; the gateway cannot tell).
func dupUnlessOn(d Decision, target kvkey.Target, shared int) int {
	if d.Chosen.Target == target {
		return 0
	}
	return shared
}

// release sends the held request to target, where its shared prefix is now computed.
func (e *Dispatcher) release(d Decision, target kvkey.Target, shared int, start time.Time) Decision {
	if d.Chosen.Target != target {
		d.Chosen.Target = target
		if d.Regret != nil || bestG1(d) > CachedBlocks(d) {
			d.Regret = regretOf(d, "hold")
		}
	}
	d.Chosen.Reason = fmt.Sprintf("sibling hold: held %s until the %d-block prefix in flight here was computed; %s",
		time.Since(start).Round(time.Microsecond), shared, d.Chosen.Reason)
	return d
}

// resident reports whether the event index holds all of hashes on t (G1).
func (e *Dispatcher) resident(t kvkey.Target, hashes []kvkey.BlockHash) bool {
	k := e.kv
	if k.matcher == nil || len(hashes) == 0 || k.Mode(t) != ModeEvents {
		return false
	}
	var out [1]indexers.TierMatch
	k.matcher.MatchTiers(hashes, []kvkey.Target{t}, out[:])
	return out[0].G1 >= len(hashes)
}

// scoreOf returns t's row in d.
func scoreOf(d Decision, t kvkey.Target) (CandidateScore, bool) {
	for _, c := range d.Candidates {
		if c.Target == t {
			return c, true
		}
	}
	return CandidateScore{}, false
}

func bestG1(d Decision) int {
	b := 0
	for _, c := range d.Candidates {
		b = max(b, c.G1Blocks)
	}
	return b
}

// regretOf recomputes d's regret for its chosen target with the given reason (nil if none).
func regretOf(d Decision, reason string) *Regret {
	chosen := CachedBlocks(d)
	var r *Regret
	for _, c := range d.Candidates {
		if c.G1Blocks > chosen && (r == nil || c.G1Blocks > r.BestG1) {
			r = &Regret{Blocks: c.G1Blocks - chosen, Best: c.Target, BestG1: c.G1Blocks, Reason: reason}
		}
	}
	return r
}
