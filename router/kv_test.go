package router

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/sessions"
)

// loadSpec puts load on a target before the decision: a request of otherBlocks blocks with
// unrelated hashes, optionally past its first token.
type loadSpec struct {
	otherBlocks int
	firstToken  bool
}

// TestKVCost pins the cost function of docs/ARCHITECTURE.md "Routing cost" as kvgate adapts it: uncached
// prompt blocks after tier credits, plus the gateway-accounted load.
func TestKVCost(t *testing.T) {
	const blocks = 128
	cases := []struct {
		name    string
		matches map[int]indexers.TierMatch
		load    map[int]loadSpec
		cands   []int
		want    int
	}{
		{name: "most overlap wins at equal load",
			matches: map[int]indexers.TierMatch{0: {G1: 10}, 1: {G1: 50}, 2: {G1: 0}},
			cands:   []int{0, 1, 2}, want: 1},
		{name: "overlap still wins under load lighter than the overlap",
			// target 0: 64 uncached + (16 prefill + 16 decode) load = 96 < 128 (idle, no overlap)
			matches: map[int]indexers.TierMatch{0: {G1: 64}},
			load:    map[int]loadSpec{0: {otherBlocks: 16}},
			cands:   []int{0, 1}, want: 0},
		{name: "loaded worker loses to idle once load outweighs overlap",
			// target 0: 64 + (48 + 48) = 160 > 128
			matches: map[int]indexers.TierMatch{0: {G1: 64}},
			load:    map[int]loadSpec{0: {otherBlocks: 48}},
			cands:   []int{0, 1}, want: 1},
		{name: "past its first token the other request weighs only its blocks",
			// target 0: 64 + 48 = 112 < 128
			matches: map[int]indexers.TierMatch{0: {G1: 64}},
			load:    map[int]loadSpec{0: {otherBlocks: 48, firstToken: true}},
			cands:   []int{0, 1}, want: 0},
		{name: "G2 hit beats a miss",
			matches: map[int]indexers.TierMatch{1: {G2: 100}},
			cands:   []int{1, 2}, want: 1},
		{name: "GPU hit beats the same G2 hit",
			matches: map[int]indexers.TierMatch{0: {G1: 100}, 1: {G2: 100}},
			cands:   []int{0, 1, 2}, want: 0},
		{name: "G3 hit beats a miss",
			matches: map[int]indexers.TierMatch{1: {G2: 100}, 2: {G3: 100}},
			cands:   []int{2, 3}, want: 2},
		{name: "G2 hit beats the same G3 hit",
			matches: map[int]indexers.TierMatch{1: {G2: 100}, 2: {G3: 100}},
			cands:   []int{1, 2, 3}, want: 1},
		{name: "tier extension adds to G1",
			matches: map[int]indexers.TierMatch{0: {G1: 60}, 1: {G1: 60, G2: 40}},
			cands:   []int{0, 1}, want: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := fixedMatcher{}
			for i, tm := range tc.matches {
				m[tgt(i)] = tm
			}
			p := newTestKV(t, PolicyKVBlocks, DefaultKVConfig(), KVDeps{Matcher: m}, nil)
			for i, ls := range tc.load {
				h := p.Load().Begin(tgt(i), request(chain(uint64(900+i), ls.otherBlocks)), 0)
				if ls.firstToken {
					h.FirstToken()
				}
			}
			var cs []Candidate
			for _, i := range tc.cands {
				cs = append(cs, Candidate{Target: tgt(i)})
			}
			d, err := p.Pick(context.Background(), request(chain(1, blocks)), cs)
			if err != nil {
				t.Fatal(err)
			}
			if d.Chosen.Target != tgt(tc.want) {
				t.Fatalf("chose %v, want %v; decision %s", d.Chosen.Target, tgt(tc.want), js(d))
			}
		})
	}
}

// TestKVCostValues checks the numbers in the decision record against the formula.
func TestKVCostValues(t *testing.T) {
	m := fixedMatcher{tgt(0): {G1: 100}, tgt(1): {G2: 100}, tgt(2): {G3: 100}, tgt(3): {G1: 20, G2: 8, G3: 4}}
	p := newTestKV(t, PolicyKVBlocks, DefaultKVConfig(), KVDeps{Matcher: m}, nil)
	d, err := p.Pick(context.Background(), request(chain(1, 128)), kvCands(5))
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{28, 128 - 75, 128 - 25, 128 - (20 + 6 + 1), 128}
	for i, c := range d.Candidates {
		if c.Cost != want[i] || c.Load != 0 || c.Mode != ModeEvents {
			t.Errorf("candidate %d: cost %v load %v mode %q, want cost %v load 0 mode events", i, c.Cost, c.Load, c.Mode, want[i])
		}
	}
	if c := d.Candidates[3]; c.G1Blocks != 20 || c.G2Blocks != 8 || c.G3Blocks != 4 {
		t.Errorf("tier blocks not recorded: %s", js(c))
	}
	if d.PromptBlocks != 128 || d.PromptTokens != 2048 || d.Policy != "kv_blocks" {
		t.Errorf("header fields: %s", js(d))
	}
	if CachedBlocks(d) != 100 || CachedBlocksHeader(d) != "100" {
		t.Errorf("cached blocks %d", CachedBlocks(d))
	}
}

// TestKVSharedActiveBlocks: a target already decoding the same prompt adds no new KV blocks, so
// it beats an idle target (Dynamo lib/kv-router/src/sequences, additional_active_blocks).
func TestKVSharedActiveBlocks(t *testing.T) {
	hashes := chain(1, 128)
	m := fixedMatcher{tgt(0): {G1: 128}, tgt(1): {G1: 128}}
	p := newTestKV(t, PolicyKVBlocks, DefaultKVConfig(), KVDeps{Matcher: m}, nil)
	same := p.Load().Begin(tgt(0), request(hashes), 128)
	same.FirstToken()
	other := p.Load().Begin(tgt(1), request(chain(2, 128)), 0)
	other.FirstToken()
	d, err := p.Pick(context.Background(), request(hashes), kvCands(2))
	if err != nil {
		t.Fatal(err)
	}
	if d.Chosen.Target != tgt(0) || d.Candidates[0].Load != 0 || d.Candidates[1].Load != 128 {
		t.Fatalf("want target 0 with load 0 vs 128: %s", js(d))
	}
	// Half the prompt shared: the discount is exactly the shared prefix.
	half := p.Load().Begin(tgt(1), request(hashes[:64]), 0)
	half.FirstToken()
	d, _ = p.Pick(context.Background(), request(hashes), kvCands(2))
	if got := d.Candidates[1].Load; got != 128 { // 128 + 64 held − 64 shared
		t.Fatalf("load with a half-shared prefix = %v, want 128", got)
	}
}

// TestKVBusyThresholds: targets over the waiting-queue or KV-usage thresholds are avoided while
// any other is not (docs/ARCHITECTURE.md, "Routing cost"); stale metrics never mark a target busy.
func TestKVBusyThresholds(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	cases := []struct {
		name       string
		metrics    map[int]WorkerMetrics
		age        time.Duration
		want       int
		reasonPart string
	}{
		{name: "idle: best overlap", want: 0, reasonPart: "lowest cost"},
		{name: "waiting queue over threshold", metrics: map[int]WorkerMetrics{0: {Waiting: 16}}, want: 1, reasonPart: "avoided 1 busy"},
		{name: "kv usage over threshold", metrics: map[int]WorkerMetrics{0: {KVUsage: 1}}, want: 1, reasonPart: "kv usage 1.00"},
		{name: "just under thresholds", metrics: map[int]WorkerMetrics{0: {Waiting: 15, KVUsage: 0.98}}, want: 0, reasonPart: "lowest cost"},
		{name: "all busy: lowest cost anyway", metrics: map[int]WorkerMetrics{0: {Waiting: 20}, 1: {KVUsage: 1}},
			want: 0, reasonPart: "all 2 targets over busy thresholds"},
		{name: "stale metrics ignored", metrics: map[int]WorkerMetrics{0: {Waiting: 50}}, age: 10 * time.Second, want: 0, reasonPart: "lowest cost"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := fixedMatcher{tgt(0): {G1: 120}}
			cfg := DefaultKVConfig()
			cfg.WaitingWeight = 0 // isolate the thresholds from the queue cost
			p := newTestKV(t, PolicyKVBlocks, cfg, KVDeps{Matcher: m}, clk)
			for i, wm := range tc.metrics {
				wm.At = clk.t.Add(-tc.age)
				p.Load().UpdateMetrics(tgt(i), wm)
			}
			d, err := p.Pick(context.Background(), request(chain(1, 128)), kvCands(2))
			if err != nil {
				t.Fatal(err)
			}
			if d.Chosen.Target != tgt(tc.want) {
				t.Fatalf("chose %v want %v (%s)", d.Chosen.Target, tgt(tc.want), d.Chosen.Reason)
			}
			if !strings.Contains(d.Chosen.Reason, tc.reasonPart) {
				t.Fatalf("reason %q lacks %q", d.Chosen.Reason, tc.reasonPart)
			}
		})
	}
}

// TestKVMetricsCorrection: a worker's own report raises the load the gateway sees when it is
// higher than the gateway's accounting (traffic from elsewhere).
func TestKVMetricsCorrection(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := newTestKV(t, PolicyKVBlocks, DefaultKVConfig(), KVDeps{Matcher: fixedMatcher{}}, clk)
	p.Load().UpdateMetrics(tgt(0), WorkerMetrics{Waiting: 2, KVUsage: 0.5, NumGPUBlocks: 1000, At: clk.t})
	d, _ := p.Pick(context.Background(), request(chain(1, 128)), kvCands(2))
	// 500 blocks in use + 2 unseen waiting × 32.
	if got := d.Candidates[0].Load; got != 500+64 {
		t.Fatalf("corrected load %v, want 564", got)
	}
	if d.Chosen.Target != tgt(1) {
		t.Fatalf("chose the loaded target")
	}
	// Our own request waiting there explains one of the two waiting requests.
	p.Load().Begin(tgt(0), request(chain(5, 8)), 0)
	d, _ = p.Pick(context.Background(), request(chain(1, 128)), kvCands(2))
	if got := d.Candidates[0].Load; got != 8+500+32 {
		t.Fatalf("corrected load with one of ours waiting %v, want 540", got)
	}
}

// TestKVTiesSpread: equal costs are broken uniformly at random (Dynamo selector/default.rs, minimum_cost_index).
func TestKVTiesSpread(t *testing.T) {
	p := newTestKV(t, PolicyKVBlocks, DefaultKVConfig(), KVDeps{Matcher: fixedMatcher{}}, nil)
	const n, picks = 4, 4000
	count := map[kvkey.Target]int{}
	for range picks {
		d, err := p.Pick(context.Background(), request(chain(1, 32)), kvCands(n))
		if err != nil {
			t.Fatal(err)
		}
		count[d.Chosen.Target]++
		if !strings.Contains(d.Chosen.Reason, "tie among 4") {
			t.Fatalf("reason %q", d.Chosen.Reason)
		}
	}
	for i := range n {
		if c := count[tgt(i)]; c < picks/n*8/10 || c > picks/n*12/10 {
			t.Fatalf("target %d picked %d of %d times: %v", i, c, picks, count)
		}
	}
}

// TestKVTemperature: a softmax draw sometimes takes the worse target, more often the better.
func TestKVTemperature(t *testing.T) {
	cfg := DefaultKVConfig()
	cfg.Temperature = 1
	p := newTestKV(t, PolicyKVBlocks, cfg, KVDeps{Matcher: fixedMatcher{tgt(0): {G1: 64}}}, nil)
	count := map[kvkey.Target]int{}
	for range 2000 {
		d, _ := p.Pick(context.Background(), request(chain(1, 128)), kvCands(2))
		count[d.Chosen.Target]++
	}
	// p(worse) = e^-1 / (1 + e^-1) ≈ 0.269.
	if w := count[tgt(1)]; w < 430 || w > 650 {
		t.Fatalf("worse target drawn %d/2000 times, want ≈ 538", w)
	}
}

// TestKVHints: a session hint is credit in blocks; it can decide, is named in the reason, and
// never overrides a busy threshold.
func TestKVHints(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	m := fixedMatcher{tgt(0): {G1: 20}}
	hint := fixedHints{{Target: tgt(1), Rule: "affinity", Blocks: 40}}
	p := newTestKV(t, PolicyKVBlocks, DefaultKVConfig(), KVDeps{Matcher: m, Hints: hint}, clk)
	req := request(chain(1, 128))
	req.SessionID = "s1"
	d, _ := p.Pick(context.Background(), req, kvCands(2))
	if d.Chosen.Target != tgt(1) || !strings.Contains(d.Chosen.Reason, "session rule affinity (+40 blocks) decided") {
		t.Fatalf("hint did not decide: %s", js(d.Chosen))
	}
	// Without a session the hint source is not asked.
	d, _ = p.Pick(context.Background(), request(chain(1, 128)), kvCands(2))
	if d.Chosen.Target != tgt(0) {
		t.Fatalf("sessionless request followed a hint")
	}
	// A weak hint agrees with a winner that wins anyway.
	p2 := newTestKV(t, PolicyKVBlocks, DefaultKVConfig(), KVDeps{Matcher: m, Hints: fixedHints{{Target: tgt(0), Rule: "parent", Blocks: 4}}}, clk)
	d, _ = p2.Pick(context.Background(), req, kvCands(2))
	if d.Chosen.Target != tgt(0) || !strings.Contains(d.Chosen.Reason, "session rule parent (+4 blocks) agreed") {
		t.Fatalf("reason %q", d.Chosen.Reason)
	}
	// Busy target: the hint loses.
	p.Load().UpdateMetrics(tgt(1), WorkerMetrics{Waiting: 30, At: clk.t})
	d, _ = p.Pick(context.Background(), req, kvCands(2))
	if d.Chosen.Target != tgt(0) {
		t.Fatalf("hint overrode a busy threshold: %s", js(d.Chosen))
	}
}

// TestKVNoLoad: overlap only; load and thresholds do not matter.
func TestKVNoLoad(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := newTestKV(t, PolicyKVNoLoad, DefaultKVConfig(), KVDeps{Matcher: fixedMatcher{tgt(0): {G1: 64}}}, clk)
	p.Load().Begin(tgt(0), request(chain(9, 1000)), 0)
	p.Load().UpdateMetrics(tgt(0), WorkerMetrics{Waiting: 100, At: clk.t})
	d, _ := p.Pick(context.Background(), request(chain(1, 128)), kvCands(2))
	if d.Chosen.Target != tgt(0) || d.Policy != "kv_no_load" || d.Candidates[0].Load != 0 {
		t.Fatalf("kv_no_load: %s", js(d))
	}
}

// TestKVModes: targets whose events are unhealthy are scored from the approximate index.
func TestKVModes(t *testing.T) {
	hashes := chain(1, 64)
	approx := NewApproxIndex(DefaultKVConfig().Approximate)
	approx.Record(tgt(1), hashes[:40])
	m := fixedMatcher{tgt(0): {G1: 10}, tgt(1): {G1: 64}} // the stale index claims 64 for target 1
	healthy := EventHealthFunc(func(t kvkey.Target) bool { return t == tgt(0) })
	p := newTestKV(t, PolicyKVBlocks, DefaultKVConfig(), KVDeps{Matcher: m, Events: healthy, Approx: approx}, nil)
	d, _ := p.Pick(context.Background(), request(hashes), kvCands(3))
	got := []CandidateScore{d.Candidates[0], d.Candidates[1], d.Candidates[2]}
	if got[0].Mode != ModeEvents || got[0].G1Blocks != 10 {
		t.Errorf("target 0: %s", js(got[0]))
	}
	if got[1].Mode != ModeApproximate || got[1].G1Blocks != 40 {
		t.Errorf("target 1: %s", js(got[1]))
	}
	if got[2].Mode != ModeApproximate || got[2].G1Blocks != 0 {
		t.Errorf("target 2: %s", js(got[2]))
	}
	if d.Chosen.Target != tgt(1) {
		t.Errorf("chose %v", d.Chosen.Target)
	}
}

func TestKVConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*KVConfig)
		want string
	}{
		{"defaults", func(*KVConfig) {}, ""},
		{"g2 over 1", func(c *KVConfig) { c.G2Credit = 1.5 }, "router.g2_credit"},
		{"negative weight", func(c *KVConfig) { c.DecodeWeight = -1 }, "router.decode_weight"},
		{"zero ttl", func(c *KVConfig) { c.Approximate.TTL = 0 }, "router.approximate.ttl"},
		{"zero budget", func(c *KVConfig) { c.Approximate.BlockBudget = 0 }, "router.approximate.block_budget"},
		{"max age below interval", func(c *KVConfig) { c.MetricsInterval = c.MetricsMaxAge * 2 }, "router.metrics_max_age"},
		// Every problem is reported at once, not only the first.
		{"all problems", func(c *KVConfig) { c.G2Credit, c.Approximate.BlockBudget = 2, 0 }, "router.g2_credit: must be between 0 and 1, got 2\nrouter.approximate.block_budget"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultKVConfig()
			tc.mod(&c)
			err := validateKV(c)
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want error mentioning %q", err, tc.want)
			}
			if _, err := NewKV(c, KVDeps{}); (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("NewKV error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// prefixHints implements PrefixHintSource and records the hashes it was given.
type prefixHints struct {
	fixedHints
	got []kvkey.BlockHash
}

func (p *prefixHints) HintsWithPrefix(_, _ string, hashes []kvkey.BlockHash) []sessions.Hint {
	p.got = hashes
	return append(p.fixedHints, sessions.Hint{Target: tgt(1), Rule: "sibling_prefix", Blocks: 30})
}

// TestKVPrefixHints: a hint source that credits in-flight sibling prefixes is given the prompt's
// hashes; several hints on one target add up and all their rules are named.
func TestKVPrefixHints(t *testing.T) {
	src := &prefixHints{fixedHints: fixedHints{{Target: tgt(1), Rule: "parent", Blocks: 20}}}
	p := newTestKV(t, PolicyKVBlocks, DefaultKVConfig(), KVDeps{Matcher: fixedMatcher{tgt(0): {G1: 40}}, Hints: src}, nil)
	req := request(chain(1, 128))
	req.ParentSessionID = "root"
	d, _ := p.Pick(context.Background(), req, kvCands(2))
	if len(src.got) != 128 {
		t.Fatalf("hint source got %d hashes", len(src.got))
	}
	if d.Chosen.Target != tgt(1) || d.Candidates[1].Cost != 78 ||
		!strings.Contains(d.Chosen.Reason, "session rule parent+sibling_prefix (+50 blocks) decided") {
		t.Fatalf("decision %s", js(d))
	}
}

// The session tracker is the production hint source.
var _ PrefixHintSource = (*sessions.Tracker)(nil)
