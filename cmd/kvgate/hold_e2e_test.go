package main

import (
	"fmt"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/sim"
)

// slowGPU is a fleet spec whose simulated workers run the default timing profile four times
// slower (Speedup 0.25) with the gateway's latency prior scaled to match: the hold's price
// (a step and the per-request constant for the suffix, against the shared prefix's prefill) is
// then far larger than the jitter of a shared, raced test machine.
func slowGPU() fleetSpec {
	return fleetSpec{workers: 4, events: true,
		simOpts: func(_ int, o *sim.Options) { o.TTFT, o.ITL, o.Speedup = 0, 0, 0.25 },
		args: []string{"--router-latency-prefill-ms-per-token", "0.0607", "--router-latency-attention-ms-per-pair", "3.37e-6",
			"--router-latency-step-ms", "66", "--router-latency-step-ms-per-kv-token", "8e-4"}}
}

// TestSiblingHoldPriced is the sibling hold end to end as a priced choice (router/hold_cost.go).
// Four subagents sent together share a ≈1,500-token prompt on four idle workers: waiting for
// the first one's prefill and then computing the suffix is predicted slower than the whole
// prompt on an idle worker, so the second is not held (faster_elsewhere) and computes the
// prompt elsewhere, which the duplicate-prefill counter shows; the fourth, with every other
// worker now busy, may weigh in the GPU time saved and hold. A sibling that comes when the
// first one's prefill is mostly done is held (or finds the prefix cached) and lands on its
// worker with the shared prompt cached.
func TestSiblingHoldPriced(t *testing.T) {
	tok := needModel(t)
	shared := "You are a subagent of the review crew. " + longText(5151, 85) // ≈1,500 tokens
	kidReq := func(i int) openai.ChatCompletionRequest {
		return chatRequest(shared, fmt.Sprintf("Task %d: %s", i, longText(9000+i, 3)))
	}
	kidH := func(i int) map[string]string {
		return map[string]string{"X-Session-ID": fmt.Sprintf("root/sub-%d", i)}
	}
	holds := func(f *fleet, outcome string) float64 {
		return f.metric("kvgate_router_holds_total", map[string]string{"outcome": outcome})
	}

	t.Run("idle fleet: faster elsewhere", func(t *testing.T) {
		f := startFleet(t, tok, slowGPU())
		kids := make([]kidResult, 4)
		var wg sync.WaitGroup
		for i := range kids {
			wg.Go(func() {
				k := &kids[i]
				k.id = kidH(i)["X-Session-ID"]
				k.worker, k.prompt, k.cached, k.err = postKid(f.gw.URL, kidReq(i), kidH(i))
			})
		}
		wg.Wait()
		workers := map[string]bool{}
		for _, k := range kids {
			if k.err != nil {
				t.Fatalf("%s: %v", k.id, k.err)
			}
			t.Logf("%s → %s (cached %d of %d)", k.id, k.worker, k.cached, k.prompt)
			workers[k.worker] = true
		}
		faster := holds(f, "faster_elsewhere")
		if faster < 1 {
			t.Errorf("kvgate_router_holds_total{outcome=faster_elsewhere} = %v, want at least 1 (the second subagent, with idle workers)", faster)
		}
		if len(workers) < 2 {
			t.Errorf("all four subagents on %v: none went to an idle worker", workers)
		}
		// Those not held computed the shared prefix a second time, and are counted so.
		if dup := f.metric("kvgate_router_duplicate_prefill_tokens_total", map[string]string{"reason": "faster_elsewhere"}); dup < faster*64*float64(f.cfg.BlockSize) {
			t.Errorf("duplicate prefill{faster_elsewhere} = %v tokens for %v requests not held, want at least 64 blocks each", dup, faster)
		}
		if got := faster + holds(f, "released") + holds(f, "cached") + holds(f, "expired"); got != float64(len(kids)-1) {
			t.Errorf("hold outcomes sum to %v, want %d (every subagent but the first)", got, len(kids)-1)
		}
	})

	t.Run("late sibling: held", func(t *testing.T) {
		f := startFleet(t, tok, slowGPU())
		// The first subagent's prefill is predicted at ≈170 ms; its sibling comes 120 ms after
		// it was routed, and is released by the KV events announcing the prefix (the first one
		// is not streamed) or finds it cached. Counted from the routing, not from the send:
		// under -race on a loaded CPU the first one's parse and tokenization alone can take
		// longer than 120 ms, and a sibling coming before most of the prefill has run is
		// rightly not held.
		var lead kidResult
		var wg sync.WaitGroup
		leadDone := make(chan struct{})
		wg.Go(func() {
			defer close(leadDone)
			lead.worker, lead.prompt, lead.cached, lead.err = postKid(f.gw.URL, kidReq(0), kidH(0))
		})
		f.awaitRouted(leadDone)
		time.Sleep(120 * time.Millisecond)
		w, prompt, cached, err := postKid(f.gw.URL, kidReq(1), kidH(1))
		wg.Wait()
		if err != nil || lead.err != nil {
			t.Fatalf("sibling: %v; first: %v", err, lead.err)
		}
		leadW := lead.worker
		t.Logf("sibling → %s (cached %d of %d); first on %s", w, cached, prompt, leadW)
		if w != leadW || cached < 64*f.cfg.BlockSize {
			t.Errorf("sibling on %s with %d cached tokens, want %s with the shared prompt cached", w, cached, leadW)
		}
		if got := holds(f, "faster_elsewhere"); got != 0 {
			t.Errorf("kvgate_router_holds_total{outcome=faster_elsewhere} = %v, want 0", got)
		}
		if got := holds(f, "released") + holds(f, "cached"); got != 1 {
			t.Errorf("holds released + cached = %v, want 1", got)
		}
	})
}

// awaitRouted waits until the gateway accounts a request in flight on some worker, or done is
// closed (the request ended before a poll saw it).
func (f *fleet) awaitRouted(done <-chan struct{}) {
	f.t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		select {
		case <-done:
			return
		default:
		}
		for _, v := range f.targets() {
			if v.InFlight > 0 {
				return
			}
		}
	}
	f.t.Fatal("the request was never routed")
}
