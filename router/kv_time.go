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
	params      latency.Params
	prior       latency.Theta
	fit         latency.FitConfig
	learn       bool
	fleetWeight float64
	metrics     *timeMetrics            // nil: no metrics registered
	pub         atomic.Pointer[loadPub] // the fleet's load sync, when clustered

	mu      sync.RWMutex
	targets map[kvkey.Target]*targetTime
}

// targetTime is one target's queue, decode batch and fit.
type targetTime struct {
	aheadTokens atomic.Int64 // uncached prompt tokens routed here before their first token
	aheadPairs  atomic.Int64 // their attention pairs
	decodes     atomic.Int64 // requests past their first token and not done
	decodeKV    atomic.Int64 // those requests' prompt tokens
	theta       atomic.Pointer[latency.Theta]
	started     atomic.Uint64 // float64 bits of the worker's last seen process start time

	mu     sync.Mutex // guards fitter, worker, live
	fitter *latency.Fitter
	worker workerWindow
	live   map[*timeObs]struct{} // attempts not ended, for expire
}

// workerWindow follows what the worker's own timing histograms say, window by window (between
// two sweeps): mean TTFT and prefill time, and tokens per engine step, each smoothed. It is
// shown beside the fit as a cross-check of the gateway's own measurements (vLLM's TTFT starts
// at tokenization, the gateway's at routing), and is not fitted.
type workerWindow struct {
	last               WorkerTiming
	seen               bool
	ttftMs, prefillMs  float64
	tokensPerStep      float64
	hasTTFT, hasPrefil bool
	hasSteps           bool
}

// workerWindowRate is the smoothing rate of the worker window means.
const workerWindowRate = 0.3

// add folds a new cumulative reading into the window means; a reading whose counts went down
// (the worker restarted) starts over.
func (w *workerWindow) add(t WorkerTiming) {
	if !w.seen || t.TTFTCount < w.last.TTFTCount || t.PrefillCount < w.last.PrefillCount || t.Iterations < w.last.Iterations {
		w.last, w.seen = t, true
		return
	}
	ewma := func(v *float64, has *bool, x float64) {
		if !*has {
			*v, *has = x, true
			return
		}
		*v += workerWindowRate * (x - *v)
	}
	if dc := t.TTFTCount - w.last.TTFTCount; dc > 0 {
		ewma(&w.ttftMs, &w.hasTTFT, 1000*(t.TTFTSum-w.last.TTFTSum)/dc)
	}
	if dc := t.PrefillCount - w.last.PrefillCount; dc > 0 {
		ewma(&w.prefillMs, &w.hasPrefil, 1000*(t.PrefillSum-w.last.PrefillSum)/dc)
	}
	if dc := t.Iterations - w.last.Iterations; dc > 0 {
		ewma(&w.tokensPerStep, &w.hasSteps, (t.IterTokensSum-w.last.IterTokensSum)/dc)
	}
	w.last = t
}

func newTimeModel(c routerconfig.Latency) (*timeModel, error) {
	fc := latency.DefaultFitConfig()
	fc.Lambda, fc.ReadySamples = c.Forgetting, c.ReadySamples
	if err := fc.Validate(); err != nil {
		return nil, fmt.Errorf("latency: %w", err)
	}
	tm := &timeModel{
		params: latency.Params{MaxBatchedTokens: c.MaxNumBatchedTokens, KVPressureStart: c.KVPressureStart,
			KVPressureWeight: c.KVPressureWeight},
		prior: latency.Theta{c.FrontendMs, c.PrefillMsPerToken, c.AttentionMsPerPair, c.StepMs, c.StepMsPerKVToken},
		fit:   fc, learn: c.Learn, fleetWeight: c.FleetWeight,
		targets: make(map[kvkey.Target]*targetTime),
	}
	if !tm.prior.Valid() {
		return nil, fmt.Errorf("latency: prior profile %v must be finite and nonnegative", tm.prior)
	}
	return tm, nil
}

func (tm *timeModel) get(t kvkey.Target) *targetTime {
	tm.mu.RLock()
	tt := tm.targets[t]
	tm.mu.RUnlock()
	return tt
}

// getOrCreate returns t's state, or nil when the model already tracks maxTimedTargets.
func (tm *timeModel) getOrCreate(t kvkey.Target) *targetTime {
	if tt := tm.get(t); tt != nil {
		return tt
	}
	tm.mu.Lock()
	defer tm.mu.Unlock()
	if tt := tm.targets[t]; tt != nil {
		return tt
	}
	if len(tm.targets) >= maxTimedTargets {
		return nil
	}
	f, err := latency.NewFitter(tm.prior, tm.fit)
	if err != nil { // the config was validated in newTimeModel
		return nil
	}
	tt := &targetTime{fitter: f, live: make(map[*timeObs]struct{})}
	th := tm.prior
	tt.theta.Store(&th)
	tm.targets[t] = tt
	return tt
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
	th := tt.fitter.Theta()
	tt.mu.Unlock()
	tt.theta.Store(&th)
}

// checkRestarts resets the fit of every target whose worker reported a new
// process_start_time_seconds since the last check (a restarted worker may run another build,
// model or GPU, and its queue is gone), and folds the worker's timing histograms into its
// window means.
func (p *KVPolicy) checkRestarts() {
	if p.timed == nil {
		return
	}
	p.timed.mu.RLock()
	ts := make([]kvkey.Target, 0, len(p.timed.targets))
	for t := range p.timed.targets {
		ts = append(ts, t)
	}
	p.timed.mu.RUnlock()
	for _, t := range ts {
		m, ok := p.load.Metrics(t, p.cfg.MetricsMaxAge.D())
		if !ok {
			continue
		}
		tt := p.timed.get(t)
		tt.mu.Lock()
		tt.worker.add(m.Timing)
		tt.mu.Unlock()
		if m.StartTime <= 0 {
			continue
		}
		if old := math.Float64frombits(tt.started.Swap(math.Float64bits(m.StartTime))); old != 0 && old != m.StartTime {
			p.timed.reset(t)
		}
	}
}

// timeRow is the time-cost part of one candidate's evaluation.
type timeRow struct {
	pred      latency.Prediction
	ownNoHint float64 // own prefill ms without the sibling-prefix credit
	decodes   float64
}

// timeOf scores one candidate by predicted TTFT: the gateway's queue and decode accounting
// for the target, raised to what its fresh /metrics report (decodes running, requests
// waiting that the gateway did not send, each sized like waiting_weight blocks), and the
// worker's KV usage for the pressure term. Preference hints subtract the prefill they save.
func (p *KVPolicy) timeOf(r *kvRow, tr *timeRow, c Candidate, promptTokens, bs float64, now time.Time) {
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
	u := math.Min(math.Max(r.prefill*bs, 1), math.Max(promptTokens, 1))
	uNo := math.Min(math.Max(r.noHint*bs, 1), math.Max(promptTokens, 1))
	pred := latency.PredictTTFT(th, p.timed.params, st, latency.Req{Uncached: u, Cached: math.Max(promptTokens-u, 0)})
	predNo := latency.PredictTTFT(th, p.timed.params, st, latency.Req{Uncached: uNo, Cached: math.Max(promptTokens-uNo, 0)})
	hintMs := 0.0
	if r.prefHint > 0 {
		hintMs = latency.PrefillMs(th, r.prefHint*bs, math.Max(promptTokens-u, 0))
	}
	*tr = timeRow{pred: pred, ownNoHint: predNo.OwnMs, decodes: st.DecodeRequests}
	r.load = pred.QueuedMs + pred.DecodeMs + pred.PressureMs
	r.cost = pred.TotalMs - hintMs
	r.costNoHnt = predNo.TotalMs
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
	pairs  int64   // the attention pairs accounted in the queue
	predMs float64
	stream bool // only a streamed response's first byte is its first token

	mu       sync.Mutex
	stage    int32 // stagePrefill → stageDecode → stageDone
	ttftMs   float64
	fed      bool
	accountU int64
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
		state: st, prompt: prompt, u: u, c: c, pairs: int64(latency.Pairs(u, c)), accountU: int64(u), stream: req.Stream,
		predMs: latency.PredictTTFT(th, p.timed.params, st, latency.Req{Uncached: u, Cached: c}).TotalMs}
	tt.aheadTokens.Add(o.accountU)
	tt.aheadPairs.Add(o.pairs)
	p.timed.publish(o.target, LoadVector{AheadTokens: o.accountU, AheadPairs: o.pairs})
	tt.mu.Lock()
	tt.live[o] = struct{}{}
	tt.mu.Unlock()
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
	o.tt.decodeKV.Add(int64(o.prompt))
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
		}
		o.tt.decodes.Add(-1)
		o.tt.decodeKV.Add(-int64(o.prompt))
		d = LoadVector{Decodes: -1, DecodeKV: -int64(o.prompt)}
	}
	o.stage = stageDone
	o.tt.mu.Lock()
	delete(o.tt.live, o)
	o.tt.mu.Unlock()
	return d
}

// expire ends, without feeding the fit, every attempt that began before cutoff and is still
// open (a safety net like LoadTracker.Expire: a caller that never ends its Lifecycle must not
// keep a target looking queued); it returns how many it ended.
func (tm *timeModel) expire(cutoff time.Time) int {
	tm.mu.RLock()
	tts := make([]*targetTime, 0, len(tm.targets))
	for _, tt := range tm.targets {
		tts = append(tts, tt)
	}
	tm.mu.RUnlock()
	n := 0
	for _, tt := range tts {
		var stale []*timeObs
		tt.mu.Lock()
		for o := range tt.live {
			if o.start.Before(cutoff) {
				stale = append(stale, o)
			}
		}
		tt.mu.Unlock()
		for _, o := range stale {
			o.end(false)
			n++
		}
	}
	return n
}

// feed gives the fit one sample, once, if a TTFT was measured on a streamed response (a
// non-stream body's first byte comes after the whole generation). Samples taken while the
// worker reported its KV cache past the pressure threshold are skipped: preemption and
// admission stalls there are not what the linear model describes.
func (o *timeObs) feed() {
	if o.fed || o.stage != stageDecode || !o.tm.learn || !o.stream {
		return
	}
	o.fed = true
	if o.tm.params.KVPressureWeight > 0 && o.state.KVUsage > o.tm.params.KVPressureStart {
		return
	}
	x := latency.Features(o.state, latency.Req{Uncached: o.u, Cached: o.c}, o.tm.params)
	o.tt.mu.Lock()
	_, err := o.tt.fitter.Observe(x, o.ttftMs)
	th := o.tt.fitter.Theta()
	o.tt.mu.Unlock()
	if err == nil {
		o.tt.theta.Store(&th)
	}
}

// timeMetrics are the time model's histograms, by worker (worker URL#rank).
type timeMetrics struct {
	pred, obs, errs *prometheus.HistogramVec
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
	for _, c := range []prometheus.Collector{m.pred, m.obs, m.errs} {
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
	// Samples is how many observed TTFTs the fit took since its last reset; Ready whether it
	// replaced the prior.
	Samples int  `json:"samples"`
	Ready   bool `json:"ready"`
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
	// The gateway's queue and decode accounting for the target.
	AheadTokens    float64 `json:"ahead_tokens"`
	DecodeRequests float64 `json:"decode_requests"`
	DecodeKVTokens float64 `json:"decode_kv_tokens"`
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
	}
	return v
}
