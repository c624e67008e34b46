package main

import (
	"context"
	"testing"
	"time"
)

// bindingFleet starts two workers with KV events, a gate in front of each and flow control on
// (busy = any prompt token in flight), and caches prefix(1) on worker 0 and prefix(2) on
// worker 1 (sent straight there; the gateway's index knows it).
func bindingFleet(t *testing.T, prefix func(seed int) string, args ...string) (*fleet, *workerGate) {
	f, gate := gatedFleet(t, 2, true, append([]string{"--router-busy-prefill-tokens", "1"}, args...)...)
	for i, u := range f.urls {
		req := chatRequest(prefix(i+1), "warm")
		if _, err := f.direct[u].CreateChatCompletion(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		f.awaitCached(req, u, nil)
	}
	return f, gate
}

// Priced late binding, the holder sooner: a waiting request whose ~22k-token prefix worker 0
// holds stays queued when worker 1 frees (recomputing the prefix there is predicted to take
// longer than worker 0's short queue), and goes to worker 0 once it frees.
func TestFlowControlWaitsForPrefixHolderE2E(t *testing.T) {
	prefix := func(seed int) string { return longText(seed, 1500) } // ~22k tokens: ~0.7 s of prefill by the prior
	f, gate := bindingFleet(t, prefix)
	w0, w1 := f.urls[0], f.urls[1]
	b1 := f.occupy(gate, "busy-1", w1, chatRequest(prefix(2), "first"), nil)
	b0 := f.occupy(gate, "busy-0", w0, chatRequest(prefix(1), "first"), nil)
	held := f.flowSend(context.Background(), "cached-on-0", "/v1/chat/completions", chatRequest(prefix(1), "question"), nil)
	f.awaitQueued(1)
	gate.release("busy-1")
	b1.ok(t)
	// Worker 1 is free now; the request must keep waiting for worker 0.
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if got := f.metric("kvgate_flow_queue_requests", nil); got != 1 {
			t.Fatalf("the request left the queue (%v waiting) while its prefix holder was busy; worker 1 got %v",
				got, gate.order(1, "cached-on-0"))
		}
	}
	gate.release("busy-0")
	held.ok(t)
	b0.ok(t)
	if got := held.header.Get("X-Kvgate-Worker"); got != w0 {
		t.Errorf("the request cached on %s went to %s", w0, got)
	}
	if got := f.metric("kvgate_flow_binding_total", map[string]string{"choice": "holder"}); got != 1 {
		t.Errorf("kvgate_flow_binding_total{choice=holder} = %v, want 1", got)
	}
}

// Priced late binding, the freed worker sooner: the prefix worker 0 holds is small (~4k tokens)
// and worker 0 is busy with a ~22k-token uncached prefill; when worker 1 frees, the waiting
// request goes there at once rather than wait for worker 0.
func TestFlowControlFreedWorkerFasterE2E(t *testing.T) {
	prefix := func(seed int) string { return longText(seed, 300) } // ~2k tokens
	f, gate := bindingFleet(t, prefix)
	w0, w1 := f.urls[0], f.urls[1]
	b1 := f.occupy(gate, "busy-1", w1, chatRequest(prefix(2), "first"), nil)
	b0 := f.occupy(gate, "busy-0", w0, chatRequest(prefix(1), longText(99, 1500)), nil) // ~22k tokens uncached
	moved := f.flowSend(context.Background(), "cached-on-0", "/v1/chat/completions", chatRequest(prefix(1), "question"), nil)
	f.awaitQueued(1)
	gate.release("busy-1")
	b1.ok(t)
	moved.ok(t) // worker 0 is still held: only worker 1 can have served it
	if got := moved.header.Get("X-Kvgate-Worker"); got != w1 {
		t.Errorf("the request went to %s, want the freed %s", got, w1)
	}
	gate.release("busy-0")
	b0.ok(t)
	if got := f.metric("kvgate_flow_binding_total", map[string]string{"choice": "faster"}); got != 1 {
		t.Errorf("kvgate_flow_binding_total{choice=faster} = %v, want 1", got)
	}
}

// Headroom for a higher priority: one worker, max_predicted_wait 10 min (never reached), the
// contended bound 1 ms. A priority-0 request held at the worker's gate keeps a prefill in
// flight; a priority-1 request still goes straight to the worker, and a priority-0 request
// that comes after it waits at the gateway (the worker's queue is not left to priority 0)
// until the worker frees.
func TestFlowControlPriorityHeadroomE2E(t *testing.T) {
	f, gate := gatedFleet(t, 1, false, "--router-policy", "kv", "--flow-control-max-predicted-wait", "10m",
		"--flow-control-contended-predicted-wait", "1ms")
	u := f.urls[0]
	p0 := map[string]string{"X-Kvgate-Priority": "0"}
	b := f.occupy(gate, "blocker", u, chatRequest("occupy", longText(7, 300)), p0)
	high := f.flowSend(context.Background(), "high", "/v1/chat/completions", chatRequest("urgent", "hello"), map[string]string{"X-Kvgate-Priority": "1"})
	high.ok(t) // served while the priority-0 blocker is still held
	low := f.flowSend(context.Background(), "low", "/v1/chat/completions", chatRequest("later", longText(8, 20)), p0)
	f.awaitQueued(1)
	if got := f.metric("kvgate_flow_queued_total", map[string]string{"reason": "saturated"}); got != 1 {
		t.Errorf("kvgate_flow_queued_total{reason=saturated} = %v, want 1", got)
	}
	gate.release("blocker")
	b.ok(t)
	low.ok(t)
	if got := gate.order(0, "blocker", "high", "low"); len(got) != 3 || got[2] != "low" {
		t.Errorf("the worker received %v, want low last", got)
	}
}

// releaseAll releases every request still held (a test that failed midway).
func (g *workerGate) releaseAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for name, ch := range g.holds {
		select {
		case <-ch:
		default:
			close(ch)
		}
		delete(g.holds, name)
	}
}
