package router

import (
	"math"
	"time"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router/latency"
)

// timeRow is the time-cost part of one candidate's evaluation.
type timeRow struct {
	pred      latency.Prediction
	ownNoHint float64 // own prefill ms without the sibling-prefix credit
	decodes   float64
	evictMs   float64       // the eviction term
	theta     latency.Theta // the coefficients the row was scored with
}

// scoreState is t's state as scoring sees it: the gateway's queue and decode accounting for
// the target with the peer replicas' share, raised to what its fresh /metrics report (decodes
// running, requests waiting that the gateway did not send, each sized like waiting_weight
// blocks), and the worker's KV usage for the pressure term; with the Theta to score with, the
// load snapshot (peers added) and the metrics reading.
func (p *KVPolicy) scoreState(t kvkey.Target, bs float64, now time.Time) (latency.State, latency.Theta, TargetLoad, WorkerMetrics, bool) {
	var snap TargetLoad
	var m WorkerMetrics
	fresh := false
	if tl := p.load.get(t); tl != nil {
		snap = tl.snapshot()
		m, fresh = tl.freshMetrics(now, p.cfg.MetricsMaxAge.D())
	}
	pv := p.peerLoad(t)
	snap = snap.withPeers(pv)
	st, th := p.timedState(t, pv)
	if fresh {
		st.KVUsage = m.KVUsage
		st.DecodeRequests = math.Max(st.DecodeRequests, m.Running-float64(snap.PrefillRequests))
		if unseen := math.Max(m.Waiting-float64(snap.PrefillRequests), 0); unseen > 0 {
			each := p.cfg.WaitingWeight * bs
			st.AheadTokens += unseen * each
			st.AheadPairs += unseen * latency.Pairs(each, 0)
		}
	}
	return st, th, snap, m, fresh
}

// timeOf scores one candidate by predicted TTFT in its scoring state (scoreState).
// Preference hints subtract the prefill they save.
func (p *KVPolicy) timeOf(r *kvRow, tr *timeRow, c Candidate, hashes []kvkey.BlockHash, promptTokens, bs float64, now time.Time) {
	st, th, snap, m, fresh := p.scoreState(c.Target, bs, now)
	p.busyOf(r, snap, m, fresh)
	qloss := 0.0
	if w := p.timed.queueLossWeight; w > 0 && fresh && m.NumGPUBlocks > 0 && r.match.G1 > 0 { // workset is on with the weight
		// The GPU-cached prefix's place in the worker's LRU order: the working set routed
		// there since the prefix was last used. What the queue ahead evicts of it is
		// computed here after all, for the eviction and recompute terms too.
		cached := float64(r.match.G1)
		newer := p.timed.workset.newerThanPrefix(c.Target, hashes, r.match.G1)
		lost := math.Min(w*latency.QueueLossBlocks(cached, st.AheadTokens/bs, newer, float64(m.NumGPUBlocks)), cached)
		r.prefill = math.Min(r.prefill+lost, promptTokens/bs)
		r.noHint = math.Min(r.noHint+lost, promptTokens/bs)
		qloss = lost / cached
	}
	u := math.Min(math.Max(r.prefill*bs, 1), math.Max(promptTokens, 1))
	uNo := math.Min(math.Max(r.noHint*bs, 1), math.Max(promptTokens, 1))
	pred := latency.PredictTTFT(th, p.timed.params, st, latency.Req{Uncached: u, Cached: math.Max(promptTokens-u, 0)})
	predNo := latency.PredictTTFT(th, p.timed.params, st, latency.Req{Uncached: uNo, Cached: math.Max(promptTokens-uNo, 0)})
	hintMs := 0.0
	if r.prefHint > 0 {
		hintMs = latency.PrefillMs(th, r.prefHint*bs, math.Max(promptTokens-u, 0))
	}
	evictMs, overflowMs := 0.0, 0.0
	if fresh && p.timed.workset != nil {
		evictMs, overflowMs = p.evictOf(th, c.Target, r.prefill, float64(m.NumGPUBlocks), promptTokens, bs, now)
		evictMs += overflowMs
	}
	*tr = timeRow{pred: pred, ownNoHint: predNo.OwnMs, decodes: st.DecodeRequests, evictMs: evictMs, theta: th}
	r.load = pred.QueuedMs + pred.DecodeMs + pred.PressureMs
	r.ttft = pred.TotalMs
	r.evict, r.overflow = evictMs, overflowMs
	r.queueLoss = qloss
	r.cost = pred.TotalMs - hintMs + evictMs
	r.costNoHnt = predNo.TotalMs + evictMs
}

// evictOf is the eviction terms of a prefill of newBlocks on t, against t's working set W (what
// was routed there within approximate.ttl, this request's cached prefix included) and a cache
// of capacity blocks: evict prices the blocks of W the prefill pushes out (latency.EvictBlocks)
// and overflow the rest of t's overflow this prompt's cached prefix shares in
// (latency.OverflowBlocks), each as their prefill when they are asked for again
// (latency.EvictMs, after the rest of a prompt this long) times its weight. The evicted blocks
// are W's oldest, so with evict_stale_after set those last routed before now minus it are
// taken off the evicted ones first, for free.
func (p *KVPolicy) evictOf(th latency.Theta, t kvkey.Target, newBlocks, capacity, promptTokens, bs float64, now time.Time) (evict, overflow float64) {
	w := p.timed.workset.blocks(t)
	if p.timed.evictWeight > 0 {
		ev := latency.EvictBlocks(newBlocks, w, capacity)
		if ev > 0 && p.timed.evictStale > 0 {
			ev = math.Max(0, ev-p.timed.workset.staleBlocks(t, now.Add(-p.timed.evictStale)))
		}
		ev *= bs
		evict = latency.EvictMs(th, ev, math.Max(promptTokens-ev, 0), p.timed.evictWeight)
	}
	if p.timed.overflowWeight > 0 {
		ov := latency.OverflowBlocks(newBlocks, math.Ceil(promptTokens/bs), w, capacity) * bs
		overflow = latency.EvictMs(th, ov, math.Max(promptTokens-ov, 0), p.timed.overflowWeight)
	}
	return evict, overflow
}

// addFleet adds the fleet term to every row: the request's own prefill on a target stretches
// every step it shares with the target's running decodes (latency.FleetMs).
func (p *KVPolicy) addFleet(rows []kvRow, times []timeRow) {
	if p.timed.fleetWeight == 0 {
		return
	}
	for i := range rows {
		t := &times[i]
		rows[i].cost += latency.FleetMs(t.pred.OwnMs, t.decodes, p.timed.fleetWeight)
		rows[i].costNoHnt += latency.FleetMs(t.ownNoHint, t.decodes, p.timed.fleetWeight)
	}
}

// addRecompute adds the recompute term to every row: the prompt blocks the target would compute
// that the best-cached candidate holds (by credited overlap, hints aside), priced as their
// prefill after the target's own cached prefix (latency.RecomputeMs).
func (p *KVPolicy) addRecompute(rows []kvRow, times []timeRow, promptTokens, bs float64) {
	if p.timed.recomputeWeight == 0 || len(rows) < 2 {
		return
	}
	least := math.Inf(1)
	for i := range rows {
		least = math.Min(least, rows[i].noHint)
	}
	for i := range rows {
		extra := (rows[i].noHint - least) * bs
		if extra <= 0 {
			continue
		}
		cached := math.Max(promptTokens-rows[i].noHint*bs, 0)
		ms := latency.RecomputeMs(times[i].theta, extra, cached, p.timed.recomputeWeight)
		rows[i].recompute = ms
		rows[i].cost += ms
		rows[i].costNoHnt += ms
	}
}
