package main

import (
	"context"
	"testing"
	"time"
)

// TestReplicasQueueOnSharedLoadE2E: two gateways with flow control on, sharing one worker
// over NATS. While a request through A is in its prefill there, B knows the worker busy from
// the shared load alone (B sent it nothing) and queues its own request at B, not on the
// worker; once A's request is past its prefill, B dispatches it to the freed worker.
func TestReplicasQueueOnSharedLoadE2E(t *testing.T) {
	tok := needModel(t)
	natsAddr := freeAddr(t)
	flow := []string{"--flow-control-enabled", "--router-busy-prefill-tokens", "1", "--flow-control-queue-timeout", "20s"}
	// The worker's prefill takes 1.5 s: room for A's request to reach B's view (tens of ms
	// when idle) on a CI machine running every package's tests at once.
	rs := startLoadReplicas(t, tok, 1, 1500*time.Millisecond,
		append([]string{"--cluster-replica-id", "a", "--cluster-embedded-nats-listen", natsAddr, "--cluster-embedded-nats-store-dir", t.TempDir()}, flow...),
		append([]string{"--cluster-replica-id", "b", "--cluster-nats-url", "nats://" + natsAddr}, flow...))
	a, b := rs[0], rs[1]
	b.awaitOnlyPeer("a")

	aCall := a.flowSend(context.Background(), "a", "/v1/chat/completions", chatRequest("You are replica a.", longText(3, 100)), nil)
	for end := time.Now().Add(1200 * time.Millisecond); ; time.Sleep(5 * time.Millisecond) {
		if n, _ := b.peerRequests(); n == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("a's request in flight never showed in b's view of its peers")
		}
	}
	if got := b.metric("kvgate_flow_queue_requests", nil); got != 0 {
		t.Fatalf("b's queue holds %v requests before b sent any", got)
	}
	bCall := b.flowSend(context.Background(), "b", "/v1/chat/completions", chatRequest("You are replica b.", longText(4, 100)), nil)
	for end := time.Now().Add(1200 * time.Millisecond); b.metric("kvgate_flow_queue_requests", nil) != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("b's request did not wait at b while a's held the worker (b's queue: %v, dispatched direct: %v)",
				b.metric("kvgate_flow_queue_requests", nil), b.metric("kvgate_flow_dispatched_total", map[string]string{"reason": "direct"}))
		}
	}
	aCall.ok(t)
	bCall.ok(t)
	if got := b.metric("kvgate_flow_dispatched_total", map[string]string{"reason": "freed"}); got != 1 {
		t.Errorf("b dispatched %v requests from its queue to a freed worker, want 1", got)
	}
	if got := a.metric("kvgate_flow_queue_requests", nil) + a.metric("kvgate_flow_dispatched_total", map[string]string{"reason": "freed"}); got != 0 {
		t.Errorf("a queued b's request (%v): each replica queues only its own", got)
	}
}
