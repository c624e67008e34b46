package latency

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// TestFitterLearnsFromWorkerSamples: a fitter fed only what a worker's histograms give
// (prefill times and step times, no gateway TTFT) learns the prefill and step coefficients of
// a worker three times slower than its prior, and is ready with them.
func TestFitterLearnsFromWorkerSamples(t *testing.T) {
	prior := Theta{12, 0.005, 2.3e-7, 1.3, 0.8e-5}
	slow := Theta{12, 0.015, 7e-7, 4, 2.5e-5}
	for _, tc := range []struct {
		name    string
		sources []Source
	}{
		{"prefill and step", []Source{SourceWorkerPrefill, SourceWorkerStep}},
		{"prefill and gateway itl", []Source{SourceWorkerPrefill, SourceGatewayITL}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(3, 5))
			f, err := NewFitter(prior, DefaultFitConfig())
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 300; i++ {
				src := tc.sources[i%len(tc.sources)]
				kDec := r.Float64() * 400000
				var x [NumFeatures]float64
				if src == SourceWorkerPrefill {
					u := 200 + r.Float64()*7000
					x = PrefillFeatures(u, r.Float64()*30000, float64(r.IntN(64)), kDec, testParams)
				} else {
					tok := r.Float64() * 2000
					x = StepFeatures(tok, Pairs(tok, r.Float64()*20000), kDec)
				}
				if _, err := f.ObserveFrom(src, x, noisy(r, slow, x, 0.05)); err != nil {
					t.Fatal(err)
				}
			}
			if !f.Ready() {
				t.Fatalf("not ready after 300 worker samples: %v", f.SamplesBySource())
			}
			th := f.Theta()
			for _, i := range []int{FTokens, FSteps} {
				if got, want := th[i], slow[i]; math.Abs(got-want)/want > 0.25 {
					t.Errorf("%s = %.4g, want %.4g ±25%% (prior %.4g)", FeatureNames()[i], got, want, prior[i])
				}
			}
			// The prefill of a 4,000-token prompt next to 20 decodes is predicted as the slow
			// worker computes it.
			x := PrefillFeatures(4000, 8000, 20, 200000, testParams)
			if got, want := Dot(th, x), Dot(slow, x); math.Abs(got-want)/want > 0.1 {
				t.Errorf("prefill predicted %.1f ms, the worker takes %.1f ms (prior %.1f)", got, want, Dot(prior, x))
			}
			by := f.SamplesBySource()
			for _, s := range tc.sources {
				if by[s] != 150 {
					t.Errorf("%s samples = %d, want 150", s, by[s])
				}
			}
			if by[SourceTTFT] != 0 {
				t.Errorf("ttft samples = %d, want 0", by[SourceTTFT])
			}
		})
	}
}

// TestFitterSourceConstant: a worker sample carrying the frontend constant, or a TTFT sample
// without it, is rejected; so is an unknown source.
func TestFitterSourceConstant(t *testing.T) {
	f, err := NewFitter(truth, DefaultFitConfig())
	if err != nil {
		t.Fatal(err)
	}
	withConst := Features(State{}, Req{Uncached: 100}, testParams)
	noConst := PrefillFeatures(100, 0, 0, 0, testParams)
	for _, tc := range []struct {
		name string
		src  Source
		x    [NumFeatures]float64
		ok   bool
	}{
		{"ttft with constant", SourceTTFT, withConst, true},
		{"ttft without constant", SourceTTFT, noConst, false},
		{"prefill without constant", SourceWorkerPrefill, noConst, true},
		{"prefill with constant", SourceWorkerPrefill, withConst, false},
		{"step with constant", SourceWorkerStep, withConst, false},
		{"unknown source", NumSources, noConst, false},
	} {
		_, err := f.ObserveFrom(tc.src, tc.x, 10)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrBadSample)) {
			t.Errorf("%s: err %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
