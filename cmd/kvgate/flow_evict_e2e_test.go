package main

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
)

// A full queue and a newcomer of a higher priority: the youngest request of the lowest
// priority waiting gives its place (429 with Retry-After, in its own route's shape), the
// newcomer waits instead and is dispatched first; a newcomer of a lower or equal priority is
// refused (queue_full) and evicts nobody.
func TestFlowControlEvictionE2E(t *testing.T) {
	f, gate := gatedFleet(t, 1, false, "--router-policy", "kv", "--router-busy-prefill-tokens", "1",
		"--flow-control-max-requests", "2", "--flow-control-queue-timeout", "30s", "--flow-control-retry-after", "3s")
	low := map[string]string{"X-Kvgate-Priority": "-1"}
	b := f.occupy(gate, "blocker", f.urls[0], chatRequest("occupy blocker", longText(5, 20)), nil)

	older := f.queued("low-older", 1, low)
	younger := f.flowSend(context.Background(), "low-younger", "/v1/messages", messagesBody(false), low)
	f.awaitQueued(2)

	// Lower and equal priorities are refused while the queue is full.
	for _, prio := range []string{"-2", "-1"} {
		code, h, body := f.post("/v1/chat/completions", chatRequest("refused "+prio, "hello"), map[string]string{"X-Kvgate-Priority": prio})
		if code != http.StatusTooManyRequests || h.Get("Retry-After") != "3" {
			t.Errorf("priority %s on a full queue: %d Retry-After %q %s", prio, code, h.Get("Retry-After"), body)
		}
	}
	if got := f.metric("kvgate_flow_shed_total", map[string]string{"reason": "evicted"}); got != 0 {
		t.Fatalf("shed evicted = %v before any higher priority came, want 0", got)
	}

	high := f.flowSend(context.Background(), "high", "/v1/chat/completions", chatRequest("queued high", longText(9, 20)),
		map[string]string{"X-Kvgate-Priority": "1"})
	younger.wait(t)
	var an struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if younger.status != http.StatusTooManyRequests || younger.header.Get("Retry-After") != "3" ||
		json.Unmarshal(younger.body, &an) != nil || an.Type != "error" || an.Error.Type != "rate_limit_error" || an.Error.Message == "" {
		t.Errorf("evicted Anthropic request: %d Retry-After %q %s", younger.status, younger.header.Get("Retry-After"), younger.body)
	}
	f.awaitQueued(2) // the older low request and the high one
	if got := f.metric("kvgate_flow_shed_total", map[string]string{"reason": "evicted"}); got != 1 {
		t.Errorf("shed evicted = %v, want 1", got)
	}
	select {
	case <-older.done:
		t.Fatalf("the older low-priority request ended (%d %s) though the younger one was the one to go", older.status, older.body)
	default:
	}

	gate.release("blocker")
	b.ok(t)
	high.ok(t)
	older.ok(t)
	if got := gate.order(0, "low-older", "low-younger", "high"); !slices.Equal(got, []string{"high", "low-older"}) {
		t.Errorf("worker received %v, want high then low-older (the evicted one never)", got)
	}
}
