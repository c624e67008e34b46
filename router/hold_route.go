package router

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router/latency"
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
	holdFaster       = "faster_elsewhere"
	// holdWould is POST /debug/route's outcome where a request would be held now.
	holdWould = "would_hold"
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
			Help: "Requests that found their prompt's prefix being prefilled on a target, by what the hold did (released, cached, expired, busy, disabled, faster_elsewhere, leader_failed, unrouted, unavailable, cancelled).",
		}, []string{"outcome"}),
		dup: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_router_duplicate_prefill_tokens_total",
			Help: "Prompt tokens of a prefix being prefilled (or cached) on another target, or in flight on the chosen one, that the chosen target computes again, by reason (hold_expired, busy, faster_elsewhere, no_hold).",
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
	d, err := e.pick(ctx, req, cands)
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
		e.holds.route(pf, d.Chosen.Target, pred, e.kv.routedMarkOf(d.Chosen.Target))
	}
	return d, a, nil
}

// routedMarkOf reads t's cumulative routed prefill tallies (not ok when the time model does
// not track t).
func (p *KVPolicy) routedMarkOf(t kvkey.Target) routedMark {
	if p.timed == nil {
		return routedMark{}
	}
	tt := p.timed.get(t)
	if tt == nil {
		return routedMark{}
	}
	return routedMark{tokens: tt.routedU.Load(), pairs: tt.routedPairs.Load(), ok: true}
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

// holdVerdict is what a follower does before any wait: an outcome that routes it by d at once
// (with the duplicate prefill's label), or hold ("" outcome; released at once when the leader
// is done), with the priced choice when there was one.
type holdVerdict struct {
	outcome   string
	dupReason string
	cost      *HoldCost
}

// judge decides, without waiting, whether a follower of lv's prefill sharing shared blocks is
// held: not when a candidate already caches the prefix, the leader's target is gone or busy,
// the leader failed or the hold is off; under kv, not when another target is predicted to
// compute the whole prompt sooner than the wait plus the suffix (KVPolicy.holdCostOf). d is
// the policy's decision for req now.
func (e *Dispatcher) judge(req *Request, d Decision, lv leaderView, shared int) holdVerdict {
	row, ok := scoreOf(d, lv.target)
	switch {
	case bestG1(d) >= shared:
		// The shared prefix is already cached somewhere (an earlier request computed it): the
		// cost weighs that cache; nothing to wait for.
		return holdVerdict{outcome: holdCached}
	case !ok:
		return holdVerdict{outcome: holdUnavailable}
	case lv.done && !lv.computed:
		return holdVerdict{outcome: holdLeaderFailed}
	case row.Busy:
		return holdVerdict{outcome: holdBusy, dupReason: holdBusy}
	case lv.done && !e.kv.cfg.Hold.Enabled:
		return holdVerdict{} // computed already: released without a wait, as before the gate
	case !e.kv.cfg.Hold.Enabled:
		return holdVerdict{outcome: holdDisabled, dupReason: "no_hold"}
	}
	cost := e.kv.holdCostOf(req, d, lv, shared, e.kv.now())
	if cost != nil && !cost.Hold {
		return holdVerdict{outcome: holdFaster, dupReason: holdFaster, cost: cost}
	}
	return holdVerdict{cost: cost}
}

// follow routes a request whose first blocks are being prefilled by pf's leader on a target T:
// unless judge says otherwise (T busy, the hold off, or another target faster), it routes the
// request to T once that prefix is computed there (the leader's first token, or KV events
// covering it), waiting at most the leader's predicted remaining TTFT plus router.hold.margin,
// then routes it anew. The wait ends with ctx; its timers are stopped on every return.
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
	lv := e.holds.snapshot(pf)
	target := lv.target
	shared := sharedBlocks(req.BlockHashes, pf.hashes)
	d, err := e.pick(ctx, req, cands)
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
	if !lv.routed {
		rec.Target = kvkey.Target{}
		return finish(d, holdUnrouted, 0, "")
	}
	v := e.judge(req, d, lv, shared)
	rec.Cost = v.cost
	switch {
	case v.outcome == holdFaster:
		d = elsewhere(d, target, v.cost)
		return finish(d, holdFaster, dupUnlessOn(d, target, shared), holdFaster)
	case v.outcome != "":
		inflight := 0
		if v.dupReason != "" {
			inflight = dupUnlessOn(d, target, shared)
		}
		return finish(d, v.outcome, inflight, v.dupReason)
	case lv.done:
		return finish(e.release(d, target, shared, start), holdReleased, 0, "")
	}
	// Held: counted with the followers released beside this one (holdCostOf).
	u, c := suffixOf(req, shared)
	leave := e.holds.join(pf, u, latency.Pairs(u, c))
	defer leave()
	wait := time.NewTimer(holdDeadline(lv.begun, lv.predMs, cfg.Margin.D(), e.kv.now()))
	defer wait.Stop()
	poll := time.NewTicker(holdPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			e.metrics.hold(holdCancelled)
			return Decision{}, nil, fmt.Errorf("route: held for a shared prefix: %w", ctx.Err())
		case <-pf.doneCh:
			if !e.holds.snapshot(pf).computed {
				if d, err = e.pick(ctx, req, cands); err != nil {
					return Decision{}, nil, err
				}
				return finish(d, holdLeaderFailed, 0, "")
			}
		case <-poll.C:
			if !e.resident(target, req.BlockHashes[:shared]) {
				continue
			}
		case <-wait.C:
			leave()
			if d, err = e.pick(ctx, req, cands); err != nil {
				return Decision{}, nil, err
			}
			if d.Regret != nil {
				d.Regret.Reason = "hold_expired"
			}
			return finish(d, holdExpired, dupUnlessOn(d, target, shared), "hold_expired")
		}
		leave() // released: no longer waiting beside the others
		d, err = e.pick(ctx, req, cands)
		if err != nil {
			return Decision{}, nil, err
		}
		if row, ok := scoreOf(d, target); !ok || row.Busy {
			return finish(d, holdBusy, dupUnlessOn(d, target, shared), holdBusy)
		}
		return finish(e.release(d, target, shared, start), holdReleased, 0, "")
	}
}

// elsewhere is d for a follower not held because cost.Else is faster: d itself, with the
// priced choice in its reason, unless the policy chose the leader's target anyway (a hint
// pulled it there), when it goes to cost.Else instead.
func elsewhere(d Decision, target kvkey.Target, cost *HoldCost) Decision {
	if d.Chosen.Target == target && cost.Else != nil {
		d.Chosen.Target = *cost.Else
		d.Regret = regretOf(d, "load")
	}
	d.Chosen.Reason = fmt.Sprintf("sibling hold priced: not held, faster elsewhere (hold %.3g ms = wait %.3g + suffix %.3g on %s > %.3g ms + %.3g ms of saved GPU time here); %s",
		cost.HoldMs, cost.WaitMs, cost.SuffixMs, target, cost.ElseMs, cost.SavedTermMs, d.Chosen.Reason)
	return d
}

// previewHold is the hold POST /debug/route shows: what judge says now for a request whose
// prefix a routed prefill in flight shares (outcome would_hold where it would be held), or
// nil when none does. It claims nothing and waits for nothing.
func (e *Dispatcher) previewHold(req *Request, d Decision) *HoldRecord {
	pf := e.holds.peek(req.BlockHashes)
	if pf == nil {
		return nil
	}
	lv := e.holds.snapshot(pf)
	if !lv.routed {
		return nil
	}
	shared := sharedBlocks(req.BlockHashes, pf.hashes)
	v := e.judge(req, d, lv, shared)
	rec := &HoldRecord{Target: lv.target, SharedBlocks: shared, Outcome: v.outcome, Cost: v.cost}
	switch {
	case v.outcome != "":
	case lv.done:
		rec.Outcome = holdReleased
	default:
		rec.Outcome = holdWould
	}
	return rec
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
