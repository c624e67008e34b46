package router

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// TestTTFTRatios: the window reports the 90th percentile (nearest rank) of measured over
// predicted TTFT once it has 8 samples, leaves out predictions under 500 ms, keeps only the
// last 64, and forgets all on reset.
func TestTTFTRatios(t *testing.T) {
	type sample struct{ measured, pred float64 }
	rep := func(n int, s sample) []sample {
		out := make([]sample, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	cat := func(parts ...[]sample) []sample {
		var out []sample
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	cases := []struct {
		name    string
		samples []sample
		reset   bool
		want    float64
	}{
		{"none", nil, false, 0},
		{"seven samples are too few", rep(7, sample{1500, 1000}), false, 0},
		{"eight: their quantile", rep(8, sample{1500, 1000}), false, 1.5},
		{"the model exact: 1", rep(20, sample{2000, 2000}), false, 1},
		// 10 samples: the 9th of them sorted (ceil(0.9·10) = 9).
		{"the 90th percentile, not the worst", cat(rep(8, sample{1000, 1000}), []sample{{1400, 1000}, {3000, 1000}}), false, 1.4},
		{"predictions under 500 ms are left out", cat(rep(8, sample{1000, 1000}), rep(30, sample{900, 300})), false, 1},
		{"zero or broken samples are left out", cat(rep(8, sample{1200, 1000}), []sample{{0, 1000}, {math.Inf(1), 1000}, {1000, math.NaN()}}), false, 1.2},
		{"only the last 64 count", cat(rep(100, sample{5000, 1000}), rep(64, sample{1100, 1000})), false, 1.1},
		{"reset forgets", rep(20, sample{3000, 1000}), true, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r ttftRatios
			for _, s := range tc.samples {
				r.add(s.measured, s.pred)
			}
			if tc.reset {
				r.reset()
			}
			if got := r.quantile(); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("quantile = %v, want %v", got, tc.want)
			}
		})
	}
}

// Saturation reports the ratio of the streamed attempts routed to a target: each of eight
// 32,768-token prompts took 1.5 times its predicted TTFT (or, without a first token, ended
// after it: a lower bound; one that ended sooner says nothing), and another target saw none.
func TestSaturationTTFTRatio(t *testing.T) {
	cases := []struct {
		name    string
		elapsed float64 // times the prediction
		first   bool    // had its first token (else Failed before it)
		want    float64
	}{
		{"measured", 1.5, true, 1.5},
		{"cut at 1.5x without a first token", 1.5, false, 1.5},
		{"ended early without a first token", 0.5, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { testSaturationTTFTRatio(t, tc.elapsed, tc.first, tc.want) })
	}
}

func testSaturationTTFTRatio(t *testing.T, elapsed float64, first bool, want float64) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := newTestKV(t, PolicyKV, DefaultKVConfig(), KVDeps{}, clk)
	e, err := NewDispatcher(DispatcherOptions{KV: p})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < ratioMinSamples; i++ {
		hashes := make([]kvkey.BlockHash, 2048) // 32,768 tokens
		for j := range hashes {
			hashes[j] = kvkey.BlockHash(1 + j + 1000*i) // uncached each time
		}
		req := request(hashes)
		req.Stream = true
		_, life, err := e.Route(context.Background(), req, []Candidate{{Target: tgt(0)}})
		if err != nil {
			t.Fatal(err)
		}
		pred, _, ok := life.Predicted()
		if !ok || pred < minRatioPredMs {
			t.Fatalf("predicted %v ms (%v), want at least %v", pred, ok, minRatioPredMs)
		}
		if i == 0 && e.Saturation(tgt(0)).TTFTRatio != 0 {
			t.Fatal("a ratio before any sample")
		}
		clk.advance(time.Duration(elapsed * pred * float64(time.Millisecond)))
		if first {
			life.FirstToken()
			life.Done()
		} else {
			life.Failed(errors.New("cut"))
		}
	}
	if got := e.Saturation(tgt(0)).TTFTRatio; math.Abs(got-want) > 1e-6 {
		t.Errorf("TTFTRatio = %v, want %v", got, want)
	}
	if got := e.Saturation(tgt(1)).TTFTRatio; got != 0 {
		t.Errorf("another target's TTFTRatio = %v, want 0", got)
	}
}
