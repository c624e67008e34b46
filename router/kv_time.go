package router

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

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

	mu     sync.Mutex // guards fitter, worker, srcErr, ratios' samples
	fitter *latency.Fitter
	worker workerWindow
	srcErr [latency.NumSources]float64 // smoothed |relative error| of each source's samples
	ratios ttftRatios                  // measured over predicted TTFT, recent (kv_time_ratio.go)
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
	tt.ratios.reset()
	tt.publish()
	tt.mu.Unlock()
}
