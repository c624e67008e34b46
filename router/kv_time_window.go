package router

import (
	"math"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router/latency"
)

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
