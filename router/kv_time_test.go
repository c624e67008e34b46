package router

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/confval"
	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router/latency"
	"github.com/kvgate/kvgate/router/routerconfig"
)

// TestKVKeepsSessionOnWorkerRunningLongDecodes: a worker whose cache holds a session's 32k-token
// context, while it decodes three other agents' 80k-token contexts, must keep the session. A
// running decode costs a new request a few ms per step; recomputing 32k tokens elsewhere costs
// about a second. The block cost counted each 80k-token decode like 80k tokens of prefill and
// sent the session to an idle worker with no cache.
func TestKVKeepsSessionOnWorkerRunningLongDecodes(t *testing.T) {
	session := chain(1, 2010) // a 32k-token context plus a new turn
	p, err := NewKV(DefaultKVConfig(), KVDeps{Matcher: fixedMatcher{tgt(0): {G1: 2000}}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewDispatcher(DispatcherOptions{KV: p})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		other := request(chain(uint64(100+i), 5000)) // an 80k-token agent context
		_, lc, err := e.Route(context.Background(), other, kvCands(1))
		if err != nil {
			t.Fatal(err)
		}
		lc.Sent()
		lc.FirstToken() // now decoding on target 0
		defer lc.Done()
	}
	d, err := e.Pick(context.Background(), request(session), kvCands(2))
	if err != nil {
		t.Fatal(err)
	}
	if d.Chosen.Target != tgt(0) {
		t.Fatalf("the session left its cache for an idle worker: %s", js(d))
	}
}

// TestKVDefaultPriorKeepsPrefillOffHeavyDecoders: with the default prior (before any fit is
// ready), a 2k-token prompt with half of it cached on a worker that decodes four 60k-token
// contexts goes to an idle worker instead. On the simulator's default profile every step there
// also reads 240k tokens of KV (about 50 ms), more than the 1k cached tokens save (about 16 ms);
// a prior pricing a step at 2 ms plus 2.9e-5 ms per KV token (a kernel-only H100 profile) kept it
// on the decoder.
func TestKVDefaultPriorKeepsPrefillOffHeavyDecoders(t *testing.T) {
	p, err := NewKV(DefaultKVConfig(), KVDeps{Matcher: fixedMatcher{tgt(0): {G1: 64}}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewDispatcher(DispatcherOptions{KV: p})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		other := request(chain(uint64(100+i), 3750)) // a 60k-token agent context
		_, lc, err := e.Route(context.Background(), other, kvCands(1))
		if err != nil {
			t.Fatal(err)
		}
		lc.Sent()
		lc.FirstToken() // now decoding on target 0
		defer lc.Done()
	}
	d, err := e.Pick(context.Background(), request(chain(1, 128)), kvCands(2))
	if err != nil {
		t.Fatal(err)
	}
	if d.Chosen.Target != tgt(1) {
		t.Fatalf("a small hit kept the prefill on a worker decoding 240k KV tokens: %s", js(d))
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

// streamed marks r as a streamed request (its first byte is its first token).
func streamed(r *Request) *Request {
	r.Stream = true
	return r
}

// timedEngine is a kv engine with a fake clock whose metrics go to reg.
func timedEngine(t *testing.T, cfg KVConfig, reg *prometheus.Registry) (*Dispatcher, *KVPolicy, *fakeClock) {
	t.Helper()
	return timedEngineWith(t, cfg, fixedMatcher{}, reg)
}

// timedEngineWith is timedEngine over matcher m.
func timedEngineWith(t *testing.T, cfg KVConfig, m fixedMatcher, reg *prometheus.Registry) (*Dispatcher, *KVPolicy, *fakeClock) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := newTestKV(t, PolicyKV, cfg, KVDeps{Matcher: m}, clk)
	eo := DispatcherOptions{KV: p}
	if reg != nil {
		eo.Registerer = reg
	}
	e, err := NewDispatcher(eo)
	if err != nil {
		t.Fatal(err)
	}
	return e, p, clk
}

// TestKVLearnsFromLifecycle: TTFTs measured between Route and FirstToken, with the worker's
// cached_tokens from UsageSeen, fit the target's model: a worker three times slower than the
// prior profile is learned, and its queue accounting drains to zero.
func TestKVLearnsFromLifecycle(t *testing.T) {
	reg := prometheus.NewRegistry()
	e, p, clk := timedEngine(t, DefaultKVConfig(), reg)
	var slow latency.Theta
	for i, v := range p.timed.prior {
		slow[i] = 3 * v
	}
	r := rand.New(rand.NewPCG(4, 2))
	for i := 0; i < 200; i++ {
		blocks := 8 + r.IntN(1000)
		cached := r.IntN(blocks) * 16
		_, lc, err := e.Route(context.Background(), streamed(request(chain(uint64(i+10), blocks))), kvCands(1))
		if err != nil {
			t.Fatal(err)
		}
		lc.Sent()
		ms := latency.PredictTTFT(slow, p.timed.params, latency.State{}, latency.Req{Uncached: float64(blocks*16 - cached), Cached: float64(cached)}).TotalMs
		clk.advance(time.Duration(ms * float64(time.Millisecond)))
		lc.FirstToken()
		lc.UsageSeen(Usage{PromptTokens: blocks * 16, CachedTokens: cached, HasCached: true})
		lc.Done()
	}
	v := e.DebugTargets([]kvkey.Target{tgt(0)})[0].Latency
	if v == nil || !v.Ready || v.Samples != 200 {
		t.Fatalf("latency view %+v, want ready with 200 samples", v)
	}
	if got, want := v.Theta["prefill_ms_per_token"], slow[latency.FTokens]; got < 0.8*want || got > 1.2*want {
		t.Fatalf("fitted prefill_ms_per_token %v, want ~%v (3x the prior)", got, want)
	}
	if v.ResidualMAD > 0.05 {
		t.Fatalf("residual MAD %v on noiseless data", v.ResidualMAD)
	}
	if v.AheadTokens != 0 || v.DecodeRequests != 0 || v.DecodeKVTokens != 0 {
		t.Fatalf("accounting left after every request ended: %+v", v)
	}
	counts := map[string]uint64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			counts[mf.GetName()] += m.GetHistogram().GetSampleCount()
		}
	}
	for _, name := range []string{"kvgate_router_predicted_ttft_seconds", "kvgate_router_observed_ttft_seconds", "kvgate_router_ttft_prediction_error_ratio"} {
		if counts[name] != 200 {
			t.Fatalf("%s has %d samples, want 200", name, counts[name])
		}
	}
	e.Forget(tgt(0))
	if v := e.DebugTargets([]kvkey.Target{tgt(0)})[0].Latency; v.Ready || v.Samples != 0 || v.Theta["prefill_ms_per_token"] != p.timed.prior[latency.FTokens] {
		t.Fatalf("after Forget the fit must be the prior again: %+v", v)
	}

	// RemoveTarget (the worker left the fleet) drops its state and its series altogether.
	e.RemoveTarget(tgt(0))
	if p.timed.get(tgt(0)) != nil || e.load.get(tgt(0)) != nil {
		t.Error("the removed target still has time-model or load state")
	}
	if mfs, err = reg.Gather(); err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "worker" && l.GetValue() == tgt(0).String() {
					t.Errorf("%s still has a series of the removed target", mf.GetName())
				}
			}
		}
	}
}

// TestKVTimeAccountingSteps: the queue and decode accounting per Lifecycle path, and which
// paths feed the fit.
func TestKVTimeAccountingSteps(t *testing.T) {
	firstAndUsage := func(lc Lifecycle, clk *fakeClock) {
		clk.advance(50 * time.Millisecond)
		lc.FirstToken()
		lc.UsageSeen(Usage{PromptTokens: 1024, CachedTokens: 512, HasCached: true})
	}
	for _, tc := range []struct {
		name                string
		stream              bool
		steps               func(lc Lifecycle, clk *fakeClock)
		ahead, decodes, fed float64
		fedAfter            float64
	}{
		{"routed, no first token", true, func(Lifecycle, *fakeClock) {}, 1024, 0, 0, 0},
		{"first token; Done feeds", true, func(lc Lifecycle, clk *fakeClock) { clk.advance(50 * time.Millisecond); lc.FirstToken() }, 0, 1, 0, 1},
		{"usage feeds", true, firstAndUsage, 0, 1, 1, 1},
		{"non-stream body: its first byte is not a first token", false, firstAndUsage, 0, 1, 0, 0},
		{"failed before first token", true, func(lc Lifecycle, _ *fakeClock) { lc.Failed(nil) }, 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, p, clk := timedEngine(t, DefaultKVConfig(), nil)
			req := request(chain(1, 64))
			req.Stream = tc.stream
			_, lc, err := e.Route(context.Background(), req, kvCands(1))
			if err != nil {
				t.Fatal(err)
			}
			lc.Sent()
			tc.steps(lc, clk)
			st, _ := p.timed.state(tgt(0))
			fed := float64(p.latencyView(tgt(0)).Samples)
			if st.AheadTokens != tc.ahead || st.DecodeRequests != tc.decodes || fed != tc.fed {
				t.Fatalf("ahead %v decodes %v fed %v, want %v %v %v", st.AheadTokens, st.DecodeRequests, fed, tc.ahead, tc.decodes, tc.fed)
			}
			lc.Done()
			lc.Done()
			st, _ = p.timed.state(tgt(0))
			if st != (latency.State{}) {
				t.Fatalf("after Done: %+v, want all zero", st)
			}
			if got := float64(p.latencyView(tgt(0)).Samples); got != tc.fedAfter {
				t.Fatalf("samples after Done %v, want %v (Done feeds a measured TTFT once)", got, tc.fedAfter)
			}
		})
	}
}

// TestKVRestartResetsFit: a new process_start_time_seconds in a worker's /metrics returns its
// fit to the prior; the first reading, or the same one again, does not.
func TestKVRestartResetsFit(t *testing.T) {
	e, p, clk := timedEngine(t, DefaultKVConfig(), nil)
	feed := func(n int) {
		for i := 0; i < n; i++ {
			_, lc, _ := e.Route(context.Background(), streamed(request(chain(uint64(i+5), 10+i*37))), kvCands(1))
			clk.advance(time.Duration(30+i) * time.Millisecond)
			lc.FirstToken()
			lc.Done()
		}
	}
	body := func(start string) {
		page := "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds " + start + "\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0\n"
		if err := p.load.FeedMetrics(tgt(0).Worker, []int{0}, strings.NewReader(page)); err != nil {
			t.Fatal(err)
		}
		p.checkRestarts()
	}
	feed(30)
	for _, tc := range []struct {
		start string
		want  int
	}{{"1700000000", 30}, {"1700000000", 30}, {"1700000999", 0}} {
		body(tc.start)
		if got := p.latencyView(tgt(0)).Samples; got != tc.want {
			t.Fatalf("after start time %s: %d samples, want %d", tc.start, got, tc.want)
		}
	}
}

// TestKVWorkerTimingWindows: the worker's own TTFT, prefill-time and iteration-token
// histograms become window means in the latency view; a reset of the counters starts over.
func TestKVWorkerTimingWindows(t *testing.T) {
	_, p, _ := timedEngine(t, DefaultKVConfig(), nil)
	p.timed.getOrCreate(tgt(0))
	page := func(ttftSum, ttftN, prefSum, prefN, tokSum, steps float64) string {
		return fmt.Sprintf("vllm:time_to_first_token_seconds_sum{engine=\"0\"} %g\nvllm:time_to_first_token_seconds_count{engine=\"0\"} %g\n"+
			"vllm:request_prefill_time_seconds_sum{engine=\"0\"} %g\nvllm:request_prefill_time_seconds_count{engine=\"0\"} %g\n"+
			"vllm:iteration_tokens_total_sum{engine=\"0\"} %g\nvllm:iteration_tokens_total_count{engine=\"0\"} %g\n",
			ttftSum, ttftN, prefSum, prefN, tokSum, steps)
	}
	deref := func(f *float64) float64 {
		if f == nil {
			return -1
		}
		return *f
	}
	for _, tc := range []struct {
		name                 string
		body                 string
		ttft, prefill, steps float64 // -1: absent
	}{
		{"first reading: no window yet", page(1, 10, 0.5, 10, 1000, 10), -1, -1, -1},
		{"one window", page(3, 20, 1.5, 20, 3000, 20), 200, 100, 200},
		{"smoothed", page(4, 30, 2.5, 30, 4000, 30), 200 + 0.3*(100-200), 100, 200 + 0.3*(100-200)},
		{"counters reset (restart): starts over, keeps the means", page(0.1, 1, 0.1, 1, 10, 1), 170, 100, 170},
	} {
		if err := p.load.FeedMetrics(tgt(0).Worker, []int{0}, strings.NewReader(tc.body)); err != nil {
			t.Fatal(err)
		}
		p.checkRestarts()
		v := p.latencyView(tgt(0))
		got := []float64{deref(v.WorkerTTFTMs), deref(v.WorkerPrefillMs), deref(v.WorkerTokensPerStep)}
		want := []float64{tc.ttft, tc.prefill, tc.steps}
		for i := range got {
			if math.Abs(got[i]-want[i]) > 1e-6 {
				t.Fatalf("%s: worker means %v, want %v", tc.name, got, want)
			}
		}
	}
}

// TestKVTimeExpire: an attempt never ended stops counting as queued once it is older than
// load_expiry; a younger one stays.
func TestKVTimeExpire(t *testing.T) {
	e, p, clk := timedEngine(t, DefaultKVConfig(), nil)
	if _, _, err := e.Route(context.Background(), streamed(request(chain(1, 64))), kvCands(1)); err != nil {
		t.Fatal(err)
	}
	clk.advance(p.cfg.LoadExpiry.D() / 2)
	_, lc, err := e.Route(context.Background(), streamed(request(chain(2, 32))), kvCands(1))
	if err != nil {
		t.Fatal(err)
	}
	lc.FirstToken()
	clk.advance(p.cfg.LoadExpiry.D()/2 + time.Second)
	if n := e.load.Expire(); n != 1 {
		t.Fatalf("expired %d attempts, want 1", n)
	}
	if st, _ := p.timed.state(tgt(0)); st.AheadTokens != 0 || st.DecodeRequests != 1 || st.DecodeKVTokens != 512 {
		t.Fatalf("after expiry: %+v, want only the younger attempt's decode", st)
	}
	lc.Done()
	if st, _ := p.timed.state(tgt(0)); st != (latency.State{}) {
		t.Fatalf("after Done: %+v", st)
	}
}

// slowWorker is a fake vLLM worker whose timing histograms follow a profile three times
// slower than the kv policy's prior: each window it finishes some prefills of a window-specific
// size and runs decode steps, and its /metrics page carries the cumulative _sum/_count.
type slowWorker struct {
	th                             latency.Theta
	params                         latency.Params
	prefSum, prefN, compSum, compN float64
	itlSum, itlN, iterSum, iterN   float64
	running                        float64
}

// window runs n prefills of about u uncached tokens each, and steps decode steps with
// decodes running, and returns the page a scrape then reads.
func (w *slowWorker) window(r *rand.Rand, n int, u float64, steps, decodes int) string {
	var computed, pairs float64
	for i := 0; i < n; i++ {
		ui := u * (0.8 + 0.4*r.Float64())
		computed += ui
		pairs += latency.Pairs(ui, 0)
		w.prefSum += latency.Dot(w.th, latency.PrefillFeatures(ui, 0, float64(decodes), 0, w.params)) / 1000
		w.compSum += ui
	}
	w.prefN += float64(n)
	w.compN += float64(n)
	stepMs := latency.StepMs(w.th, computed/float64(steps), pairs/float64(steps), 0)
	w.itlSum += float64(steps*decodes) * stepMs / 1000
	w.itlN += float64(steps * decodes)
	w.iterSum += computed + float64(steps*decodes)
	w.iterN += float64(steps)
	w.running = float64(decodes)
	return w.page()
}

func (w *slowWorker) page() string {
	var b strings.Builder
	for _, kv := range []struct {
		name string
		v    float64
	}{
		{"vllm:num_requests_running", w.running},
		{"vllm:request_prefill_time_seconds_sum", w.prefSum}, {"vllm:request_prefill_time_seconds_count", w.prefN},
		{"vllm:request_prefill_kv_computed_tokens_sum", w.compSum}, {"vllm:request_prefill_kv_computed_tokens_count", w.compN},
		{"vllm:inter_token_latency_seconds_sum", w.itlSum}, {"vllm:inter_token_latency_seconds_count", w.itlN},
		{"vllm:iteration_tokens_total_sum", w.iterSum}, {"vllm:iteration_tokens_total_count", w.iterN},
	} {
		fmt.Fprintf(&b, "%s{engine=\"0\",model_name=\"m\"} %g\n", kv.name, kv.v)
	}
	return b.String()
}

// TestKVLearnsSlowWorkerFromItsHistograms: with no request through the gateway at all, a
// worker three times slower than the prior is learned from its own prefill-time,
// computed-token and inter-token-latency histograms, scrape by scrape; the debug view names
// the sources. A counter reset (the worker restarted, no start time exposed) gives no sample,
// leaves the fit where it was, and the windows after it are learned again.
func TestKVLearnsSlowWorkerFromItsHistograms(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, p, clk := timedEngine(t, allSources(), reg)
	var slow latency.Theta
	for i, v := range p.timed.prior {
		slow[i] = 3 * v
	}
	w := &slowWorker{th: slow, params: p.timed.params}
	r := rand.New(rand.NewPCG(9, 1))
	scrape := func(page string) {
		t.Helper()
		clk.advance(time.Second)
		if err := p.load.FeedMetrics(tgt(0).Worker, []int{0}, strings.NewReader(page)); err != nil {
			t.Fatal(err)
		}
		p.checkRestarts()
	}
	run := func(windows int) {
		for i := 0; i < windows; i++ {
			scrape(w.window(r, 1+r.IntN(4), 200+r.Float64()*6000, 20+r.IntN(60), 1+r.IntN(30)))
		}
	}
	probe := latency.PrefillFeatures(3000, 0, 10, 0, p.timed.params)
	relErr := func() float64 {
		_, th := p.timed.state(tgt(0))
		want := latency.Dot(slow, probe)
		return math.Abs(latency.Dot(th, probe)-want) / want
	}
	before := relErr()
	scrape(w.page()) // the first reading only opens a window
	run(80)
	v := p.latencyView(tgt(0))
	if !v.Ready {
		t.Fatalf("fit not ready from the worker's histograms: %+v", v.Sources)
	}
	if got := relErr(); got > 0.15 {
		t.Fatalf("prefill of 3,000 tokens off by %.0f%% (prior %.0f%%)", 100*got, 100*before)
	}
	if s := v.Sources["worker_prefill"]; s.Samples != 80 || s.Error <= 0 {
		t.Fatalf("worker_prefill source %+v, want 80 samples with an error", s)
	}
	if s := v.Sources["worker_step"]; s.Samples != 80 {
		t.Fatalf("worker_step source %+v, want 80 samples", s)
	}
	if v.Sources["gateway_ttft"].Samples != 0 || v.WorkerITLMs == nil {
		t.Fatalf("view %+v: want no gateway samples and the worker's ITL", v)
	}
	if got := metricValue(t, p.timed.metrics.samples.WithLabelValues(tgt(0).String(), "worker_prefill")); got != 80 {
		t.Fatalf("kvgate_router_latency_fit_samples_total{source=worker_prefill} = %v, want 80", got)
	}

	// The worker restarts: its counters begin again. By the next scrape it has finished more
	// prefills than the old process had (so that count alone went up) but run fewer steps:
	// differences across the restart are no window.
	_, thBefore := p.timed.state(tgt(0))
	samples := v.Samples
	oldPrefills := int(w.prefN)
	*w = slowWorker{th: slow, params: p.timed.params}
	scrape(w.window(r, oldPrefills+50, 3000, 30, 5))
	if _, th := p.timed.state(tgt(0)); th != thBefore || p.latencyView(tgt(0)).Samples != samples {
		t.Fatalf("a counter reset moved the fit: theta %v → %v, samples %d → %d", thBefore, th, samples, p.latencyView(tgt(0)).Samples)
	}
	scrape(w.page()) // counts did not move: no sample
	if got := p.latencyView(tgt(0)).Samples; got != samples {
		t.Fatalf("an unchanged reading gave %d samples", got-samples)
	}
	run(20)
	if got := relErr(); got > 0.15 {
		t.Fatalf("after the reset, prefill of 3,000 tokens off by %.0f%%", 100*got)
	}
	if got := p.latencyView(tgt(0)).Samples; got != samples+40 {
		t.Fatalf("after the reset: %d samples, want %d", got, samples+40)
	}
}

// TestKVGatewayITLSample: a completed streamed response with enough events after its first
// token gives the fit one step-time sample (the mean time between them); a short one, a
// failed one or a non-streamed one gives none.
func TestKVGatewayITLSample(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream bool
		events int
		fail   bool
		want   int
	}{
		{"long stream", true, 64, false, 1},
		{"short stream", true, minITLEvents - 1, false, 0},
		{"failed", true, 64, true, 0},
		{"not streamed", false, 64, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, p, clk := timedEngine(t, allSources(), nil)
			req := request(chain(3, 20))
			if tc.stream {
				req = streamed(req)
			}
			_, lc, err := e.Route(context.Background(), req, kvCands(1))
			if err != nil {
				t.Fatal(err)
			}
			clk.advance(40 * time.Millisecond)
			lc.FirstToken()
			for i := 0; i < tc.events; i++ {
				clk.advance(12 * time.Millisecond)
				lc.Chunk()
			}
			if tc.fail {
				lc.Failed(nil)
			} else {
				lc.Done()
			}
			s := p.latencyView(tgt(0)).Sources["gateway_itl"]
			if s.Samples != tc.want {
				t.Fatalf("gateway_itl samples %d, want %d", s.Samples, tc.want)
			}
			if tc.want == 0 {
				return
			}
			if !(s.Error > 0) || math.IsInf(s.Error, 0) {
				t.Fatalf("gateway_itl error %v, want a finite positive error", s.Error)
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

// TestWorkingSets: a conversation's next turn, which extends the last prompt, adds only its new
// blocks (to within the stride kept out at its end); an unrelated prompt adds its own; keys
// older than the window leave, and the count follows them.
func TestWorkingSets(t *testing.T) {
	now := time.Unix(1000, 0)
	ws := newWorkingSets(time.Minute)
	turn := chain(1, 64+16*40) // 704 blocks: every block a key or a stride's end
	for _, tc := range []struct {
		name   string
		hashes []kvkey.BlockHash
		at     time.Duration
		want   float64
	}{
		{"first turn", turn[:64+16*20], 0, 64 + 16*20},
		{"same turn again", turn[:64+16*20], time.Second, 64 + 16*20},
		{"next turn extends it", turn, 2 * time.Second, 64 + 16*40},
		{"tail short of a stride is left out", append(append([]kvkey.BlockHash{}, turn...), chain(2, 15)...), 3 * time.Second, 64 + 16*40},
		{"unrelated prompt", chain(3, 100), 4 * time.Second, 64 + 16*40 + 64 + 32},
	} {
		ws.record(tgt(0), tc.hashes, now.Add(tc.at))
		if got := ws.blocks(tgt(0)); got != tc.want {
			t.Fatalf("%s: %v blocks, want %v", tc.name, got, tc.want)
		}
	}
	ws.expire(now.Add(3*time.Second + 1)) // only the unrelated prompt was routed since
	if got := ws.blocks(tgt(0)); got != 64+32 {
		t.Fatalf("after expiry: %v blocks, want 96", got)
	}
	ws.forget(tgt(0))
	if got := ws.blocks(tgt(0)); got != 0 {
		t.Fatalf("after forget: %v", got)
	}
}

// TestWorkingSetsNewerThanPrefix: the blocks routed to a target after a cached prefix was last
// used there are those of later prompts only; using the prefix again makes it the newest;
// expiry takes the expired keys out of the count; a prefix the set does not hold is older
// than all of it; an old bucket reused after the window counts only its new keys.
func TestWorkingSetsNewerThanPrefix(t *testing.T) {
	now := time.Unix(1000, 0)
	ws := newWorkingSets(time.Minute)
	a, b, c := chain(1, 64+16*20), chain(2, 100), chain(3, 64+16*10) // 384, 96 and 224 blocks
	steps := []struct {
		name   string
		hashes []kvkey.BlockHash // routed at step i seconds (nil: none)
		expire time.Duration     // expire keys older than this (0: none)
		prefix []kvkey.BlockHash
		cached int
		want   float64
	}{
		{"a alone", a, 0, a, len(a), 0},
		{"b after a", b, 0, a, len(a), 96},
		{"c after both", c, 0, a, 100, 96 + 224},
		{"the newest has none newer", nil, 0, c, len(c), 0},
		{"a used again", a, 0, b, len(b), 224 + 384},
		{"a is the newest now", nil, 0, a, len(a), 0},
		{"b expired: c and a newer than the unknown b", nil, 2 * time.Second, b, len(b), 224 + 384},
		{"a prefix the set never held is older than it all", nil, 0, chain(9, 10), 10, 224 + 384},
		{"nothing cached", nil, 0, a, 0, 0},
	}
	for i, st := range steps {
		at := now.Add(time.Duration(i) * time.Second)
		if st.hashes != nil {
			ws.record(tgt(0), st.hashes, at)
		}
		if st.expire > 0 {
			ws.expire(now.Add(st.expire))
		}
		if got := ws.newerThanPrefix(tgt(0), st.prefix, st.cached); got != st.want {
			t.Fatalf("%s: %v blocks newer, want %v", st.name, got, st.want)
		}
	}
	// Long after the window, in slots the first keys used: only the new prompt counts.
	later := now.Add(ageSlots * time.Second)
	ws.expire(later.Add(-time.Minute))
	ws.record(tgt(0), b, later)
	ws.record(tgt(0), c, later.Add(time.Second))
	if got := ws.newerThanPrefix(tgt(0), b, len(b)); got != 224 {
		t.Fatalf("after the window: %v blocks newer than b, want 224", got)
	}
}

// TestWorkingSetsMove: a prompt routed to another target takes its deep keys along (its
// session will not ask the old worker for them again), leaving the shared first heldExact
// blocks on both; expiry and forget leave no owner behind.
func TestWorkingSetsMove(t *testing.T) {
	now := time.Unix(1000, 0)
	ws := newWorkingSets(time.Minute)
	turn := chain(1, 64+16*40)
	steps := []struct {
		name         string
		to           int
		want0, want1 float64
	}{
		{"first on 0", 0, 64 + 16*40, 0},
		{"moved to 1", 1, 64, 64 + 16*40},
		{"back on 0", 0, 64 + 16*40, 64},
	}
	for i, st := range steps {
		ws.record(tgt(st.to), turn, now.Add(time.Duration(i)*time.Second))
		if got0, got1 := ws.blocks(tgt(0)), ws.blocks(tgt(1)); got0 != st.want0 || got1 != st.want1 {
			t.Fatalf("%s: %v and %v blocks, want %v and %v", st.name, got0, got1, st.want0, st.want1)
		}
	}
	ws.forget(tgt(0))
	ws.record(tgt(1), turn, now.Add(10*time.Second)) // the forgotten set is no owner any more
	if got := ws.blocks(tgt(1)); got != 64+16*40 {
		t.Fatalf("after forget and a new route: %v blocks", got)
	}
	ws.expire(now.Add(time.Hour))
	if got, n := ws.blocks(tgt(1)), len(ws.owner); got != 0 || n != 0 {
		t.Fatalf("after expiry: %v blocks, %d owned keys", got, n)
	}
}

// allSources is the default config with the fit learning from every sample source
// (router.latency.learn_from lists only gateway_ttft by default).
func allSources() KVConfig {
	c := DefaultKVConfig()
	c.Latency.LearnFrom = routerconfig.LearnSources()
	return c
}

// The default learns from the gateway's TTFTs only: a worker's histograms and the gateway's
// inter-event times are not fed unless router.latency.learn_from names them.
func TestKVLearnFromDefaultIgnoresWorkerSources(t *testing.T) {
	_, p, _ := timedEngine(t, DefaultKVConfig(), nil)
	if !p.timed.learnFrom[latency.SourceTTFT] || p.timed.learnFrom[latency.SourceWorkerPrefill] ||
		p.timed.learnFrom[latency.SourceWorkerStep] || p.timed.learnFrom[latency.SourceGatewayITL] {
		t.Fatalf("default sources %v, want gateway_ttft only", p.timed.learnFrom)
	}
	if got, want := routerconfig.LearnSources(), latency.SourceNames(); !slices.Equal(got, want[:]) {
		t.Fatalf("routerconfig's source names %v differ from the model's %v", got, want)
	}
}
