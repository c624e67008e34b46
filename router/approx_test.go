package router

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/confval"
	"github.com/kvgate/kvgate/kvkey"
)

func newTestApprox(ttl time.Duration, budget int, clk *fakeClock) *ApproxIndex {
	a := NewApproxIndex(ApproxConfig{TTL: confval.Duration(ttl), BlockBudget: budget})
	a.now = clk.now
	return a
}

func TestApproxMatch(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	a := newTestApprox(time.Minute, 1000, clk)
	p := chain(1, 20)
	a.Record(tgt(0), p)
	a.Record(tgt(1), p[:8])
	a.Record(tgt(2), chain(2, 20))
	diverged := append(append([]kvkey.BlockHash{}, p[:12]...), chain(3, 8)...)
	cases := []struct {
		name   string
		hashes []kvkey.BlockHash
		want   []int
	}{
		{"full prompt", p, []int{20, 8, 0, 0}},
		{"shorter prompt", p[:5], []int{5, 5, 0, 0}},
		{"diverging tail", diverged, []int{12, 8, 0, 0}},
		{"unknown", chain(9, 4), []int{0, 0, 0, 0}},
		{"empty", nil, []int{0, 0, 0, 0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			targets := []kvkey.Target{tgt(0), tgt(1), tgt(2), tgt(3)}
			out := make([]int, len(targets))
			a.Match(tc.hashes, targets, out)
			for i := range out {
				if out[i] != tc.want[i] {
					t.Fatalf("match %v, want %v", out, tc.want)
				}
			}
		})
	}
}

// TestApproxManyTargets crosses the 64-target bitset word boundary.
func TestApproxManyTargets(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	a := newTestApprox(time.Minute, 1000, clk)
	p := chain(1, 100)
	var targets []kvkey.Target
	for i := range 130 {
		tg := kvkey.Target{Worker: "w", DPRank: i}
		targets = append(targets, tg)
		a.Record(tg, p[:i%101])
	}
	out := make([]int, len(targets))
	a.Match(p, targets, out)
	for i := range out {
		if out[i] != i%101 {
			t.Fatalf("target %d: %d, want %d", i, out[i], i%101)
		}
	}
}

func TestApproxTTL(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	a := newTestApprox(time.Minute, 1000, clk)
	p, q := chain(1, 10), chain(2, 10)
	a.Record(tgt(0), p)
	clk.advance(40 * time.Second)
	a.Record(tgt(0), q)
	clk.advance(30 * time.Second) // p is 70 s old, q 30 s
	if n := a.Expire(); n != 10 {
		t.Fatalf("expired %d, want 10", n)
	}
	out := make([]int, 1)
	a.Match(p, []kvkey.Target{tgt(0)}, out)
	if out[0] != 0 {
		t.Fatalf("expired prompt still matches %d", out[0])
	}
	a.Match(q, []kvkey.Target{tgt(0)}, out)
	if out[0] != 10 {
		t.Fatalf("fresh prompt matches %d", out[0])
	}
	// Using a prompt again renews it.
	clk.advance(50 * time.Second)
	a.Record(tgt(0), q)
	clk.advance(50 * time.Second)
	a.Expire()
	if a.Match(q, []kvkey.Target{tgt(0)}, out); out[0] != 10 {
		t.Fatalf("renewed prompt expired")
	}
}

// TestApproxBudget: over budget the least recently used blocks go, deepest blocks of a prompt
// first, so an older prompt keeps its leading blocks.
func TestApproxBudget(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	a := newTestApprox(time.Hour, 10, clk)
	p, q := chain(1, 8), chain(2, 8)
	a.Record(tgt(0), p)
	a.Record(tgt(0), q)
	a.Record(tgt(1), p) // another target's budget is its own
	targets := []kvkey.Target{tgt(0), tgt(1)}
	out := make([]int, 2)
	a.Match(p, targets, out)
	if out[0] != 2 || out[1] != 8 {
		t.Fatalf("older prompt after budget eviction: %v, want [2 8]", out)
	}
	a.Match(q, targets, out)
	if out[0] != 8 || out[1] != 0 {
		t.Fatalf("newer prompt: %v", out)
	}
	if r := a.Resident(tgt(0)); r != 10 {
		t.Fatalf("resident %d, want the budget 10", r)
	}
	// A prompt longer than the budget keeps its first budget blocks.
	long := chain(3, 25)
	a.Record(tgt(0), long)
	a.Match(long, targets, out)
	if out[0] != 10 {
		t.Fatalf("long prompt keeps %d, want 10", out[0])
	}
	a.Forget(tgt(0))
	if a.Resident(tgt(0)) != 0 || len(a.blocks) != 8 {
		t.Fatalf("forget left %d resident, %d blocks", a.Resident(tgt(0)), len(a.blocks))
	}
}

// TestApproxRepeatedPromptSticks: through the engine with no event index at all, a repeated
// prompt goes back to the target that served it; a new prompt is free to go elsewhere.
func TestApproxRepeatedPromptSticks(t *testing.T) {
	p, err := NewKV(DefaultKVConfig(), KVDeps{Approx: NewApproxIndex(DefaultKVConfig().Approximate)})
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewEngine(EngineOptions{KV: p})
	if err != nil {
		t.Fatal(err)
	}
	cs := kvCands(4)
	spread := map[kvkey.Target]bool{}
	for i := range 8 {
		prompt := chain(uint64(10+i), 256)
		d1, h, err := pickAndBegin(context.Background(), e, request(prompt), cs)
		if err != nil {
			t.Fatal(err)
		}
		h.FirstToken()
		h.Done()
		spread[d1.Chosen.Target] = true
		d2, err := e.Pick(context.Background(), request(prompt), cs)
		if err != nil {
			t.Fatal(err)
		}
		row, _ := ChosenScore(d2)
		if d2.Chosen.Target != d1.Chosen.Target || row.G1Blocks != 256 || row.Mode != ModeApproximate {
			t.Fatalf("repeat went to %v (%s), first to %v", d2.Chosen.Target, js(row), d1.Chosen.Target)
		}
	}
	if len(spread) < 2 {
		t.Fatalf("8 distinct prompts all went to one target: %v", spread)
	}
}
