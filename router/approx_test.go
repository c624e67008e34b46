package router

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
)

// TestApproxRepeatedPromptSticks: through the dispatcher with no event index at all, a repeated
// prompt goes back to the target that served it; a new prompt is free to go elsewhere.
func TestApproxRepeatedPromptSticks(t *testing.T) {
	p, err := NewKV(DefaultKVConfig(), KVDeps{Approx: NewApproxIndex(DefaultKVConfig().Approximate)})
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewDispatcher(DispatcherOptions{KV: p})
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

// TestApproxFallbackAfterEventsFail: prompts routed to a target whose events are healthy are
// not written to the approximate index (that index is not read for it), yet once its events
// fail it is scored from what was routed there within the approximate TTL; while they are
// down, routed prompts go to the approximate index at once; Forget drops what was kept.
func TestApproxFallbackAfterEventsFail(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	healthy := map[kvkey.Target]bool{tgt(0): true, tgt(1): true}
	var mu sync.Mutex
	events := EventHealthFunc(func(t kvkey.Target) bool { mu.Lock(); defer mu.Unlock(); return healthy[t] })
	setHealthy := func(t kvkey.Target, ok bool) { mu.Lock(); healthy[t] = ok; mu.Unlock() }
	cfg := DefaultKVConfig()
	approx := NewApproxIndex(cfg.Approximate)
	p := newTestKV(t, PolicyKV, cfg, KVDeps{Matcher: fixedMatcher{}, Events: events, Approx: approx}, clk)
	e, err := NewDispatcher(DispatcherOptions{KV: p, Approx: approx})
	if err != nil {
		t.Fatal(err)
	}
	one, two := kvCands(1), kvCands(2)
	route := func(prompt []kvkey.BlockHash) {
		t.Helper()
		_, h, err := pickAndBegin(context.Background(), e, request(prompt), one)
		if err != nil {
			t.Fatal(err)
		}
		h.FirstToken()
		h.Done()
	}
	approxG1 := func(prompt []kvkey.BlockHash) int {
		out := make([]indexers.TierMatch, 1)
		approx.MatchTiers(prompt, []kvkey.Target{tgt(0)}, out)
		return out[0].G1
	}
	old, recent, later := chain(10, 300), chain(20, 200), chain(30, 100)
	route(old)
	clk.advance(cfg.Approximate.TTL.D() + time.Second)
	route(recent)
	if g := approxG1(recent); g != 0 {
		t.Fatalf("a healthy target's prompt was recorded in the approximate index (%d blocks)", g)
	}
	setHealthy(tgt(0), false)
	for _, tc := range []struct {
		name   string
		prompt []kvkey.BlockHash
		want   int // G1 on target 0 in the decision
	}{
		{"routed within the TTL while healthy", recent, 200},
		{"routed before the TTL while healthy", old, 0},
	} {
		d, err := e.Pick(context.Background(), request(tc.prompt), two)
		if err != nil {
			t.Fatal(err)
		}
		row := d.Candidates[0]
		if row.Target != tgt(0) || row.Mode != ModeApproximate || row.G1Blocks != tc.want {
			t.Fatalf("%s: target 0 scored %s, want approximate with G1 %d", tc.name, js(row), tc.want)
		}
		if tc.want > 0 && d.Chosen.Target != tgt(0) {
			t.Fatalf("%s: chose %v, not the target holding it", tc.name, d.Chosen.Target)
		}
	}
	route(later)
	if g := approxG1(later); g != 100 {
		t.Fatalf("routed while events are down: approximate G1 %d, want 100", g)
	}
	// Healthy again, routed, then forgotten (a health flap): nothing is moved over later.
	setHealthy(tgt(0), true)
	fresh := chain(40, 50)
	route(fresh)
	e.Forget(tgt(0))
	setHealthy(tgt(0), false)
	if _, err := e.Pick(context.Background(), request(fresh), two); err != nil {
		t.Fatal(err)
	}
	if g := approxG1(fresh); g != 0 {
		t.Fatalf("a forgotten target's kept prompt reached the approximate index (%d blocks)", g)
	}
}
