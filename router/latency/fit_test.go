package latency

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

var testParams = Params{MaxBatchedTokens: 8192}

// sample draws a routing-time state and request over the ranges an agentic fleet sees.
func sample(r *rand.Rand) [NumFeatures]float64 {
	s := State{}
	if r.Float64() < 0.6 {
		s.AheadTokens = r.Float64() * 30000
		s.AheadPairs = s.AheadTokens * r.Float64() * 20000
	}
	s.DecodeRequests = float64(r.IntN(96))
	s.DecodeKVTokens = s.DecodeRequests * r.Float64() * 40000
	req := Req{Uncached: 50 + r.Float64()*16000, Cached: r.Float64() * 60000 * float64(r.IntN(2))}
	return Features(s, req, testParams)
}

// noisy returns xᵀθ with multiplicative noise of the given relative spread.
func noisy(r *rand.Rand, th Theta, x [NumFeatures]float64, rel float64) float64 {
	return Dot(th, x) * math.Max(0.05, 1+rel*r.NormFloat64())
}

// relError is the mean absolute relative error of th against truth on fresh samples.
func relError(r *rand.Rand, th, truth Theta) float64 {
	sum := 0.0
	const n = 500
	for i := 0; i < n; i++ {
		x := sample(r)
		y := Dot(truth, x)
		sum += math.Abs(Dot(th, x)-y) / math.Max(y, 25)
	}
	return sum / n
}

var truth = Theta{12, 0.015, 7e-7, 4, 2.5e-5}

func TestFitterConverges(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prior   Theta
		noise   float64
		samples int
		bound   float64
	}{
		{"prior 2x too fast", Theta{6, 0.0075, 3.5e-7, 2, 1.25e-5}, 0.05, 300, 0.06},
		{"prior 3x too slow", Theta{36, 0.045, 2.1e-6, 12, 7.5e-5}, 0.05, 300, 0.06},
		{"prior all wrong shape", Theta{100, 0.001, 5e-6, 0, 0}, 0.05, 400, 0.08},
		{"noisy", Theta{10, 0.02, 1e-6, 2, 3e-5}, 0.15, 400, 0.08},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, 11))
			f, err := NewFitter(tc.prior, DefaultFitConfig())
			if err != nil {
				t.Fatal(err)
			}
			before := relError(r, f.Fitted(), truth)
			for i := 0; i < tc.samples; i++ {
				x := sample(r)
				if _, err := f.Observe(x, noisy(r, truth, x, tc.noise)); err != nil {
					t.Fatal(err)
				}
			}
			after := relError(r, f.Theta(), truth)
			if !f.Ready() {
				t.Fatalf("not ready after %d samples", tc.samples)
			}
			if after > tc.bound {
				t.Fatalf("mean relative error %.3f after %d samples (prior %.3f), want <= %.3f; theta %v", after, tc.samples, before, tc.bound, f.Theta())
			}
		})
	}
}

func TestFitterTracksSlowdown(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	f, _ := NewFitter(truth, DefaultFitConfig())
	for i := 0; i < 300; i++ {
		x := sample(r)
		_, _ = f.Observe(x, noisy(r, truth, x, 0.05))
	}
	var slow Theta
	for i := range truth {
		slow[i] = 2 * truth[i]
	}
	if e := relError(r, f.Theta(), slow); e < 0.3 {
		t.Fatalf("before the slowdown the fit is already %.3f from the slow truth", e)
	}
	for i := 0; i < 300; i++ {
		x := sample(r)
		_, _ = f.Observe(x, noisy(r, slow, x, 0.05))
	}
	if e := relError(r, f.Theta(), slow); e > 0.08 {
		t.Fatalf("300 samples after a 2x slowdown the fit is %.3f off, want <= 0.08; theta %v", e, f.Theta())
	}
}

func TestFitterResistsOutliers(t *testing.T) {
	for _, tc := range []struct {
		name string
		frac float64
		mult float64
	}{
		{"5% at 20x", 0.05, 20},
		{"10% at 50x", 0.10, 50},
		{"5% near zero", 0.05, 0.01},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(9, 9))
			f, _ := NewFitter(Theta{10, 0.02, 1e-6, 2, 3e-5}, DefaultFitConfig())
			for i := 0; i < 600; i++ {
				x := sample(r)
				y := noisy(r, truth, x, 0.05)
				if r.Float64() < tc.frac {
					y *= tc.mult
				}
				_, _ = f.Observe(x, y)
			}
			if e := relError(r, f.Theta(), truth); e > 0.12 {
				t.Fatalf("with %s outliers the fit is %.3f off, want <= 0.12; theta %v", tc.name, e, f.Theta())
			}
		})
	}
}

// Whatever the data, no coefficient goes negative (property over adversarial samples: TTFT
// that falls as the prompt grows, zeros, huge values).
func TestFitterNeverNegative(t *testing.T) {
	for seed := uint64(0); seed < 20; seed++ {
		r := rand.New(rand.NewPCG(seed, 1))
		f, _ := NewFitter(truth, DefaultFitConfig())
		for i := 0; i < 400; i++ {
			x := sample(r)
			var y float64
			switch r.IntN(4) {
			case 0:
				y = math.Max(0, 5000-x[FTokens]) // anti-correlated with work
			case 1:
				y = 0
			case 2:
				y = r.Float64() * 1e6
			default:
				y = noisy(r, truth, x, 0.5)
			}
			if _, err := f.Observe(x, y); err != nil {
				t.Fatal(err)
			}
			if th := f.Fitted(); !th.Valid() {
				t.Fatalf("seed %d sample %d: theta %v has a negative or non-finite coefficient", seed, i, th)
			}
		}
	}
}

func TestFitterReadinessAndReset(t *testing.T) {
	cfg := DefaultFitConfig()
	cfg.ReadySamples = 10
	prior := Theta{10, 0.02, 1e-6, 2, 3e-5}
	f, _ := NewFitter(prior, cfg)
	x := Features(State{}, Req{Uncached: 1000}, testParams)
	for i := 0; i < 30; i++ {
		_, _ = f.Observe(x, 200) // no spread: the same prompt size every time
	}
	if f.Ready() || f.Theta() != prior {
		t.Fatalf("ready %v with no spread in prompt sizes; Theta must stay the prior", f.Ready())
	}
	_, _ = f.Observe(Features(State{}, Req{Uncached: 4000}, testParams), 500)
	if !f.Ready() || f.Theta() == prior {
		t.Fatal("not ready after 31 samples with spread")
	}
	f.Reset()
	if f.Ready() || f.Samples() != 0 || f.Fitted() != prior {
		t.Fatalf("after Reset: ready %v, samples %d, theta %v; want the prior", f.Ready(), f.Samples(), f.Fitted())
	}
}

// TestFitterReadyOnlyWhenBetterThanPrior: a fit replaces the prior only once it predicts the
// recent samples better than the prior does. A prior that is the worker's true profile keeps
// scoring it through 60 noisy samples (a count-only rule switched to the noisier fit after 20);
// a prior three times too fast is replaced.
func TestFitterReadyOnlyWhenBetterThanPrior(t *testing.T) {
	var fast Theta
	for i := range truth {
		fast[i] = truth[i] / 3
	}
	for _, tc := range []struct {
		name      string
		prior     Theta
		wantReady bool
	}{
		{"prior is the truth", truth, false},
		{"prior three times too fast", fast, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 5; seed++ {
				r := rand.New(rand.NewPCG(seed, 7))
				f, err := NewFitter(tc.prior, DefaultFitConfig())
				if err != nil {
					t.Fatal(err)
				}
				for i := 0; i < 60; i++ {
					x := sample(r)
					if _, err := f.Observe(x, noisy(r, truth, x, 0.25)); err != nil {
						t.Fatal(err)
					}
				}
				if f.Ready() != tc.wantReady {
					t.Fatalf("seed %d: ready %v after 60 samples (fit error %.3f, prior error %.3f), want %v",
						seed, f.Ready(), f.ResidualMAD(), f.PriorResidualMAD(), tc.wantReady)
				}
			}
		})
	}
}

func TestFitterRejectsBadInput(t *testing.T) {
	f, _ := NewFitter(truth, DefaultFitConfig())
	good := Features(State{}, Req{Uncached: 100}, testParams)
	neg := good
	neg[FTokens] = -1
	noConst := good
	noConst[FFrontend] = 0
	for _, tc := range []struct {
		name string
		x    [NumFeatures]float64
		y    float64
	}{
		{"NaN ttft", good, math.NaN()}, {"Inf ttft", good, math.Inf(1)}, {"negative ttft", good, -1},
		{"negative feature", neg, 10}, {"no constant", noConst, 10},
	} {
		if _, err := f.Observe(tc.x, tc.y); !errors.Is(err, ErrBadSample) {
			t.Fatalf("%s: error %v, want ErrBadSample", tc.name, err)
		}
	}
	if f.Samples() != 0 || f.Fitted() != truth {
		t.Fatal("a rejected sample changed the fit")
	}
	if _, err := NewFitter(Theta{-1}, DefaultFitConfig()); err == nil {
		t.Fatal("a negative prior was accepted")
	}
	if _, err := NewFitter(truth, FitConfig{}); err == nil {
		t.Fatal("a zero config was accepted")
	}
}
