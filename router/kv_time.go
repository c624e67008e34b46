package router

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router/latency"
	"github.com/kvgate/kvgate/router/routerconfig"
)

// maxTimedTargets bounds how many targets the time model keeps state for; targets beyond it
// are scored with the prior and an empty queue (a fleet that large is not expected).
const maxTimedTargets = 4096

// timeModel is the kv policy's cost: per target, the gateway's own account of the prefill
// queued there (tokens and attention pairs, routed and before their first token) and of the
// running decodes (count and prompt KV tokens), and each target's online fit of the TTFT
// model. Scoring reads atomics and an immutable Theta; only feeding a fit takes its lock.
type timeModel struct {
	params latency.Params
	prior  latency.Theta
	fit    latency.FitConfig
	learn  bool
	// learnFrom is which sample sources feed the fit (router.latency.learn_from).
	learnFrom       [latency.NumSources]bool
	fleetWeight     float64
	evictWeight     float64
	evictStale      time.Duration // evict_stale_after (0: every working-set block counts)
	recomputeWeight float64
	overflowWeight  float64
	queueLossWeight float64
	// workset is each target's working set for the eviction term (nil when it is off).
	workset *workingSets
	metrics *timeMetrics            // nil: no metrics registered
	pub     atomic.Pointer[loadPub] // the fleet's load sync, when clustered

	targets *perTarget[targetTime]
}

// targetTime is one target's queue, decode batch and fit.
type targetTime struct {
	aheadTokens atomic.Int64 // uncached prompt tokens routed here before their first token
	aheadPairs  atomic.Int64 // their attention pairs
	decodes     atomic.Int64 // requests past their first token and not done
	decodeKV    atomic.Int64 // those requests' prompt tokens
	theta       atomic.Pointer[latency.Theta]
	started     atomic.Uint64 // float64 bits of the worker's last seen process start time
	// Cumulative tallies, never decreasing, that the worker window takes differences of:
	// uncached tokens and pairs of every attempt routed here, and the count, uncached and
	// cached tokens of the completed attempts that had a first token.
	routedU, routedPairs atomic.Int64
	doneN, doneU, doneC  atomic.Int64

	mu     sync.Mutex // guards fitter, worker, srcErr
	fitter *latency.Fitter
	worker workerWindow
	srcErr [latency.NumSources]float64 // smoothed |relative error| of each source's samples
}

// srcErrRate is the smoothing rate of the per-source prediction errors in the debug view.
const srcErrRate = 0.1

// observe feeds one sample to the fit, keeps the source's error and counts it in metrics;
// the caller holds tt.mu and publishes the Theta afterwards.
func (tt *targetTime) observe(m *timeMetrics, worker string, src latency.Source, x [latency.NumFeatures]float64, yMs float64) {
	relErr, err := tt.fitter.ObserveFrom(src, x, yMs)
	if err != nil {
		return
	}
	if tt.fitter.SamplesBySource()[src] == 1 {
		tt.srcErr[src] = math.Abs(relErr)
	} else {
		tt.srcErr[src] += srcErrRate * (math.Abs(relErr) - tt.srcErr[src])
	}
	m.fitted(worker, src, relErr)
}

// publish stores the fit's current Theta for scoring; the caller holds tt.mu.
func (tt *targetTime) publish() {
	th := tt.fitter.Theta()
	tt.theta.Store(&th)
}

// gatewayTally is a reading of a target's cumulative tallies (targetTime).
type gatewayTally struct {
	routedU, routedPairs float64
	doneN, doneU, doneC  float64
}

func (tt *targetTime) tally() gatewayTally {
	return gatewayTally{float64(tt.routedU.Load()), float64(tt.routedPairs.Load()),
		float64(tt.doneN.Load()), float64(tt.doneU.Load()), float64(tt.doneC.Load())}
}

// windowReading is what one sweep reads for a target: the worker's last scrape and the
// gateway's own tallies and decode accounting at that moment.
type windowReading struct {
	timing            WorkerTiming
	running, kvUsage  float64
	start             float64 // process_start_time_seconds (0: not exposed)
	gw                gatewayTally
	decodes, decodeKV float64
}

// fitSample is one sample for a target's fit.
type fitSample struct {
	src latency.Source
	x   [latency.NumFeatures]float64
	yMs float64
}

// windowSamples are the at most two samples one window gives (prefill and step).
type windowSamples struct {
	s [2]fitSample
	n int
}

func (w *windowSamples) add(s fitSample) { w.s[w.n] = s; w.n++ }

// workerWindow follows what the worker's own timing histograms say, window by window (between
// two sweeps that saw different scrapes). Each window gives the fit at most one prefill sample
// (mean vllm:request_prefill_time_seconds against the mean prefill computed) and one step
// sample (mean vllm:inter_token_latency_seconds against the mean prefill per step and the
// decode batch), whatever the number of requests in it, so a busy window weighs no more than
// a quiet one. Smoothed means of TTFT, prefill time, ITL and tokens per step are shown beside
// the fit (vLLM's TTFT starts at tokenization, the gateway's at routing).
type workerWindow struct {
	last                         WorkerTiming
	lastRunning, lastStart       float64
	lastGW                       gatewayTally
	seen                         bool
	ttftMs, prefillMs, itlMs     float64
	tokensPerStep                float64
	hasTTFT, hasPrefil, hasSteps bool
	hasITL                       bool
}

// delta is the difference of two cumulative histogram readings (sum and count); ok only when
// the count moved and neither went down.
func delta(prevSum, sum, prevCount, count float64) (dSum, dCount float64, ok bool) {
	dSum, dCount = sum-prevSum, count-prevCount
	return dSum, dCount, dCount > 0 && dSum >= 0
}

// restarted reports whether t cannot follow prev: some cumulative figure went down (the
// worker restarted and its counters began again).
func (t WorkerTiming) restarted(prev WorkerTiming) bool {
	cur := [...]float64{t.TTFTSum, t.TTFTCount, t.PrefillSum, t.PrefillCount, t.IterTokensSum, t.Iterations,
		t.ITLSum, t.ITLCount, t.TPOTSum, t.TPOTCount, t.ComputedSum, t.ComputedCount}
	old := [...]float64{prev.TTFTSum, prev.TTFTCount, prev.PrefillSum, prev.PrefillCount, prev.IterTokensSum, prev.Iterations,
		prev.ITLSum, prev.ITLCount, prev.TPOTSum, prev.TPOTCount, prev.ComputedSum, prev.ComputedCount}
	for i := range cur {
		if cur[i] < old[i] {
			return true
		}
	}
	return false
}

// itl returns the inter-token latency histogram: vllm:inter_token_latency_seconds, or its
// deprecated name when only that one moves.
func (t WorkerTiming) itl() (sum, count float64) {
	if t.ITLCount > 0 {
		return t.ITLSum, t.ITLCount
	}
	return t.TPOTSum, t.TPOTCount
}

// workerWindowRate is the smoothing rate of the worker window means.
const workerWindowRate = 0.3

// add folds a new cumulative reading into the window means and returns the window's fit
// samples. A reading that cannot follow the last one (a figure went down, or a new process
// start time: the worker restarted) only starts a new window; so does the first.
func (w *workerWindow) add(r windowReading, p latency.Params) windowSamples {
	t, prev, prevRunning, prevGW := r.timing, w.last, w.lastRunning, w.lastGW
	fresh := !w.seen || r.start != w.lastStart || t.restarted(prev)
	w.last, w.lastRunning, w.lastStart, w.lastGW, w.seen = t, r.running, r.start, r.gw, true
	if fresh {
		return windowSamples{}
	}
	ewma := func(v *float64, has *bool, x float64) {
		if !*has {
			*v, *has = x, true
			return
		}
		*v += workerWindowRate * (x - *v)
	}
	if dc := t.TTFTCount - prev.TTFTCount; dc > 0 {
		ewma(&w.ttftMs, &w.hasTTFT, 1000*(t.TTFTSum-prev.TTFTSum)/dc)
	}
	if dc := t.PrefillCount - prev.PrefillCount; dc > 0 {
		ewma(&w.prefillMs, &w.hasPrefil, 1000*(t.PrefillSum-prev.PrefillSum)/dc)
	}
	if dc := t.Iterations - prev.Iterations; dc > 0 {
		ewma(&w.tokensPerStep, &w.hasSteps, (t.IterTokensSum-prev.IterTokensSum)/dc)
	}
	prevITLSum, prevITLN := prev.itl()
	itlSum, itlN := t.itl()
	dITL, nITL, okITL := delta(prevITLSum, itlSum, prevITLN, itlN)
	if okITL {
		ewma(&w.itlMs, &w.hasITL, 1000*dITL/nITL)
	}

	var out windowSamples
	// The decode batch over the window: the mean of the worker's running count at both ends,
	// at least the gateway's decodes, each with the mean KV length of the gateway's decodes
	// (0 when it has none: then only the per-step constant is learned from steps).
	bDec := math.Max((r.running+prevRunning)/2, r.decodes)
	kDec := 0.0
	if r.decodes > 0 {
		kDec = r.decodeKV / r.decodes * bDec
	}
	// The window's prefills: their mean uncached tokens from the worker's own histogram when
	// it counts the same requests as the prefill time, else the gateway's completed attempts;
	// their mean cached context from the gateway's completed attempts (0 without any).
	u, c, haveU := 0.0, 0.0, false
	dPre, nPre, okPre := delta(prev.PrefillSum, t.PrefillSum, prev.PrefillCount, t.PrefillCount)
	dComp, nComp, okComp := delta(prev.ComputedSum, t.ComputedSum, prev.ComputedCount, t.ComputedCount)
	if okComp {
		u, haveU = dComp/nComp, true
	}
	if n := r.gw.doneN - prevGW.doneN; n > 0 {
		if !haveU {
			u, haveU = (r.gw.doneU-prevGW.doneU)/n, true
		}
		c = (r.gw.doneC - prevGW.doneC) / n
	}
	if okPre && haveU && u >= 1 && (!okComp || math.Abs(nComp-nPre) <= 0.1*nPre) {
		out.add(fitSample{latency.SourceWorkerPrefill, latency.PrefillFeatures(u, c, bDec, kDec, p), 1000 * dPre / nPre})
	}
	// The window's steps: the prefill tokens computed per step (the worker's, else the
	// gateway's routed ones) beside the decodes. A decode's inter-token latency is one step.
	if steps := t.Iterations - prev.Iterations; okITL && steps > 0 {
		tok, pairs := 0.0, 0.0
		switch {
		case okComp:
			tok = dComp / steps
			if haveU && u > 0 {
				pairs = tok * (c + u/2) // Pairs(u, c)/u per computed token
			}
		default:
			tok = (r.gw.routedU - prevGW.routedU) / steps
			pairs = (r.gw.routedPairs - prevGW.routedPairs) / steps
		}
		out.add(fitSample{latency.SourceWorkerStep, latency.StepFeatures(tok, pairs, kDec), 1000 * dITL / nITL})
	}
	if p.KVPressureWeight > 0 && r.kvUsage > p.KVPressureStart {
		return windowSamples{} // preemption and admission stalls: not what the model describes
	}
	return out
}

// newTimeModel returns the kv policy's time model; window is the working set's (approximate.ttl).
func newTimeModel(c routerconfig.Latency, window time.Duration) (*timeModel, error) {
	fc := latency.DefaultFitConfig()
	fc.Lambda, fc.ReadySamples = c.Forgetting, c.ReadySamples
	if err := fc.Validate(); err != nil {
		return nil, fmt.Errorf("latency: %w", err)
	}
	tm := &timeModel{
		params: latency.Params{MaxBatchedTokens: c.MaxNumBatchedTokens, KVPressureStart: c.KVPressureStart,
			KVPressureWeight: c.KVPressureWeight},
		prior: latency.Theta{c.FrontendMs, c.PrefillMsPerToken, c.AttentionMsPerPair, c.StepMs, c.StepMsPerKVToken},
		fit:   fc, learn: c.Learn, fleetWeight: c.FleetWeight, evictWeight: c.EvictWeight, evictStale: c.EvictStaleAfter.D(),
		recomputeWeight: c.RecomputeWeight, overflowWeight: c.OverflowWeight, queueLossWeight: c.QueueLossWeight,
		targets: newPerTarget[targetTime](),
	}
	if !tm.prior.Valid() {
		return nil, fmt.Errorf("latency: prior profile %v must be finite and nonnegative", tm.prior)
	}
	for _, name := range c.LearnFrom {
		for src, n := range latency.SourceNames() {
			if n == name {
				tm.learnFrom[src] = true
			}
		}
	}
	if tm.evictWeight > 0 || tm.overflowWeight > 0 || tm.queueLossWeight > 0 {
		tm.workset = newWorkingSets(window)
	}
	return tm, nil
}

func (tm *timeModel) get(t kvkey.Target) *targetTime { return tm.targets.get(t) }

// getOrCreate returns t's state, or nil when the model already tracks maxTimedTargets.
func (tm *timeModel) getOrCreate(t kvkey.Target) *targetTime {
	return tm.targets.getOrCreate(t, func() *targetTime {
		f, err := latency.NewFitter(tm.prior, tm.fit)
		if err != nil { // the config was validated in newTimeModel
			return nil
		}
		tt := &targetTime{fitter: f}
		th := tm.prior
		tt.theta.Store(&th)
		return tt
	})
}

// state is t's queue and decode batch as the gateway accounts it, and the Theta to score with.
func (tm *timeModel) state(t kvkey.Target) (latency.State, latency.Theta) {
	tt := tm.get(t)
	if tt == nil {
		return latency.State{}, tm.prior
	}
	return latency.State{
		AheadTokens:    float64(max(tt.aheadTokens.Load(), 0)),
		AheadPairs:     float64(max(tt.aheadPairs.Load(), 0)),
		DecodeRequests: float64(max(tt.decodes.Load(), 0)),
		DecodeKVTokens: float64(max(tt.decodeKV.Load(), 0)),
	}, *tt.theta.Load()
}

// timedState is t's queue and decode batch with the peer replicas' share pv added (the fleet's
// queue on the worker), and the Theta to score with.
func (p *KVPolicy) timedState(t kvkey.Target, pv LoadVector) (latency.State, latency.Theta) {
	st, th := p.timed.state(t)
	st.AheadTokens += float64(pv.AheadTokens)
	st.AheadPairs += float64(pv.AheadPairs)
	st.DecodeRequests += float64(pv.Decodes)
	st.DecodeKVTokens += float64(pv.DecodeKV)
	return st, th
}

func (tm *timeModel) publish(t kvkey.Target, d LoadVector) {
	if b := tm.pub.Load(); b != nil {
		b.p.LoadDelta(t, d)
	}
}

// reset returns t's fit to the prior (its worker restarted or flapped).
func (tm *timeModel) reset(t kvkey.Target) {
	tt := tm.get(t)
	if tt == nil {
		return
	}
	tt.mu.Lock()
	tt.fitter.Reset()
	tt.srcErr = [latency.NumSources]float64{}
	tt.publish()
	tt.mu.Unlock()
}

// checkRestarts resets the fit of every target whose worker reported a new
// process_start_time_seconds since the last check (a restarted worker may run another build,
// model or GPU, and its queue is gone), folds the worker's timing histograms into its window
// means and feeds the fit the window's samples (workerWindow.add).
func (p *KVPolicy) checkRestarts() {
	if p.timed == nil {
		return
	}
	// Every target with a scrape, routed to or not: a worker's own histograms are learned
	// from even when this gateway sends it nothing (other gateways, or not yet).
	p.load.mu.RLock()
	ts := make([]kvkey.Target, 0, len(p.load.targets))
	for t := range p.load.targets {
		ts = append(ts, t)
	}
	p.load.mu.RUnlock()
	for _, t := range ts {
		m, ok := p.load.Metrics(t, p.cfg.MetricsMaxAge.D())
		if !ok {
			continue
		}
		tt := p.timed.getOrCreate(t)
		if tt == nil {
			continue
		}
		if m.StartTime > 0 {
			if old := math.Float64frombits(tt.started.Swap(math.Float64bits(m.StartTime))); old != 0 && old != m.StartTime {
				p.timed.reset(t)
			}
		}
		r := windowReading{timing: m.Timing, running: m.Running, kvUsage: m.KVUsage, start: m.StartTime, gw: tt.tally(),
			decodes: float64(max(tt.decodes.Load(), 0)), decodeKV: float64(max(tt.decodeKV.Load(), 0))}
		tt.mu.Lock()
		samples := tt.worker.add(r, p.timed.params)
		if p.timed.learn && samples.n > 0 {
			w := t.String()
			for _, s := range samples.s[:samples.n] {
				if !p.timed.learnFrom[s.src] {
					continue
				}
				tt.observe(p.timed.metrics, w, s.src, s.x, s.yMs)
			}
			tt.publish()
		}
		tt.mu.Unlock()
	}
}

// timeRow is the time-cost part of one candidate's evaluation.
type timeRow struct {
	pred      latency.Prediction
	ownNoHint float64 // own prefill ms without the sibling-prefix credit
	decodes   float64
	evictMs   float64       // the eviction term
	theta     latency.Theta // the coefficients the row was scored with
}

// timeOf scores one candidate by predicted TTFT: the gateway's queue and decode accounting
// for the target, raised to what its fresh /metrics report (decodes running, requests
// waiting that the gateway did not send, each sized like waiting_weight blocks), and the
// worker's KV usage for the pressure term. Preference hints subtract the prefill they save.
func (p *KVPolicy) timeOf(r *kvRow, tr *timeRow, c Candidate, hashes []kvkey.BlockHash, promptTokens, bs float64, now time.Time) {
	var snap TargetLoad
	var m WorkerMetrics
	fresh := false
	if tl := p.load.get(c.Target); tl != nil {
		snap = tl.snapshot()
		m, fresh = tl.freshMetrics(now, p.cfg.MetricsMaxAge.D())
	}
	pv := p.peerLoad(c.Target)
	snap = snap.withPeers(pv)
	p.busyOf(r, snap, m, fresh)
	st, th := p.timedState(c.Target, pv)
	if fresh {
		st.KVUsage = m.KVUsage
		st.DecodeRequests = math.Max(st.DecodeRequests, m.Running-float64(snap.PrefillRequests))
		if unseen := math.Max(m.Waiting-float64(snap.PrefillRequests), 0); unseen > 0 {
			each := p.cfg.WaitingWeight * bs
			st.AheadTokens += unseen * each
			st.AheadPairs += unseen * latency.Pairs(each, 0)
		}
	}
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

// timeObs follows one routed attempt for the time model: it holds the attempt's share of the
// target's queue and decode batch, and feeds the measured TTFT to the target's fit. Its
// methods follow Lifecycle (FirstToken, UsageSeen, then end) and are safe for concurrent use.
type timeObs struct {
	tm     *timeModel
	tt     *targetTime
	target kvkey.Target
	worker string
	now    func() time.Time
	start  time.Time
	state  latency.State // the target at routing time
	prompt float64
	u, c   float64 // uncached and cached tokens expected at routing
	// routedCached is the chosen target's G1 overlap at routing, in whole blocks' tokens that
	// vLLM can reuse (the last prompt token is always computed), to tell the worker's count
	// apart from the index's.
	routedCached float64
	pairs        int64 // the attention pairs accounted in the queue
	predMs       float64
	itlMs        float64 // predicted inter-token time: one decode step with this request added
	stream       bool    // only a streamed response's first byte is its first token

	// events counts the response's events relayed after its first token and lastEvent is when
	// the last one was (ns after start); both lock-free (Lifecycle.Chunk, once per event).
	events    atomic.Int64
	lastEvent atomic.Int64

	mu       sync.Mutex
	stage    int32 // stagePrefill → stageDecode → stageDone
	ttftMs   float64
	fed      bool
	accountU int64
	// at the first token: the target's decode KV tokens and routed tallies, for the ITL sample
	firstKV, firstRoutedU, firstRoutedPairs int64
}

// minITLEvents is how many relayed events a streamed response needs after its first token
// before its mean inter-event time is taken as a step-time sample: vLLM streams one event per
// engine step that produced a token (vllm/entrypoints/openai/serving_chat.py,
// chat_completion_stream_generator), plus a few without one (the role, the finish reason,
// usage), whose share must stay small.
const minITLEvents = 32

// chunk counts one event relayed to the client.
func (o *timeObs) chunk() {
	o.events.Add(1)
	o.lastEvent.Store(int64(o.now().Sub(o.start)))
}

// beginTime starts the time accounting of an attempt routed by d (nil when the policy does
// not score by time or the target is beyond the model's bound).
func (p *KVPolicy) beginTime(d Decision, req *Request) *timeObs {
	if p.timed == nil {
		return nil
	}
	tt := p.timed.getOrCreate(d.Chosen.Target)
	if tt == nil {
		return nil
	}
	bs := blockSizeOf(req)
	prompt := float64(max(req.PromptTokens, len(req.BlockHashes)*bs))
	c := math.Min(float64(CachedBlocks(d)*bs), math.Max(prompt-1, 0))
	u := math.Max(prompt-c, 0)
	st, th := p.timedState(d.Chosen.Target, p.peerLoad(d.Chosen.Target))
	if m, ok := p.load.Metrics(d.Chosen.Target, p.cfg.MetricsMaxAge.D()); ok {
		st.KVUsage = m.KVUsage
	}
	o := &timeObs{tm: p.timed, tt: tt, target: d.Chosen.Target, worker: d.Chosen.Target.String(), now: p.now, start: p.now(),
		routedCached: math.Min(float64(CachedBlocks(d)), math.Floor(math.Max(prompt-1, 0)/float64(bs))) * float64(bs),
		state:        st, prompt: prompt, u: u, c: c, pairs: int64(latency.Pairs(u, c)), accountU: int64(u), stream: req.Stream,
		predMs: latency.PredictTTFT(th, p.timed.params, st, latency.Req{Uncached: u, Cached: c}).TotalMs,
		itlMs:  latency.StepMs(th, 0, 0, st.DecodeKVTokens+prompt)}
	tt.aheadTokens.Add(o.accountU)
	tt.aheadPairs.Add(o.pairs)
	tt.routedU.Add(o.accountU)
	tt.routedPairs.Add(o.pairs)
	p.timed.publish(o.target, LoadVector{AheadTokens: o.accountU, AheadPairs: o.pairs})
	p.timed.metrics.predicted(o.worker, o.predMs)
	return o
}

// firstToken measures the TTFT and moves the request from the target's queue to its decodes.
func (o *timeObs) firstToken() {
	if d, ok := o.firstTokenLocked(); ok {
		o.tm.publish(o.target, d) // outside o.mu: the publisher takes its own lock
	}
}

func (o *timeObs) firstTokenLocked() (LoadVector, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.stage != stagePrefill {
		return LoadVector{}, false
	}
	o.stage = stageDecode
	o.ttftMs = float64(o.now().Sub(o.start)) / float64(time.Millisecond)
	o.tt.aheadTokens.Add(-o.accountU)
	o.tt.aheadPairs.Add(-o.pairs)
	o.tt.decodes.Add(1)
	o.firstKV = o.tt.decodeKV.Add(int64(o.prompt))
	o.firstRoutedU, o.firstRoutedPairs = o.tt.routedU.Load(), o.tt.routedPairs.Load()
	o.events.Store(0) // events before the first token are not steps
	if o.stream {
		o.tm.metrics.observed(o.worker, o.ttftMs, o.predMs)
	}
	return LoadVector{AheadTokens: -o.accountU, AheadPairs: -o.pairs, Decodes: 1, DecodeKV: int64(o.prompt)}, true
}

// usageSeen corrects the cached and uncached tokens with the worker's own count and feeds the
// fit.
func (o *timeObs) usageSeen(u Usage) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if u.HasCached && u.CachedTokens >= 0 {
		prompt := o.prompt
		if u.PromptTokens > 0 {
			prompt = float64(u.PromptTokens)
		}
		o.c = math.Min(float64(u.CachedTokens), prompt)
		o.u = math.Max(prompt-o.c, 0)
		o.tm.metrics.cacheLost(o.worker, o.routedCached-o.c)
	}
	o.feed()
}

// end releases the attempt's accounting; a completed attempt (done) that measured a TTFT and
// has not fed the fit yet feeds it with the routing-time cache estimate.
func (o *timeObs) end(completed bool) {
	if d := o.endLocked(completed); !d.IsZero() {
		o.tm.publish(o.target, d) // outside o.mu: the publisher takes its own lock
	}
}

func (o *timeObs) endLocked(completed bool) LoadVector {
	o.mu.Lock()
	defer o.mu.Unlock()
	var d LoadVector
	switch o.stage {
	case stageDone:
		return d
	case stagePrefill:
		o.tt.aheadTokens.Add(-o.accountU)
		o.tt.aheadPairs.Add(-o.pairs)
		d = LoadVector{AheadTokens: -o.accountU, AheadPairs: -o.pairs}
	case stageDecode:
		if completed {
			o.feed()
			o.feedITL()
			o.tt.doneN.Add(1)
			o.tt.doneU.Add(int64(o.u))
			o.tt.doneC.Add(int64(o.c))
		}
		o.tt.decodes.Add(-1)
		o.tt.decodeKV.Add(-int64(o.prompt))
		d = LoadVector{Decodes: -1, DecodeKV: -int64(o.prompt)}
	}
	o.stage = stageDone
	return d
}

// expired ends the attempt without feeding the fit when LoadTracker.Expire force-releases its
// load handle (a caller that never ends its Lifecycle must not keep a target looking queued).
func (o *timeObs) expired() { o.end(false) }

// feed gives the fit one sample, once, if a TTFT was measured on a streamed response (a
// non-stream body's first byte comes after the whole generation). Samples taken while the
// worker reported its KV cache past the pressure threshold are skipped: preemption and
// admission stalls there are not what the linear model describes.
func (o *timeObs) feed() {
	if o.fed || o.stage != stageDecode || !o.tm.learn || !o.tm.learnFrom[latency.SourceTTFT] || !o.stream {
		return
	}
	o.fed = true
	if o.tm.params.KVPressureWeight > 0 && o.state.KVUsage > o.tm.params.KVPressureStart {
		return
	}
	x := latency.Features(o.state, latency.Req{Uncached: o.u, Cached: o.c}, o.tm.params)
	o.tt.mu.Lock()
	o.tt.observe(o.tm.metrics, o.worker, latency.SourceTTFT, x, o.ttftMs)
	o.tt.publish()
	o.tt.mu.Unlock()
}

// feedITL gives the fit one step-time sample from a completed streamed response: the mean
// time between the events relayed after its first token, against the prefill routed to the
// target per step meanwhile and the mean of the decode KV tokens there at its first token and
// now. Skipped with fewer than minITLEvents events and, like feed, under KV pressure.
func (o *timeObs) feedITL() {
	n := o.events.Load()
	if !o.tm.learn || !o.tm.learnFrom[latency.SourceGatewayITL] || !o.stream || n < minITLEvents {
		return
	}
	if o.tm.params.KVPressureWeight > 0 && o.state.KVUsage > o.tm.params.KVPressureStart {
		return
	}
	spanMs := float64(o.lastEvent.Load())/float64(time.Millisecond) - o.ttftMs
	steps := float64(n - 1)
	if !(spanMs > 0) {
		return
	}
	tok := float64(o.tt.routedU.Load()-o.firstRoutedU) / steps
	pairs := float64(o.tt.routedPairs.Load()-o.firstRoutedPairs) / steps
	kDec := float64(o.firstKV+o.tt.decodeKV.Load()) / 2
	x := latency.StepFeatures(tok, pairs, kDec)
	o.tt.mu.Lock()
	o.tt.observe(o.tm.metrics, o.worker, latency.SourceGatewayITL, x, spanMs/steps)
	o.tt.publish()
	o.tt.mu.Unlock()
}

// timeMetrics are the time model's histograms, by worker (worker URL#rank).
type timeMetrics struct {
	pred, obs, errs *prometheus.HistogramVec
	samples         *prometheus.CounterVec   // by worker and source
	lost            *prometheus.CounterVec   // by worker
	fitErrs         *prometheus.HistogramVec // by source
}

func newTimeMetrics(reg prometheus.Registerer) (*timeMetrics, error) {
	secs := []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80}
	m := &timeMetrics{
		pred: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_router_predicted_ttft_seconds",
			Help:    "The kv policy's predicted time to first token on the chosen worker+rank, at routing.",
			Buckets: secs,
		}, []string{"worker"}),
		obs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_router_observed_ttft_seconds",
			Help:    "Time to first token the gateway measured (routing to the worker's first response byte), kv policy.",
			Buckets: secs,
		}, []string{"worker"}),
		errs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_router_ttft_prediction_error_ratio",
			Help:    "(predicted − observed) / observed time to first token, kv policy (positive: predicted too long).",
			Buckets: []float64{-0.9, -0.5, -0.25, -0.1, 0, 0.1, 0.25, 0.5, 1, 2, 5},
		}, []string{"worker"}),
	}
	m.samples = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvgate_router_latency_fit_samples_total",
		Help: "Samples the kv policy's per-worker latency fit took, by source (gateway_ttft, worker_prefill, worker_step, gateway_itl).",
	}, []string{"worker", "source"})
	m.fitErrs = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvgate_router_latency_fit_error_ratio",
		Help:    "(predicted − measured) / measured of each latency fit sample before the fit took it, by source.",
		Buckets: []float64{-0.9, -0.5, -0.25, -0.1, 0, 0.1, 0.25, 0.5, 1, 2, 5},
	}, []string{"source"})
	m.lost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvgate_router_cache_lost_before_schedule_tokens_total",
		Help: "Prompt tokens the index held on the chosen worker+rank at routing that the worker's cached_tokens did not reuse: evicted while the request waited there (kv policy).",
	}, []string{"worker"})
	for _, c := range []prometheus.Collector{m.pred, m.obs, m.errs, m.samples, m.fitErrs, m.lost} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register router latency metrics: %w", err)
		}
	}
	return m, nil
}

func (m *timeMetrics) predicted(worker string, ms float64) {
	if m != nil {
		m.pred.WithLabelValues(worker).Observe(ms / 1000)
	}
}

func (m *timeMetrics) fitted(worker string, src latency.Source, relErr float64) {
	if m == nil {
		return
	}
	m.samples.WithLabelValues(worker, src.String()).Inc()
	m.fitErrs.WithLabelValues(src.String()).Observe(relErr)
}

// cacheLost counts the tokens the index promised at routing that the worker did not reuse.
func (m *timeMetrics) cacheLost(worker string, tokens float64) {
	if m != nil && tokens > 0 {
		m.lost.WithLabelValues(worker).Add(tokens)
	}
}

func (m *timeMetrics) observed(worker string, ms, predMs float64) {
	if m == nil {
		return
	}
	m.obs.WithLabelValues(worker).Observe(ms / 1000)
	m.errs.WithLabelValues(worker).Observe((predMs - ms) / math.Max(ms, 1))
}

// LatencyView is a target's TTFT model in GET /debug/workers (kv policy).
type LatencyView struct {
	// Theta is the coefficients scoring uses now (the fit once ready, else the prior); Fitted
	// is the fit's current estimate either way.
	Theta  map[string]float64 `json:"theta"`
	Fitted map[string]float64 `json:"fitted"`
	Prior  map[string]float64 `json:"prior"`
	// Samples is how many samples the fit took since its last reset; Ready whether it
	// replaced the prior.
	Samples int  `json:"samples"`
	Ready   bool `json:"ready"`
	// Sources are the samples by source since the last reset (gateway_ttft, worker_prefill,
	// worker_step, gateway_itl), each with the smoothed absolute relative error of its
	// predictions before the fit took them.
	Sources map[string]SourceView `json:"sources"`
	// ResidualMAD is the median absolute relative prediction error of the recent samples;
	// MeanBias their mean relative error (positive: predicted too long).
	ResidualMAD float64 `json:"residual_mad"`
	MeanBias    float64 `json:"mean_bias"`
	// PriorResidualMAD is the prior's median absolute relative error on the same samples: the
	// fit replaces the prior only while its ResidualMAD is at most this.
	PriorResidualMAD float64 `json:"prior_residual_mad"`
	// Drifts counts how often the fit saw the worker change speed and reopened its covariance.
	Drifts int `json:"drifts"`
	// WorkerTTFTMs, WorkerPrefillMs and WorkerTokensPerStep are the worker's own means over
	// recent scrape windows (vllm:time_to_first_token_seconds, vllm:request_prefill_time_seconds,
	// vllm:iteration_tokens_total), smoothed; absent until two readings differ.
	WorkerTTFTMs        *float64 `json:"worker_ttft_ms,omitempty"`
	WorkerPrefillMs     *float64 `json:"worker_prefill_ms,omitempty"`
	WorkerTokensPerStep *float64 `json:"worker_tokens_per_step,omitempty"`
	// WorkerITLMs is the worker's mean vllm:inter_token_latency_seconds over recent windows.
	WorkerITLMs *float64 `json:"worker_itl_ms,omitempty"`
	// The gateway's queue and decode accounting for the target.
	AheadTokens    float64 `json:"ahead_tokens"`
	DecodeRequests float64 `json:"decode_requests"`
	DecodeKVTokens float64 `json:"decode_kv_tokens"`
}

// SourceView is one source of a latency fit's samples (LatencyView.Sources).
type SourceView struct {
	Samples int     `json:"samples"`
	Error   float64 `json:"error"`
}

func thetaMap(th latency.Theta) map[string]float64 {
	names := latency.FeatureNames()
	out := make(map[string]float64, len(th))
	for i, v := range th {
		out[names[i]] = v
	}
	return out
}

// latencyView is t's model for the debug view (nil when the policy does not score by time).
func (p *KVPolicy) latencyView(t kvkey.Target) *LatencyView {
	if p.timed == nil {
		return nil
	}
	st, th := p.timed.state(t)
	v := &LatencyView{Theta: thetaMap(th), Fitted: thetaMap(p.timed.prior), Prior: thetaMap(p.timed.prior),
		AheadTokens: st.AheadTokens, DecodeRequests: st.DecodeRequests, DecodeKVTokens: st.DecodeKVTokens}
	if tt := p.timed.get(t); tt != nil {
		tt.mu.Lock()
		v.Fitted = thetaMap(tt.fitter.Fitted())
		v.Samples, v.Ready = tt.fitter.Samples(), tt.fitter.Ready()
		v.ResidualMAD, v.MeanBias, v.Drifts = tt.fitter.ResidualMAD(), tt.fitter.MeanBias(), tt.fitter.Drifts()
		v.PriorResidualMAD = tt.fitter.PriorResidualMAD()
		v.Sources = make(map[string]SourceView, latency.NumSources)
		for i, n := range tt.fitter.SamplesBySource() {
			v.Sources[latency.Source(i).String()] = SourceView{Samples: n, Error: tt.srcErr[i]}
		}
		w := tt.worker
		tt.mu.Unlock()
		if w.hasTTFT {
			v.WorkerTTFTMs = &w.ttftMs
		}
		if w.hasPrefil {
			v.WorkerPrefillMs = &w.prefillMs
		}
		if w.hasSteps {
			v.WorkerTokensPerStep = &w.tokensPerStep
		}
		if w.hasITL {
			v.WorkerITLMs = &w.itlMs
		}
	}
	return v
}
