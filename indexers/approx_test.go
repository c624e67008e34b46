package indexers

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

func newTestApprox(ttl time.Duration, budget int, clk *fakeClock) *ApproxIndex {
	a := NewApproxIndex(ttl, budget)
	a.now = clk.now
	return a
}

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func tgt(i int) kvkey.Target { return kvkey.Target{Worker: fmt.Sprintf("http://127.0.0.1:%d", 8100+i)} }

// chain returns n distinct block hashes derived from base.
func chain(base uint64, n int) []kvkey.BlockHash {
	h := make([]kvkey.BlockHash, n)
	for i := range h {
		h[i] = kvkey.BlockHash(base<<32 | uint64(i+1))
	}
	return h
}

// matchG1 runs MatchTiers and writes each target's G1 into out, checking that approximate mode
// never claims a host or disk tier.
func matchG1(t *testing.T, a *ApproxIndex, hashes []kvkey.BlockHash, targets []kvkey.Target, out []int) {
	t.Helper()
	m := make([]TierMatch, len(targets))
	a.MatchTiers(hashes, targets, m)
	for i := range m {
		if m[i].G2 != 0 || m[i].G3 != 0 {
			t.Fatalf("target %d: approximate match %+v has host or disk blocks", i, m[i])
		}
		out[i] = m[i].G1
	}
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
			matchG1(t, a, tc.hashes, targets, out)
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
	matchG1(t, a, p, targets, out)
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
	matchG1(t, a, p, []kvkey.Target{tgt(0)}, out)
	if out[0] != 0 {
		t.Fatalf("expired prompt still matches %d", out[0])
	}
	matchG1(t, a, q, []kvkey.Target{tgt(0)}, out)
	if out[0] != 10 {
		t.Fatalf("fresh prompt matches %d", out[0])
	}
	// Using a prompt again renews it.
	clk.advance(50 * time.Second)
	a.Record(tgt(0), q)
	clk.advance(50 * time.Second)
	a.Expire()
	if matchG1(t, a, q, []kvkey.Target{tgt(0)}, out); out[0] != 10 {
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
	matchG1(t, a, p, targets, out)
	if out[0] != 2 || out[1] != 8 {
		t.Fatalf("older prompt after budget eviction: %v, want [2 8]", out)
	}
	matchG1(t, a, q, targets, out)
	if out[0] != 8 || out[1] != 0 {
		t.Fatalf("newer prompt: %v", out)
	}
	if r := a.Resident(tgt(0)); r != 10 {
		t.Fatalf("resident %d, want the budget 10", r)
	}
	// A prompt longer than the budget keeps its first budget blocks.
	long := chain(3, 25)
	a.Record(tgt(0), long)
	matchG1(t, a, long, targets, out)
	if out[0] != 10 {
		t.Fatalf("long prompt keeps %d, want 10", out[0])
	}
	a.Forget(tgt(0))
	if a.Resident(tgt(0)) != 0 || len(a.blocks) != 8 {
		t.Fatalf("forget left %d resident, %d blocks", a.Resident(tgt(0)), len(a.blocks))
	}
}

// A fleet that churns reuses the bits of removed targets: the bitsets stay as wide as the
// largest fleet, and a new target never inherits a removed one's blocks.
func TestApproxRemoveTargetReusesBits(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	a := newTestApprox(time.Minute, 1000, clk)
	p := chain(1, 10)
	a.Record(tgt(0), p)
	a.Record(tgt(1), p[:4])
	for i := 2; i < 200; i++ { // 198 workers come, take tgt(1)'s place in turn, and go
		a.RemoveTarget(tgt(i - 1))
		a.Record(tgt(i), p[:i%10])
	}
	if n := len(a.targets); n != 2 {
		t.Errorf("%d target slots after churn, want 2 (bits reused)", n)
	}
	out := make([]int, 3)
	matchG1(t, a, p, []kvkey.Target{tgt(0), tgt(198), tgt(199)}, out)
	if out[0] != 10 || out[1] != 0 || out[2] != 199%10 {
		t.Errorf("matches %v, want [10 0 9]: a removed target's blocks must not survive", out)
	}
	if a.Resident(tgt(198)) != 0 {
		t.Error("a removed target still has resident blocks")
	}
}
