package router

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// Retention reads the working sets: the blocks routed to a target after a prompt, the
// target's capacity as last scraped, nothing once the prompt moved elsewhere.
func TestRetention(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	p := newTestKV(t, PolicyKV, DefaultKVConfig(), KVDeps{}, clk)
	e, err := NewDispatcher(DispatcherOptions{KV: p})
	if err != nil {
		t.Fatal(err)
	}
	t0, t1 := tgt(0), tgt(1)
	route := func(hashes []kvkey.BlockHash, to kvkey.Target) {
		t.Helper()
		_, life, err := e.Route(context.Background(), request(hashes), []Candidate{{Target: to}})
		if err != nil {
			t.Fatal(err)
		}
		life.FirstToken()
		life.Done()
		clk.advance(time.Second) // the working sets age prompts by the second
	}
	a, b := chain(1, 64+16*10), chain(2, 100) // 224 and 100 blocks
	m, ok := e.PromptMark(a)
	if !ok {
		t.Fatal("no mark under kv with the working sets on")
	}
	if _, _, ok := e.Retained(t0, m); ok {
		t.Fatal("a prompt never routed there is retained")
	}
	route(a, t0)
	if newer, capacity, ok := e.Retained(t0, m); !ok || newer != 0 || capacity != 0 {
		t.Fatalf("just routed, never scraped: newer %v capacity %v ok %v, want 0 0 true", newer, capacity, ok)
	}
	route(b, t0)
	e.load.UpdateMetrics(t0, WorkerMetrics{NumGPUBlocks: 1000})
	// b's 100 blocks count 96: the working set samples a prompt's keys, its last short
	// stretch left out (kv_workset.go).
	if newer, capacity, ok := e.Retained(t0, m); !ok || newer != 96 || capacity != 1000 {
		t.Fatalf("after b: newer %v capacity %v ok %v, want 96 1000 true", newer, capacity, ok)
	}
	route(a, t1) // its session moved: t0 will not be asked for its deep blocks again
	if _, _, ok := e.Retained(t0, m); ok {
		t.Fatal("a prompt routed elsewhere since is still retained on its old target")
	}
}
