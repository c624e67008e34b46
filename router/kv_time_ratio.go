package router

import (
	"math"
	"slices"
	"sync/atomic"

	"github.com/kvgate/kvgate/kvkey"
)

// ttftRatios is one target's recent ratios of the measured TTFT to the time model's
// prediction at routing (streamed responses only: a non-stream body's first byte comes after
// the whole generation), the last ratioWindow of them. Their ratioQuantile is how far the
// model falls short there (Saturation.TTFTRatio): flow control scales its first-token
// predictions by it before promising a deadline (flowcontrol/deadline.go). A streamed attempt
// that ended without a first token after longer than predicted adds its time so far (a lower
// bound of its ratio). Predictions under minRatioPredMs are left out: their ratio is the worker's step jitter, while a deadline is
// at stake only for a prefill of seconds. add and reset need targetTime.mu; quantile is
// lock-free.
type ttftRatios struct {
	buf [ratioWindow]float64
	n   int           // samples since the last reset
	q   atomic.Uint64 // float64 bits of the window's quantile (0: fewer than ratioMinSamples)
}

const (
	// ratioWindow bounds the samples kept per target.
	ratioWindow = 64
	// ratioQuantile is the quantile of the window reported: a high one, since a deadline is
	// missed by the predictions that fell short, not by the typical one.
	ratioQuantile = 0.9
	// ratioMinSamples is how many samples the window needs before it reports anything.
	ratioMinSamples = 8
	// minRatioPredMs is the smallest prediction whose ratio is taken.
	minRatioPredMs = 500
)

// add takes one attempt's measured and predicted TTFT in ms.
func (r *ttftRatios) add(measuredMs, predMs float64) {
	v := measuredMs / predMs
	if !(predMs >= minRatioPredMs) || !(v > 0) || math.IsInf(v, 0) {
		return
	}
	r.buf[r.n%ratioWindow] = v
	r.n++
	k := min(r.n, ratioWindow)
	if k < ratioMinSamples {
		return
	}
	var s [ratioWindow]float64
	copy(s[:k], r.buf[:k])
	slices.Sort(s[:k])
	r.q.Store(math.Float64bits(s[int(math.Ceil(ratioQuantile*float64(k)))-1]))
}

// quantile is the window's ratioQuantile (nearest rank), 0 before ratioMinSamples samples.
func (r *ttftRatios) quantile() float64 { return math.Float64frombits(r.q.Load()) }

// reset forgets the samples (the worker restarted: its speed may have changed).
func (r *ttftRatios) reset() {
	r.n = 0
	r.q.Store(0)
}

// ttftRatio is t's ttftRatios quantile (0 when t has no state).
func (tm *timeModel) ttftRatio(t kvkey.Target) float64 {
	if tt := tm.get(t); tt != nil {
		return tt.ratios.quantile()
	}
	return 0
}
