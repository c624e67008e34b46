package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// flowLimitsKeys: a limited key whose token bucket (100,000 tokens, refilled at one a second)
// shows any charge the test's own time cannot refill, one request at a time; and an unlimited
// key of priority 5 for the requests that occupy the worker and fill or take the queue.
const flowLimitsKeys = `auth:
  keys:
    - key: sk-limited
      name: limited
      tokens_per_minute: 60
      burst: 100000
      max_concurrent: 1
    - key: sk-free
      name: free
      priority: 5
`

// A limited key's request that the gateway queue answers without a worker (429 queue full,
// 429 evicted by a higher priority, 503 timeout, its client gone) returns its whole token
// charge and its max_concurrent slot: the key's remaining tokens are back where they were, and
// once the worker frees, the key's next request is served, not refused for concurrency.
func TestFlowControlReturnsKeyLimitsE2E(t *testing.T) {
	cfgPath := filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(cfgPath, []byte(flowLimitsKeys), 0o600); err != nil {
		t.Fatal(err)
	}
	f, gate := gatedFleet(t, 1, false, "--config", cfgPath, "--router-policy", "kv", "--router-busy-prefill-tokens", "1",
		"--flow-control-max-requests", "1", "--flow-control-queue-timeout", "1s")
	u := f.urls[0]
	limited := map[string]string{"Authorization": "Bearer sk-limited"}
	free := map[string]string{"Authorization": "Bearer sk-free"}
	remaining := func() int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, f.gw.URL+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer sk-limited")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		n, err := strconv.Atoi(resp.Header.Get("X-Ratelimit-Remaining-Tokens"))
		if err != nil {
			t.Fatalf("remaining tokens %q: %v", resp.Header.Get("X-Ratelimit-Remaining-Tokens"), err)
		}
		return n
	}
	// The limited request asks 1,000 output tokens: a charge of 1,000 and more.
	limitedReq := func(name string) any {
		r := chatRequest("limited "+name, "hello")
		r.MaxCompletionTokens = 1000
		return r
	}
	cases := []struct {
		name   string
		status int
		// outcome brings the limited request, sent by send, to its answer while the worker is
		// occupied (the queue holds nothing else when it starts).
		outcome func(t *testing.T, name string, send func(ctx context.Context) *flowCall) *flowCall
	}{
		{"queue full: 429", http.StatusTooManyRequests, func(t *testing.T, name string, send func(context.Context) *flowCall) *flowCall {
			filler := f.queued(name+"-filler", 1, free)
			t.Cleanup(func() { filler.wait(t) })
			return send(context.Background()).wait(t)
		}},
		{"evicted by a higher priority: 429", http.StatusTooManyRequests, func(t *testing.T, name string, send func(context.Context) *flowCall) *flowCall {
			fc := send(context.Background())
			f.awaitQueued(1)
			high := f.flowSend(context.Background(), name+"-high", "/v1/chat/completions", chatRequest("high "+name, "hello"), free)
			t.Cleanup(func() { high.wait(t) })
			return fc.wait(t)
		}},
		{"queue timeout: 503", http.StatusServiceUnavailable, func(t *testing.T, _ string, send func(context.Context) *flowCall) *flowCall {
			return send(context.Background()).wait(t)
		}},
		{"client gone while queued", 0, func(t *testing.T, _ string, send func(context.Context) *flowCall) *flowCall {
			ctx, cancel := context.WithCancel(context.Background())
			fc := send(ctx)
			f.awaitQueued(1)
			cancel()
			fc.wait(t)
			f.awaitQueued(0)
			return fc
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := "case" + strconv.Itoa(i)
			blocker := f.occupy(gate, name+"-blocker", u, chatRequest("occupy "+name, longText(i, 20)), free)
			before := remaining()
			fc := tc.outcome(t, name, func(ctx context.Context) *flowCall {
				return f.flowSend(ctx, name, "/v1/chat/completions", limitedReq(name), limited)
			})
			if fc.status != tc.status {
				t.Fatalf("limited request: status %d (err %v), want %d: %s", fc.status, fc.err, tc.status, fc.body)
			}
			if after := remaining(); after < before {
				t.Errorf("remaining tokens %d after the queue answered, %d before: the charge was not returned", after, before)
			}
			gate.release(name + "-blocker")
			blocker.ok(t)
			f.awaitQueued(0)
			next := f.flowSend(context.Background(), name+"-next", "/v1/chat/completions", chatRequest("next "+name, "hello"), limited)
			next.ok(t) // a slot left taken would answer 429 (max_concurrent 1)
		})
	}
}
