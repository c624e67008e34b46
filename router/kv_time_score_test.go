package router

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/confval"
	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router/latency"
)

// TestKVDecodersAgainstCache: how much a worker's running decodes cost a new request against
// what its cache saves. Every case routes `decoders` agent contexts of `decoderBlocks` blocks
// to target 0 (all past their first token, so decoding), caches `cached` of the new
// prompt's blocks there, and picks between target 0 and an idle target 1.
//   - keeps a session: a 32k-token context on a worker decoding three 80k-token contexts stays:
//     a running decode costs a new request a few ms per step, recomputing 32k tokens elsewhere
//     about a second. The block cost counted each 80k-token decode like 80k tokens of prefill
//     and sent the session to an idle worker with no cache.
//   - small hit leaves: with the default prior (before any fit is ready), a 2k-token prompt with
//     1k tokens cached on a worker decoding four 60k-token contexts goes to the idle worker. On
//     the simulator's default profile every step there also reads 240k tokens of KV (about
//     50 ms), more than the 1k cached tokens save (about 16 ms); a prior pricing a step at 2 ms
//     plus 2.9e-5 ms per KV token (a kernel-only H100 profile) kept it on the decoder.
func TestKVDecodersAgainstCache(t *testing.T) {
	cases := []struct {
		name                    string
		decoders, decoderBlocks int
		promptBlocks, cached    int
		want                    int
	}{
		{name: "keeps a session beside long decodes", decoders: 3, decoderBlocks: 5000, promptBlocks: 2010, cached: 2000, want: 0},
		{name: "small hit leaves heavy decoders", decoders: 4, decoderBlocks: 3750, promptBlocks: 128, cached: 64, want: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := NewKV(DefaultKVConfig(), KVDeps{Matcher: fixedMatcher{tgt(0): {G1: c.cached}}})
			if err != nil {
				t.Fatal(err)
			}
			e, err := NewDispatcher(DispatcherOptions{KV: p})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < c.decoders; i++ {
				other := request(chain(uint64(100+i), c.decoderBlocks))
				_, lc, err := e.Route(context.Background(), other, kvCands(1))
				if err != nil {
					t.Fatal(err)
				}
				lc.Sent()
				lc.FirstToken() // now decoding on target 0
				defer lc.Done()
			}
			d, err := e.Pick(context.Background(), request(chain(1, c.promptBlocks)), kvCands(2))
			if err != nil {
				t.Fatal(err)
			}
			if d.Chosen.Target != tgt(c.want) {
				t.Fatalf("chose %v, want target %d: %s", d.Chosen.Target, c.want, js(d))
			}
		})
	}
}

// TestKVTimeCost: the kv policy's choice follows the predicted TTFT terms (table).
func TestKVTimeCost(t *testing.T) {
	type setup func(t *testing.T, e *Dispatcher, p *KVPolicy)
	queue := func(target, blocks int) setup { // a prompt routed to target, before its first token
		return func(t *testing.T, e *Dispatcher, _ *KVPolicy) {
			cs := []Candidate{{Target: tgt(target)}}
			if _, _, err := e.Route(context.Background(), request(chain(uint64(900+target), blocks)), cs); err != nil {
				t.Fatal(err)
			}
		}
	}
	metrics := func(target int, m WorkerMetrics) setup {
		return func(_ *testing.T, _ *Dispatcher, p *KVPolicy) { p.load.UpdateMetrics(tgt(target), m) }
	}
	for _, tc := range []struct {
		name    string
		matches fixedMatcher
		hints   fixedHints
		setup   []setup
		want    int
	}{
		{"idle: more cache wins", fixedMatcher{tgt(0): {G1: 10}, tgt(1): {G1: 100}}, nil, nil, 1},
		{"host-memory tier counts as partial cache", fixedMatcher{tgt(0): {G1: 10}, tgt(1): {G1: 10, G2: 100}}, nil, nil, 1},
		{"a long prefill queue outweighs a small hit", fixedMatcher{tgt(0): {G1: 16}}, nil, []setup{queue(0, 2000)}, 1},
		{"a short queue does not outweigh a big hit", fixedMatcher{tgt(0): {G1: 120}}, nil, []setup{queue(0, 20)}, 0},
		{"unseen waiting requests count as queued prefill", fixedMatcher{tgt(0): {G1: 16}}, nil,
			[]setup{metrics(0, WorkerMetrics{Waiting: 10, Running: 1})}, 1},
		{"busy threshold avoids a saturated worker despite its cache", fixedMatcher{tgt(0): {G1: 128}}, nil,
			[]setup{metrics(0, WorkerMetrics{KVUsage: 0.995})}, 1},
		{"a parent hint decides between equal targets", nil, fixedHints{{Target: tgt(1), Rule: "parent", Blocks: 4}}, nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			deps := KVDeps{Matcher: tc.matches}
			if tc.matches == nil {
				deps.Matcher = fixedMatcher{}
			}
			if tc.hints != nil {
				deps.Hints = tc.hints
			}
			p := newTestKV(t, PolicyKV, DefaultKVConfig(), deps, nil)
			e, err := NewDispatcher(DispatcherOptions{KV: p})
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range tc.setup {
				s(t, e, p)
			}
			req := request(chain(1, 128))
			req.SessionID = "s"
			d, err := p.Pick(context.Background(), req, kvCands(2))
			if err != nil {
				t.Fatal(err)
			}
			if d.Chosen.Target != tgt(tc.want) {
				t.Fatalf("chose %s, want %s: %s", d.Chosen.Target, tgt(tc.want), js(d))
			}
		})
	}
}

// TestKVFleetTerm: prefill on a worker with running decodes costs fleet_weight × the prefill ×
// the decodes more; a worker without decodes pays nothing extra.
func TestKVFleetTerm(t *testing.T) {
	run := func(fleet float64) Decision {
		cfg := DefaultKVConfig()
		cfg.Latency.FleetWeight = fleet
		p := newTestKV(t, PolicyKV, cfg, KVDeps{Matcher: fixedMatcher{tgt(2): {G1: 128}}}, nil)
		p.load.UpdateMetrics(tgt(1), WorkerMetrics{Running: 50})
		d, err := p.Pick(context.Background(), request(chain(1, 128)), kvCands(3))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	off, on := run(0), run(0.05)
	p := newTestKV(t, PolicyKV, DefaultKVConfig(), KVDeps{}, nil)
	th := p.timed.prior
	wantDelta := 0.05 * (th[1]*2048 + th[2]*2048*1024) * 50 // the whole 2048-token prefill, 50 decodes
	if got := on.Candidates[1].Cost - off.Candidates[1].Cost; got < wantDelta*0.999 || got > wantDelta*1.001 {
		t.Fatalf("fleet term on the busy miss %v, want %v", got, wantDelta)
	}
	if on.Candidates[0].Cost != off.Candidates[0].Cost || on.Candidates[2].Cost != off.Candidates[2].Cost {
		t.Fatalf("fleet term where there are no decodes: %s vs %s", js(on), js(off))
	}
}

// TestKVRecomputeTerm: a target that would compute blocks the best-cached candidate holds pays
// recompute_weight × their prefill after its own cached prefix; the best-cached target pays
// nothing, and with the weight 0 nobody does.
func TestKVRecomputeTerm(t *testing.T) {
	run := func(w float64) Decision {
		cfg := DefaultKVConfig()
		cfg.Latency.RecomputeWeight = w
		p := newTestKV(t, PolicyKV, cfg, KVDeps{Matcher: fixedMatcher{tgt(1): {G1: 32}, tgt(2): {G1: 128}}}, nil)
		d, err := p.Pick(context.Background(), request(chain(1, 128)), kvCands(3))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	th := newTestKV(t, PolicyKV, DefaultKVConfig(), KVDeps{}, nil).timed.prior
	prefill := func(u, c float64) float64 { return th[1]*u + th[2]*u*(c+u/2) }
	cases := []struct {
		name   string
		weight float64
		want   [3]float64 // recompute_ms of targets 0, 1, 2
	}{
		{"off", 0, [3]float64{0, 0, 0}},
		{"weight 1", 1, [3]float64{prefill(2048, 0), prefill(96*16, 32*16), 0}},
		{"weight 0.5", 0.5, [3]float64{0.5 * prefill(2048, 0), 0.5 * prefill(96*16, 32*16), 0}},
	}
	off := run(0)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := run(tc.weight)
			for i, c := range d.Candidates {
				if math.Abs(c.RecomputeMs-tc.want[i]) > 1e-9*math.Max(1, tc.want[i]) {
					t.Fatalf("target %d recompute_ms %v, want %v: %s", i, c.RecomputeMs, tc.want[i], js(d))
				}
				if got := c.Cost - off.Candidates[i].Cost; math.Abs(got-tc.want[i]) > 1e-6*math.Max(1, tc.want[i]) {
					t.Fatalf("target %d cost grew by %v, want %v", i, got, tc.want[i])
				}
			}
			if d.Chosen.Target != tgt(2) {
				t.Fatalf("chose %s, want the best-cached %s", d.Chosen.Target, tgt(2))
			}
		})
	}
}

// TestKVCacheLostBeforeSchedule: the tokens the index held on the chosen target at routing
// that the worker's cached_tokens did not reuse are counted per worker; a worker that reused
// them all, or more (a sibling computed more meanwhile), adds nothing; a fully cached prompt's
// last block, which vLLM computes again, is not counted as lost.
func TestKVCacheLostBeforeSchedule(t *testing.T) {
	cases := []struct {
		name           string
		g1, blocks     int // the index's overlap and the prompt, in 16-token blocks
		reportedCached int
		wantLost       float64
	}{
		{"all reused", 100, 128, 100 * 16, 0},
		{"more reused than indexed", 100, 128, 120 * 16, 0},
		{"60 blocks evicted while waiting", 100, 128, 40 * 16, 60 * 16},
		{"fully cached: the last block is computed again", 128, 128, 127 * 16, 0},
		{"fully cached and evicted", 128, 128, 0, 127 * 16},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			e, _, _ := timedEngineWith(t, DefaultKVConfig(), fixedMatcher{tgt(0): {G1: tc.g1}}, reg)
			_, lc, err := e.Route(context.Background(), streamed(request(chain(1, tc.blocks))), kvCands(1))
			if err != nil {
				t.Fatal(err)
			}
			lc.Sent()
			lc.FirstToken()
			lc.UsageSeen(Usage{PromptTokens: tc.blocks * 16, CachedTokens: tc.reportedCached, HasCached: true})
			lc.Done()
			if got := counterSum(t, reg, "kvgate_router_cache_lost_before_schedule_tokens_total"); got != tc.wantLost {
				t.Fatalf("lost %v tokens, want %v", got, tc.wantLost)
			}
		})
	}
}

// TestQueueLossTerm: with latency.queue_loss_weight on, a target whose cached prefix was used
// before most of its cache's working set loses to the prefill queued ahead of it what that
// queue allocates beyond its capacity, so a cold target with an empty queue wins; with the
// weight 0, or with the prefix used after the rest, the cached target wins. The cached target
// reports 15 waiting requests (48 blocks each: 720 blocks queued ahead) and 4,000 KV blocks;
// its working set holds the prompt and an unrelated 3,700-block prompt (3,696 of its blocks
// counted), 696 blocks beyond capacity with the 1,000 cached.
func TestQueueLossTerm(t *testing.T) {
	prompt, other := chain(1, 1024), chain(7, 3700)
	cases := []struct {
		name         string
		weight       float64
		prefixRecent bool
		want         int
		wantLoss     float64
	}{
		{"off: the cache wins", 0, false, 0, 0},
		{"on, prefix older than the rest: the queue evicts it", 1, false, 1, 696.0 / 1000},
		{"on, prefix used last: nothing lost", 1, true, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultKVConfig()
			cfg.Latency.QueueLossWeight = tc.weight
			cfg.Latency.RecomputeWeight = 0 // this term alone
			cfg.Latency.EvictWeight = 0
			cfg.WaitingWeight = 48
			p := newTestKV(t, PolicyKV, cfg, KVDeps{Matcher: fixedMatcher{tgt(0): {G1: 1000}}}, nil)
			if p.timed.workset != nil {
				first, second := prompt, other
				if tc.prefixRecent {
					first, second = other, prompt
				}
				p.timed.workset.record(tgt(0), first, time.Now().Add(-10*time.Second))
				p.timed.workset.record(tgt(0), second, time.Now().Add(-5*time.Second))
			}
			p.load.UpdateMetrics(tgt(0), WorkerMetrics{Waiting: 15, KVUsage: 0.5, NumGPUBlocks: 4000})
			p.load.UpdateMetrics(tgt(1), WorkerMetrics{KVUsage: 0.5, NumGPUBlocks: 4000})
			d, err := p.Pick(context.Background(), request(prompt), kvCands(2))
			if err != nil {
				t.Fatal(err)
			}
			if d.Chosen.Target != tgt(tc.want) {
				t.Fatalf("chose %s, want %s: %s", d.Chosen.Target, tgt(tc.want), js(d))
			}
			if got := d.Candidates[0].QueueLoss; math.Abs(got-tc.wantLoss) > 1e-9 {
				t.Fatalf("queue_loss %v, want %v: %s", got, tc.wantLoss, js(d))
			}
			if got := d.Candidates[1].QueueLoss; got != 0 {
				t.Fatalf("queue_loss %v on the cold target", got)
			}
		})
	}
}

// TestKVEvictionTerm: a prefill that would push blocks routed to a target within the
// approximate TTL out of its full KV cache pays their prefill; a target with room, a prompt
// mostly cached there, an expired working set or the term turned off pay nothing. With the
// overflow term on, a prompt mostly cached on a target already over its cache pays as well
// for the rest of the overflow, up to its whole prompt (latency.OverflowBlocks).
func TestKVEvictionTerm(t *testing.T) {
	const capacity = 1000
	for _, tc := range []struct {
		name         string
		weight       float64
		overflow     float64      // latency.overflow_weight
		other        int          // blocks of another prompt routed to target 0
		cached       int          // blocks of the request cached on target 0
		expire       bool         // the working set's window passed before the request
		wantEvict    float64      // blocks evicted on target 0
		wantOverflow float64      // blocks of the rest of the overflow on target 0
		want         kvkey.Target // chosen
		otherAge     time.Duration
		staleAfter   time.Duration // latency.evict_stale_after
	}{
		// 896 other blocks + 300 new in 1,000: 196 evicted.
		{"overflow on the full target", 1, 1, 896, 0, false, 196, 0, tgt(1), 0, 0},
		// 640 + the cached 250 (240 of them counted: the set keys every 16th block beyond
		// the first 64) + 50 new fit.
		{"mostly cached: fits", 1, 1, 640, 250, false, 0, 0, tgt(0), 0, 0},
		// 896 + 240 + 50 in 1,000: an overflow of 186, 50 of it the new blocks' eviction.
		{"mostly cached, cache over", 1, 0, 896, 250, false, 50, 0, kvkey.Target{}, 0, 0},
		{"mostly cached, cache over, overflow on", 1, 1, 896, 250, false, 50, 136, kvkey.Target{}, 0, 0},
		{"working set expired", 1, 1, 896, 0, true, 0, 0, kvkey.Target{}, 0, 0},
		{"term off", 0, 0, 896, 0, false, 0, 0, kvkey.Target{}, 0, 0},
		// The other prompt was routed a minute ago: an LRU cache evicts it first, and with
		// evict_stale_after 30s it is free to.
		{"overflow, the evicted blocks stale", 1, 0, 896, 0, false, 0, 0, kvkey.Target{}, time.Minute, 30 * time.Second},
		{"overflow, the evicted blocks fresh", 1, 0, 896, 0, false, 196, 0, tgt(1), 10 * time.Second, 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &fakeClock{t: time.Unix(1000, 0)}
			cfg := DefaultKVConfig()
			cfg.Latency.EvictWeight = tc.weight
			cfg.Latency.OverflowWeight = tc.overflow
			cfg.Latency.EvictStaleAfter = confval.Duration(tc.staleAfter)
			prompt := chain(1, 300)
			m := fixedMatcher{}
			if tc.cached > 0 {
				m[tgt(0)] = indexers.TierMatch{G1: tc.cached}
			}
			p := newTestKV(t, PolicyKV, cfg, KVDeps{Matcher: m}, clk)
			e, err := NewDispatcher(DispatcherOptions{KV: p})
			if err != nil {
				t.Fatal(err)
			}
			// Target 0's working set: another prompt (and the request's cached prefix) routed
			// there just now.
			d0 := Decision{Chosen: Choice{Target: tgt(0)}}
			e.kv.begin(d0, request(chain(9, tc.other))).Done()
			clk.advance(tc.otherAge)
			if tc.cached > 0 {
				e.kv.begin(d0, request(prompt[:tc.cached])).Done()
			}
			if tc.expire {
				clk.advance(cfg.Approximate.TTL.D() + time.Second)
				p.timed.workset.expire(clk.now().Add(-cfg.Approximate.TTL.D()))
			}
			for i := range 2 {
				p.load.UpdateMetrics(tgt(i), WorkerMetrics{NumGPUBlocks: capacity, At: clk.now()})
			}
			d, err := p.Pick(context.Background(), request(prompt), kvCands(2))
			if err != nil {
				t.Fatal(err)
			}
			th := p.timed.prior
			ev, ov := tc.wantEvict*16, tc.wantOverflow*16
			wantOv := tc.overflow * latency.PrefillMs(th, ov, 300*16-ov)
			want := tc.weight*latency.PrefillMs(th, ev, 300*16-ev) + wantOv
			if got := d.Candidates[0].OverflowMs; math.Abs(got-wantOv) > 1e-9 {
				t.Fatalf("overflow_ms on target 0 = %v, want %v (%v blocks): %s", got, wantOv, tc.wantOverflow, js(d))
			}
			if got := d.Candidates[0].EvictMs; math.Abs(got-want) > 1e-9 {
				t.Fatalf("evict_ms on target 0 = %v, want %v (%v blocks evicted, %v of overflow): %s", got, want, tc.wantEvict, tc.wantOverflow, js(d))
			}
			if got := d.Candidates[1].EvictMs; got != 0 {
				t.Fatalf("evict_ms on the empty target = %v", got)
			}
			if tc.want != (kvkey.Target{}) && d.Chosen.Target != tc.want {
				t.Fatalf("chose %v, want %v: %s", d.Chosen.Target, tc.want, js(d))
			}
		})
	}
}
