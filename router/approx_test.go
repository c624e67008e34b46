package router

import (
	"context"
	"testing"

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
