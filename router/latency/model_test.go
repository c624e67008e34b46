package latency

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestSteps(t *testing.T) {
	for _, tc := range []struct {
		name         string
		tokens, bDec float64
		m            int
		want         float64
	}{
		{"no prefill", 0, 10, 8192, 0},
		{"one chunk", 100, 0, 8192, 1},
		{"exact fit", 8192, 0, 8192, 1},
		{"one over", 8193, 0, 8192, 2},
		{"decodes shrink the budget", 8192, 192, 8192, 2},
		{"budget floored at an eighth", 2048, 10000, 8192, 2},
		{"zero budget treated as one", 3, 0, 0, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Steps(tc.tokens, tc.bDec, tc.m); got != tc.want {
				t.Fatalf("Steps(%v, %v, %d) = %v, want %v", tc.tokens, tc.bDec, tc.m, got, tc.want)
			}
		})
	}
}

func TestPredictTTFTTerms(t *testing.T) {
	th := Theta{10, 0.02, 1e-6, 3, 3e-5}
	p := Params{MaxBatchedTokens: 8192, KVPressureStart: 0.9, KVPressureWeight: 1}
	for _, tc := range []struct {
		name string
		s    State
		r    Req
		want Prediction
	}{
		{"idle, no cache", State{}, Req{Uncached: 1000},
			Prediction{FrontendMs: 10, OwnMs: 0.02*1000 + 1e-6*500000, DecodeMs: 3}},
		{"cached context adds attention", State{}, Req{Uncached: 1000, Cached: 9000},
			Prediction{FrontendMs: 10, OwnMs: 20 + 1e-6*1000*9500, DecodeMs: 3}},
		{"queue ahead and decodes", State{AheadTokens: 8000, AheadPairs: 1e7, DecodeRequests: 192, DecodeKVTokens: 1e6}, Req{Uncached: 1000},
			Prediction{FrontendMs: 10, QueuedMs: 160 + 10, OwnMs: 20.5, DecodeMs: 2 * (3 + 30)}},
		{"kv pressure half way", State{KVUsage: 0.95}, Req{Uncached: 1000},
			Prediction{FrontendMs: 10, OwnMs: 20.5, DecodeMs: 3, PressureMs: 0.5 * 20.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PredictTTFT(th, p, tc.s, tc.r)
			tc.want.TotalMs = tc.want.FrontendMs + tc.want.QueuedMs + tc.want.OwnMs + tc.want.DecodeMs + tc.want.PressureMs
			g := []float64{got.FrontendMs, got.QueuedMs, got.OwnMs, got.DecodeMs, got.PressureMs, got.TotalMs}
			w := []float64{tc.want.FrontendMs, tc.want.QueuedMs, tc.want.OwnMs, tc.want.DecodeMs, tc.want.PressureMs, tc.want.TotalMs}
			for i := range g {
				if math.Abs(g[i]-w[i]) > 1e-9*math.Max(1, w[i]) {
					t.Fatalf("term %d = %v, want %v (got %+v)", i, g[i], w[i], got)
				}
			}
			// The prediction is the linear model on the features, plus the pressure term.
			if lin := Dot(th, Features(tc.s, tc.r, p)); math.Abs(lin+got.PressureMs-got.TotalMs) > 1e-9*got.TotalMs {
				t.Fatalf("Dot(features) %v + pressure %v != total %v", lin, got.PressureMs, got.TotalMs)
			}
		})
	}
}

// A long decode in flight costs a new request a few ms per step, not the prefill of its
// context: that was the old block cost's mistake.
func TestLongDecodeCostsLessThanItsPrefill(t *testing.T) {
	th := Theta{10, 0.0172, 1.04e-6, 2, 2.9e-5}
	p := Params{MaxBatchedTokens: 8192}
	busy := PredictTTFT(th, p, State{DecodeRequests: 1, DecodeKVTokens: 80000}, Req{Uncached: 500, Cached: 80000}).TotalMs
	cold := PredictTTFT(th, p, State{}, Req{Uncached: 80500}).TotalMs
	if !(busy*10 < cold) {
		t.Fatalf("own worker with an 80k decode in flight %v ms, cold worker %v ms: the hit must win by far", busy, cold)
	}
}

func TestFleetMs(t *testing.T) {
	for _, tc := range []struct {
		extra, dec, w, want float64
	}{
		{0, 10, 1, 0}, {-5, 10, 1, 0}, {100, 0, 1, 0}, {100, 10, 0.1, 100},
	} {
		if got := FleetMs(tc.extra, tc.dec, tc.w); math.Abs(got-tc.want) > 1e-9 {
			t.Fatalf("FleetMs(%v, %v, %v) = %v, want %v", tc.extra, tc.dec, tc.w, got, tc.want)
		}
	}
}

// Property: for any nonnegative Theta, more cache (same prompt), less queue, fewer or shorter
// decodes and a less-full KV cache never predict a longer TTFT.
func TestPredictTTFTMonotone(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 8))
	p := Params{MaxBatchedTokens: 8192, KVPressureStart: 0.9, KVPressureWeight: 1}
	for i := 0; i < 5000; i++ {
		var th Theta
		for j := range th {
			th[j] = r.Float64() * []float64{20, 0.05, 3e-6, 10, 1e-4}[j]
		}
		prompt := 1 + r.Float64()*100000
		s := State{AheadTokens: r.Float64() * 50000, AheadPairs: r.Float64() * 1e9, DecodeRequests: float64(r.IntN(300)),
			DecodeKVTokens: r.Float64() * 5e6, KVUsage: r.Float64()}
		u := 1 + r.Float64()*(prompt-1)
		base := PredictTTFT(th, p, s, Req{Uncached: u, Cached: prompt - u}).TotalMs
		more := s
		switch r.IntN(5) {
		case 0:
			u2 := u + r.Float64()*(prompt-u) // less cache
			if got := PredictTTFT(th, p, s, Req{Uncached: u2, Cached: prompt - u2}).TotalMs; got < base-1e-9*base {
				t.Fatalf("less cache predicted shorter: %v < %v (theta %v, u %v→%v of %v)", got, base, th, u, u2, prompt)
			}
			continue
		case 1:
			more.AheadTokens += r.Float64() * 10000
		case 2:
			more.DecodeRequests += float64(r.IntN(100))
		case 3:
			more.DecodeKVTokens += r.Float64() * 1e6
		case 4:
			more.KVUsage = math.Min(1, more.KVUsage+r.Float64()*0.2)
		}
		if got := PredictTTFT(th, p, more, Req{Uncached: u, Cached: prompt - u}).TotalMs; got < base-1e-9*base {
			t.Fatalf("more load predicted shorter: %v < %v (%+v → %+v)", got, base, s, more)
		}
	}
}

func TestEvictBlocks(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		newBlocks, ws, capac float64
		want                 float64
	}{
		{"room for it", 100, 800, 1000, 0},
		{"exactly fits", 200, 800, 1000, 0},
		{"overflows by part", 300, 800, 1000, 100},
		{"cache already over: all of it", 300, 1200, 1000, 300},
		{"capacity unknown", 300, 1200, 0, 0},
		{"nothing new", 0, 1200, 1000, 0},
	} {
		if got := EvictBlocks(tc.newBlocks, tc.ws, tc.capac); got != tc.want {
			t.Errorf("%s: EvictBlocks(%v, %v, %v) = %v, want %v", tc.name, tc.newBlocks, tc.ws, tc.capac, got, tc.want)
		}
	}
	th := Theta{0, 0.01, 1e-6, 0, 0}
	if got, want := EvictMs(th, 1000, 3000, 0.5), 0.5*PrefillMs(th, 1000, 3000); got != want {
		t.Errorf("EvictMs = %v, want %v", got, want)
	}
	if got := EvictMs(th, 1000, 3000, 0); got != 0 {
		t.Errorf("EvictMs with weight 0 = %v", got)
	}
}

// OverflowBlocks: the overflow beyond what EvictBlocks counts, up to the whole prompt.
func TestOverflowBlocks(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		newBlocks, prompt, ws, capa float64
		want                        float64
	}{
		{"room for it", 100, 500, 800, 1000, 0},
		{"overflow within the new blocks", 300, 500, 800, 1000, 0},
		{"overflow past the new blocks", 100, 500, 1200, 1000, 200},
		{"overflow past the prompt: capped at it", 100, 500, 2000, 1000, 400},
		{"nothing cached: all counted by EvictBlocks", 500, 500, 2000, 1000, 0},
		{"nothing new, cache over", 0, 500, 1300, 1000, 300},
		{"capacity unknown", 100, 500, 2000, 0, 0},
	} {
		got := OverflowBlocks(tc.newBlocks, tc.prompt, tc.ws, tc.capa)
		if got != tc.want {
			t.Errorf("%s: OverflowBlocks(%v, %v, %v, %v) = %v, want %v", tc.name, tc.newBlocks, tc.prompt, tc.ws, tc.capa, got, tc.want)
		}
		if tot := got + EvictBlocks(tc.newBlocks, tc.ws, tc.capa); tc.capa > 0 && tot > tc.prompt {
			t.Errorf("%s: eviction and overflow %v exceed the prompt's %v blocks", tc.name, tot, tc.prompt)
		}
	}
}

// QueueLossBlocks: a prefix used after most of the cache loses what the queue ahead pushes
// past capacity, never more than itself or than the queue allocates; a recent prefix, an
// empty queue or an unknown capacity loses nothing.
func TestQueueLossBlocks(t *testing.T) {
	cases := []struct {
		name                                 string
		cached, ahead, newer, capacity, want float64
	}{
		{"nothing ahead", 1000, 0, 20000, 16384, 0},
		{"capacity unknown", 1000, 500, 20000, 0, 0},
		{"nothing cached", 0, 500, 20000, 16384, 0},
		{"recent prefix fits", 1000, 2000, 5000, 16384, 0},
		{"just fits", 1000, 2000, 15384, 16384, 0},
		{"oldest prefix, small queue: the queue's blocks", 1220, 500, 18000, 16384, 500},
		{"oldest prefix, large queue: all of it", 1220, 1931, 18000, 16384, 1220},
		{"partly over", 1000, 2000, 15884, 16384, 500},
	}
	for _, tc := range cases {
		if got := QueueLossBlocks(tc.cached, tc.ahead, tc.newer, tc.capacity); got != tc.want {
			t.Errorf("%s: QueueLossBlocks(%v, %v, %v, %v) = %v, want %v", tc.name, tc.cached, tc.ahead, tc.newer, tc.capacity, got, tc.want)
		}
	}
}
