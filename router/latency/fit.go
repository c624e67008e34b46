package latency

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// FitConfig configures a Fitter.
type FitConfig struct {
	// Lambda is the RLS forgetting factor in (0, 1]: the effective memory is about 1/(1−λ)
	// samples (0.997: ~330).
	Lambda float64
	// ReadySamples is how many accepted samples, with spread in the prefill tokens, the fit
	// needs before Theta returns it instead of the prior.
	ReadySamples int
	// PriorVariance is the prior covariance of each standardized coefficient (the warm start's
	// confidence; larger learns faster from few samples).
	PriorVariance float64
	// FloorMs is the smallest TTFT used to turn absolute errors into relative ones.
	FloorMs float64
	// HuberK scales the Huber threshold: residuals beyond HuberK·MAD get a proportionally
	// smaller gain.
	HuberK float64
}

// DefaultFitConfig returns λ 0.997, ready after 20 samples, prior variance 1, a 25 ms floor
// and a Huber threshold of 3·MAD.
func DefaultFitConfig() FitConfig {
	return FitConfig{Lambda: 0.997, ReadySamples: 20, PriorVariance: 1, FloorMs: 25, HuberK: 3}
}

// Validate names the first invalid field.
func (c FitConfig) Validate() error {
	switch {
	case !(c.Lambda > 0 && c.Lambda <= 1):
		return fmt.Errorf("lambda must be in (0, 1], got %v", c.Lambda)
	case c.ReadySamples < 1:
		return fmt.Errorf("ready samples must be at least 1, got %d", c.ReadySamples)
	case !(c.PriorVariance > 0) || math.IsInf(c.PriorVariance, 0):
		return fmt.Errorf("prior variance must be finite and > 0, got %v", c.PriorVariance)
	case !(c.FloorMs > 0) || math.IsInf(c.FloorMs, 0):
		return fmt.Errorf("floor must be finite and > 0 ms, got %v", c.FloorMs)
	case !(c.HuberK > 0) || math.IsInf(c.HuberK, 0):
		return fmt.Errorf("huber k must be finite and > 0, got %v", c.HuberK)
	}
	return nil
}

// residualWindow is how many recent relative residuals the Huber threshold and the reported
// error statistics are taken over.
const residualWindow = 64

// scaleRate is the rate of the running feature scales (RMS, exponentially weighted).
const scaleRate = 0.02

// minHuberDelta bounds the Huber threshold below (relative error), so a run of perfect
// predictions does not make every later sample an outlier.
const minHuberDelta = 0.05

// Fitter learns one target's Theta online: recursive least squares with forgetting on
// standardized features, weighted to relative errors (each sample is divided by max(y,
// FloorMs)), with a Huber-scaled gain against outliers and every coefficient kept nonnegative
// by projecting, in the estimate's own metric, onto the nonnegative orthant. It starts from a
// prior Theta, which it also returns until it is ready. Not safe for concurrent use.
type Fitter struct {
	cfg   FitConfig
	prior Theta
	th    Theta // raw units
	scale [NumFeatures]float64
	ms    [NumFeatures]float64 // running mean squares behind scale
	seen  [NumFeatures]bool
	p     [NumFeatures][NumFeatures]float64 // covariance of the standardized coefficients
	n     int
	lo    float64 // prefill tokens: smallest and largest accepted (TTFT and prefill samples)
	hi    float64
	// spread reports whether lo and hi hold a sample yet.
	spread bool
	resid  [residualWindow]float64 // relative residuals before each update (prediction errors)
	// priorResid are the prior's relative errors on the same samples, for Ready.
	priorResid [residualWindow]float64
	rn         int
	// beats is the last comparison of the two windows (Ready): the fit's errors at most the
	// prior's. It is kept while a window restarted by a drift is too short to compare.
	beats bool
	// drifts counts covariance reopenings (detectDrift).
	drifts int
	// bySource counts the accepted samples per Source since the last Reset.
	bySource [NumSources]int
}

// NewFitter returns a fitter at prior. The prior must be Valid and cfg valid.
func NewFitter(prior Theta, cfg FitConfig) (*Fitter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("latency fit: %w", err)
	}
	if !prior.Valid() {
		return nil, fmt.Errorf("latency fit: prior %v must be finite and nonnegative", prior)
	}
	f := &Fitter{cfg: cfg, prior: prior}
	f.Reset()
	return f, nil
}

// Reset returns the fit to the prior (a worker restarted: what was learned may not hold).
func (f *Fitter) Reset() {
	f.th = f.prior
	f.n, f.rn, f.lo, f.hi, f.drifts, f.beats = 0, 0, 0, 0, 0, false
	f.bySource, f.spread = [NumSources]int{}, false
	for i := range f.p {
		f.scale[i], f.ms[i], f.seen[i] = 1, 0, false
		for j := range f.p[i] {
			f.p[i][j] = 0
		}
		f.p[i][i] = f.cfg.PriorVariance
	}
}

// Samples is how many samples the fit accepted since the last Reset.
func (f *Fitter) Samples() int { return f.n }

// SamplesBySource is how many samples of each Source the fit accepted since the last Reset.
func (f *Fitter) SamplesBySource() [NumSources]int { return f.bySource }

// minCompare is how many recent samples Ready needs to compare the fit with the prior; with
// fewer since the last Reset the sample count alone decides, and right after a drift
// restarted the window the last comparison stands.
const minCompare = 8

// Ready reports whether the fit has enough samples, with spread, to replace the prior, and
// predicts the recent samples better than the prior does: its median absolute relative
// error before each update (out of sample, like the prior's) is at most the prior's on the
// same samples. A prior that already matches the worker keeps scoring it; a fit from a few
// noisy samples does not replace it until it is better.
func (f *Fitter) Ready() bool {
	if f.n < f.cfg.ReadySamples || f.hi < 1.5*f.lo || f.hi <= 0 {
		return false
	}
	return f.n < minCompare || f.beats
}

// Fitted returns the current estimate, ready or not.
func (f *Fitter) Fitted() Theta { return f.th }

// Theta returns the estimate when Ready, else the prior.
func (f *Fitter) Theta() Theta {
	if f.Ready() {
		return f.th
	}
	return f.prior
}

// Prior returns the warm start.
func (f *Fitter) Prior() Theta { return f.prior }

// ErrBadSample is wrapped by Observe's error for a sample it rejects.
var ErrBadSample = errors.New("latency: bad sample")

// Observe feeds one measured TTFT yMs for features x (Features) and returns the fit's
// relative prediction error (prediction − y)/max(y, floor) before the update. Samples with a
// non-finite or negative value, or without the constant feature, are rejected.
func (f *Fitter) Observe(x [NumFeatures]float64, yMs float64) (float64, error) {
	return f.ObserveFrom(SourceTTFT, x, yMs)
}

// ObserveFrom is Observe for a sample from src: a TTFT (Features, with the constant feature
// 1), a worker's prefill time (PrefillFeatures) or a step time (StepFeatures), both without
// it. All sources update the same coefficients; only TTFT and prefill samples count toward
// the prompt-size spread Ready asks for.
func (f *Fitter) ObserveFrom(src Source, x [NumFeatures]float64, yMs float64) (float64, error) {
	if src < 0 || src >= NumSources {
		return 0, fmt.Errorf("%w: unknown source %d", ErrBadSample, src)
	}
	if !(yMs >= 0) || math.IsInf(yMs, 0) || x[FFrontend] != src.constantFeature() {
		return 0, fmt.Errorf("%w: %s %v ms, features %v", ErrBadSample, src, yMs, x)
	}
	for _, v := range x {
		if !(v >= 0) || math.IsInf(v, 0) {
			return 0, fmt.Errorf("%w: features %v", ErrBadSample, x)
		}
	}
	w := math.Max(yMs, f.cfg.FloorMs)
	relErr := (Dot(f.th, x) - yMs) / w
	var z [NumFeatures]float64
	for i := range x {
		z[i] = x[i] / w
	}
	e := -relErr // the residual y − xᵀθ in relative units, whatever the feature scales
	// Huber-scaled gain: a residual beyond δ moves the estimate (and shrinks its covariance)
	// only δ/|e| of the way an ordinary RLS step would; it does not move the feature scales.
	g := 1.0
	if f.rn >= 8 {
		delta := math.Max(f.cfg.HuberK*f.mad(), minHuberDelta)
		if a := math.Abs(e); a > delta {
			g = delta / a
		}
	}
	if g == 1 {
		f.rescale(z)
	}
	var zs, ths [NumFeatures]float64
	for i := range z {
		zs[i] = z[i] / f.scale[i]
		ths[i] = f.th[i] * f.scale[i]
	}
	var pz [NumFeatures]float64
	for i := range pz {
		for j := range zs {
			pz[i] += f.p[i][j] * zs[j]
		}
	}
	denom := f.cfg.Lambda + dot(zs, pz)
	var k [NumFeatures]float64
	for i := range k {
		k[i] = g * pz[i] / denom
		ths[i] += k[i] * e
	}
	for i := range f.p {
		for j := range f.p[i] {
			f.p[i][j] = (f.p[i][j] - k[i]*pz[j]) / f.cfg.Lambda
		}
	}
	f.symmetrizeAndCap()
	ths = project(ths, &f.p)
	for i := range ths {
		f.th[i] = ths[i] / f.scale[i]
	}
	f.resid[f.rn%residualWindow] = relErr
	f.priorResid[f.rn%residualWindow] = (Dot(f.prior, x) - yMs) / w
	f.rn++
	f.n++
	if n := min(f.rn, residualWindow); n >= minCompare {
		f.beats = medianAbs(f.resid[:n]) <= medianAbs(f.priorResid[:n])
	}
	f.detectDrift()
	f.bySource[src]++
	if t := x[FTokens]; src.spreads() && !f.spread {
		f.lo, f.hi, f.spread = t, t, true
	} else if src.spreads() {
		f.lo, f.hi = math.Min(f.lo, t), math.Max(f.hi, t)
	}
	return relErr, nil
}

// rescale moves the running feature scales toward z and carries the covariance along, so the
// raw estimate is unchanged by the change of units.
func (f *Fitter) rescale(z [NumFeatures]float64) {
	var ratio [NumFeatures]float64
	for i := range z {
		ratio[i] = 1
		if z[i] == 0 {
			continue
		}
		if !f.seen[i] {
			// The first value sets the unit; the prior covariance is already in standard units.
			f.ms[i], f.seen[i] = z[i]*z[i], true
			f.scale[i] = math.Abs(z[i])
			continue
		} else {
			f.ms[i] += scaleRate * (z[i]*z[i] - f.ms[i])
		}
		s := math.Sqrt(f.ms[i])
		if s > 0 {
			ratio[i] = s / f.scale[i]
			f.scale[i] = s
		}
	}
	for i := range f.p {
		for j := range f.p[i] {
			f.p[i][j] *= ratio[i] * ratio[j]
		}
	}
}

// symmetrizeAndCap keeps P symmetric and stops covariance wind-up: a coefficient that gets no
// excitation would otherwise see its variance grow by 1/λ per sample without bound. Each
// diagonal entry is capped at the prior variance by scaling its row and column.
func (f *Fitter) symmetrizeAndCap() {
	for i := range f.p {
		for j := i + 1; j < NumFeatures; j++ {
			m := (f.p[i][j] + f.p[j][i]) / 2
			f.p[i][j], f.p[j][i] = m, m
		}
	}
	for i := range f.p {
		if d := f.p[i][i]; d > f.cfg.PriorVariance {
			s := math.Sqrt(f.cfg.PriorVariance / d)
			for j := range f.p {
				f.p[i][j] *= s
				f.p[j][i] *= s
			}
		} else if !(d > 0) {
			for j := range f.p {
				f.p[i][j], f.p[j][i] = 0, 0
			}
			f.p[i][i] = 1e-9
		}
	}
}

// driftWindow is how many recent residuals the drift test looks at, and driftBias the median
// relative error beyond which the worker is taken to have changed speed.
const (
	driftWindow = 32
	driftBias   = 0.15
)

// detectDrift reopens the covariance when the recent residuals are biased one way: a worker
// that became slower (or faster) leaves a median relative error far from zero, which
// forgetting alone would take ~1/(1−λ) samples to absorb. The estimate is kept; its
// covariance goes back to the prior's, and the residual window restarts so the Huber
// threshold is taken from the new regime. The median keeps a few outliers from triggering it.
func (f *Fitter) detectDrift() {
	if f.rn < driftWindow {
		return
	}
	var buf [driftWindow]float64
	for i := range buf {
		buf[i] = f.resid[(f.rn-1-i)%residualWindow]
	}
	slices.Sort(buf[:])
	med := (buf[driftWindow/2-1] + buf[driftWindow/2]) / 2
	if math.Abs(med) <= driftBias {
		return
	}
	for i := range f.p {
		for j := range f.p[i] {
			f.p[i][j] = 0
		}
		f.p[i][i] = f.cfg.PriorVariance
	}
	f.rn = 0
	f.drifts++
}

// Drifts is how many times the fit saw the worker change speed and reopened its covariance.
func (f *Fitter) Drifts() int { return f.drifts }

// mad is the median absolute relative residual over the window.
func (f *Fitter) mad() float64 {
	return medianAbs(f.resid[:min(f.rn, residualWindow)])
}

// medianAbs is the median of |v| over at most residualWindow values (0 for none).
func medianAbs(v []float64) float64 {
	n := min(len(v), residualWindow)
	if n == 0 {
		return 0
	}
	var buf [residualWindow]float64
	for i := 0; i < n; i++ {
		buf[i] = math.Abs(v[i])
	}
	s := buf[:n]
	slices.Sort(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// ResidualMAD is the median absolute relative prediction error over the recent samples (0
// before any).
func (f *Fitter) ResidualMAD() float64 { return f.mad() }

// PriorResidualMAD is the prior's median absolute relative error over the same recent samples
// as ResidualMAD (Ready compares the two).
func (f *Fitter) PriorResidualMAD() float64 {
	return medianAbs(f.priorResid[:min(f.rn, residualWindow)])
}

// MeanBias is the mean relative prediction error over the recent samples (positive: the fit
// predicted too long).
func (f *Fitter) MeanBias() float64 {
	n := min(f.rn, residualWindow)
	if n == 0 {
		return 0
	}
	s := 0.0
	for i := 0; i < n; i++ {
		s += f.resid[i]
	}
	return s / float64(n)
}

func dot(a, b [NumFeatures]float64) float64 {
	s := 0.0
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// project returns the point of the nonnegative orthant nearest th in the metric P⁻¹ (the
// estimate's own uncertainty): with the active set A pinned at 0, the free coefficients move
// by −P_FA·P_AA⁻¹·th_A, the conditional mean given th_A = 0. Coefficients that turn negative
// join A until none does (at most NumFeatures rounds).
func project(th [NumFeatures]float64, p *[NumFeatures][NumFeatures]float64) [NumFeatures]float64 {
	var active [NumFeatures]bool
	out := th
	for round := 0; round < NumFeatures; round++ {
		grew := false
		for i := range out {
			if !active[i] && out[i] < 0 {
				active[i], grew = true, true
			}
		}
		if !grew {
			return out
		}
		var idx []int
		for i := range active {
			if active[i] {
				idx = append(idx, i)
			}
		}
		var a [NumFeatures][NumFeatures]float64
		var b [NumFeatures]float64
		for r, i := range idx {
			for c, j := range idx {
				a[r][c] = p[i][j]
			}
			b[r] = th[i]
		}
		sol, ok := solve(a, b, len(idx))
		for i := range out {
			switch {
			case active[i]:
				out[i] = 0
			case ok:
				v := th[i]
				for r, j := range idx {
					v -= p[i][j] * sol[r]
				}
				out[i] = v
			default:
				out[i] = th[i]
			}
		}
	}
	for i := range out { // unreachable in exact arithmetic; keep the promise anyway
		out[i] = math.Max(out[i], 0)
	}
	return out
}

// solve solves the n×n system a·x = b by Gaussian elimination with partial pivoting.
func solve(a [NumFeatures][NumFeatures]float64, b [NumFeatures]float64, n int) ([NumFeatures]float64, bool) {
	var x [NumFeatures]float64
	for c := 0; c < n; c++ {
		piv := c
		for r := c + 1; r < n; r++ {
			if math.Abs(a[r][c]) > math.Abs(a[piv][c]) {
				piv = r
			}
		}
		if math.Abs(a[piv][c]) < 1e-300 {
			return x, false
		}
		a[c], a[piv] = a[piv], a[c]
		b[c], b[piv] = b[piv], b[c]
		for r := c + 1; r < n; r++ {
			m := a[r][c] / a[c][c]
			for k := c; k < n; k++ {
				a[r][k] -= m * a[c][k]
			}
			b[r] -= m * b[c]
		}
	}
	for r := n - 1; r >= 0; r-- {
		v := b[r]
		for k := r + 1; k < n; k++ {
			v -= a[r][k] * x[k]
		}
		x[r] = v / a[r][r]
	}
	return x, true
}
