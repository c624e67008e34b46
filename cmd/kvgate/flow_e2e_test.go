package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/sim"
)

// flowCall is one request sent through the gateway in the background: its answer, where it
// went and when it ended.
type flowCall struct {
	name   string
	status int
	header http.Header
	body   []byte
	err    error
	ended  time.Time
	done   chan struct{}
}

// flowSend posts body to path in the background with the given headers; cancel ctx to
// leave early.
func (f *fleet) flowSend(ctx context.Context, name, path string, body any, h map[string]string) *flowCall {
	data, err := json.Marshal(body)
	if err != nil {
		f.t.Fatal(err)
	}
	fc := &flowCall{name: name, done: make(chan struct{})}
	go func() {
		defer close(fc.done)
		defer func() { fc.ended = time.Now() }()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.gw.URL+path, bytes.NewReader(data))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fc.err = err
			return
		}
		defer resp.Body.Close()
		fc.body, fc.err = io.ReadAll(resp.Body)
		fc.status, fc.header = resp.StatusCode, resp.Header
	}()
	return fc
}

// wait returns once the call ended (failing the test after 20s).
func (fc *flowCall) wait(t *testing.T) *flowCall {
	t.Helper()
	select {
	case <-fc.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no answer within 20s", fc.name)
	}
	return fc
}

// ok fails the test unless the call was answered 200.
func (fc *flowCall) ok(t *testing.T) *flowCall {
	t.Helper()
	if fc.wait(t); fc.err != nil || fc.status != http.StatusOK {
		t.Fatalf("%s: status %d err %v body %s", fc.name, fc.status, fc.err, fc.body)
	}
	return fc
}

// awaitQueued waits until n requests wait at the gateway.
func (f *fleet) awaitQueued(n int) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.metric("kvgate_flow_queue_requests", nil) != float64(n) {
		if time.Now().After(deadline) {
			f.t.Fatalf("never %d requests waiting at the gateway (now %v)", n, f.metric("kvgate_flow_queue_requests", nil))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// occupy sends a request that keeps worker u busy (its prefill in flight) and returns it once
// the gateway accounts that prefill.
func (f *fleet) occupy(name, u string, h map[string]string) *flowCall {
	f.t.Helper()
	fc := f.flowSend(context.Background(), name, "/v1/chat/completions", chatRequest("occupy "+name, longText(len(name), 20)), h)
	if !f.pollTarget(u, 10*time.Second, func(v targetJSON) bool { return v.Load != nil && v.Load.PrefillTokens > 0 }) {
		f.t.Fatalf("%s never became busy", u)
	}
	return fc
}

// queued sends a request that must wait at the gateway (n-1 already wait) and returns once it
// does.
func (f *fleet) queued(name string, n int, h map[string]string) *flowCall {
	f.t.Helper()
	fc := f.flowSend(context.Background(), name, "/v1/chat/completions", chatRequest("queued "+name, longText(100+n, 20)), h)
	f.awaitQueued(n)
	return fc
}

// endOrder fails unless the calls ended in the order given.
func endOrder(t *testing.T, calls ...*flowCall) {
	t.Helper()
	for i := 1; i < len(calls); i++ {
		if !calls[i-1].ended.Before(calls[i].ended) {
			t.Errorf("%s ended at %s, not before %s at %s", calls[i-1].name, calls[i-1].ended.Format("15:04:05.000"),
				calls[i].name, calls[i].ended.Format("15:04:05.000"))
		}
	}
}

// One worker whose every prefill step takes 300ms, a threshold of one prompt token in flight:
// the worker is busy from each request's arrival to its first token, so every further request
// waits at the gateway, and the order requests end in is the order the queue dispatched them.
func TestFlowControlQueueE2E(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 1,
		simOpts: func(_ int, o *sim.Options) { o.TTFT = 300 * time.Millisecond },
		args: []string{"--router-policy", "kv", "--router-busy-prefill-tokens", "1", "--flow-control-enabled",
			"--flow-control-max-requests", "3", "--flow-control-queue-timeout", "10s", "--flow-control-retry-after", "2s"}})
	u := f.urls[0]

	t.Run("higher priority first", func(t *testing.T) {
		blocker := f.occupy("blocker", u, nil)
		low := f.queued("low", 1, map[string]string{"X-Kvgate-Priority": "-1"})
		high := f.queued("high", 2, map[string]string{"X-Kvgate-Priority": "1"})
		blocker.ok(t)
		endOrder(t, high.ok(t), low.ok(t))
	})

	t.Run("the tenant with less attained service first", func(t *testing.T) {
		heavy := map[string]string{"X-Gateway-Inference-Fairness-Id": "heavy"}
		light := map[string]string{"X-Gateway-Inference-Fairness-Id": "light"}
		blocker := f.occupy("heavy-0", u, heavy) // let through at once, charged to heavy
		h1 := f.queued("heavy-1", 1, heavy)
		h2 := f.queued("heavy-2", 2, heavy)
		l1 := f.queued("light-1", 3, light)
		blocker.ok(t)
		endOrder(t, l1.ok(t), h1.ok(t), h2.ok(t))
	})

	t.Run("queue full: 429 with Retry-After in the route's shape", func(t *testing.T) {
		blocker := f.occupy("blocker", u, nil)
		var waiting []*flowCall
		for i := 1; i <= 3; i++ {
			waiting = append(waiting, f.queued(fmt.Sprint("w", i), i, nil))
		}
		code, h, body := f.post("/v1/chat/completions", chatRequest("one too many", "hello"), nil)
		var oa struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if code != http.StatusTooManyRequests || h.Get("Retry-After") != "2" || json.Unmarshal(body, &oa) != nil || oa.Error.Message == "" {
			t.Errorf("OpenAI route: %d Retry-After %q %s", code, h.Get("Retry-After"), body)
		}
		// The real client sees a 429 too.
		_, err := f.client.CreateChatCompletion(context.Background(), chatRequest("one more", "hello"))
		var apiErr *openai.APIError
		if !errors.As(err, &apiErr) || apiErr.HTTPStatusCode != http.StatusTooManyRequests {
			t.Errorf("go-openai: %v, want a 429 APIError", err)
		}
		code, h, body = f.post("/v1/messages", messagesBody(false), nil)
		var an struct {
			Type  string `json:"type"`
			Error struct {
				Type string `json:"type"`
			} `json:"error"`
		}
		if code != http.StatusTooManyRequests || h.Get("Retry-After") != "2" || json.Unmarshal(body, &an) != nil ||
			an.Type != "error" || an.Error.Type != "rate_limit_error" {
			t.Errorf("Anthropic route: %d Retry-After %q %s", code, h.Get("Retry-After"), body)
		}
		if got := f.metric("kvgate_flow_shed_total", map[string]string{"reason": "queue_full"}); got != 3 {
			t.Errorf("shed queue_full = %v, want 3", got)
		}
		blocker.ok(t)
		for _, w := range waiting {
			w.ok(t)
		}
	})

	t.Run("a client that leaves is removed at once", func(t *testing.T) {
		blocker := f.occupy("blocker", u, nil)
		ctx, cancel := context.WithCancel(context.Background())
		gone := f.flowSend(ctx, "gone", "/v1/chat/completions", chatRequest("gone", "bye"), nil)
		f.awaitQueued(1)
		before := f.metric("kvgate_flow_dispatched_total", map[string]string{"reason": "freed"})
		cancel()
		gone.wait(t)
		f.awaitQueued(0) // before the worker frees: removed by the client's context, not skipped later
		if blocker.wait(t); blocker.ended.Before(gone.ended) {
			t.Error("the waiting request was removed only once the worker freed")
		}
		blocker.ok(t)
		if got := f.metric("kvgate_flow_shed_total", map[string]string{"reason": "client_gone"}); got != 1 {
			t.Errorf("shed client_gone = %v, want 1", got)
		}
		if after := f.metric("kvgate_flow_dispatched_total", map[string]string{"reason": "freed"}); after != before {
			t.Errorf("a request whose client left was dispatched (%v → %v)", before, after)
		}
	})
}

// A worker busy longer than flow_control.queue_timeout: the waiting request is answered 503
// with Retry-After, in OpenAI's shape.
func TestFlowControlTimeoutE2E(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 1,
		simOpts: func(_ int, o *sim.Options) { o.TTFT = 1500 * time.Millisecond },
		args: []string{"--router-policy", "kv", "--router-busy-prefill-tokens", "1", "--flow-control-enabled",
			"--flow-control-queue-timeout", "300ms"}})
	blocker := f.occupy("blocker", f.urls[0], nil)
	start := time.Now()
	code, h, body := f.post("/v1/chat/completions", chatRequest("late", "hello"), nil)
	waited := time.Since(start)
	if code != http.StatusServiceUnavailable || h.Get("Retry-After") != "1" || !bytes.Contains(body, []byte("queue_timeout")) {
		t.Errorf("%d Retry-After %q %s", code, h.Get("Retry-After"), body)
	}
	if waited < 300*time.Millisecond || waited > 1400*time.Millisecond {
		t.Errorf("answered after %s, want the 300ms queue timeout", waited)
	}
	if got := f.metric("kvgate_flow_shed_total", map[string]string{"reason": "timeout"}); got != 1 {
		t.Errorf("shed timeout = %v, want 1", got)
	}
	blocker.ok(t)
}

// Late binding: two requests wait, the older one's prefix cached on the slow worker, the newer
// one's on the fast worker. When the fast worker frees first it takes the newer request (its
// prefix is there), not the older one: a FIFO queue would do the reverse.
func TestFlowControlLateBindingE2E(t *testing.T) {
	tok := needModel(t)
	ttft := []time.Duration{1500 * time.Millisecond, 400 * time.Millisecond}
	f := startFleet(t, tok, fleetSpec{workers: 2, events: true,
		simOpts: func(i int, o *sim.Options) { o.TTFT = ttft[i] },
		args:    []string{"--router-busy-prefill-tokens", "1", "--flow-control-enabled"}})
	slow, fast := f.urls[0], f.urls[1]
	prefix := func(seed int) string { return longText(seed, 300) } // ~2,000 tokens
	// Each prefix cached on its worker (sent straight there), and the gateway's index knows it.
	for _, w := range []struct {
		u    string
		seed int
	}{{slow, 1}, {fast, 2}} {
		if _, err := f.direct[w.u].CreateChatCompletion(context.Background(), chatRequest(prefix(w.seed), "warm")); err != nil {
			t.Fatal(err)
		}
		f.awaitCached(chatRequest(prefix(w.seed), "warm"), w.u, nil)
	}
	// Both workers busy, each with a request on its own cached prefix (so kv sends it there).
	b1 := f.flowSend(context.Background(), "busy-slow", "/v1/chat/completions", chatRequest(prefix(1), "first"), nil)
	b2 := f.flowSend(context.Background(), "busy-fast", "/v1/chat/completions", chatRequest(prefix(2), "first"), nil)
	for _, u := range []string{slow, fast} {
		if !f.pollTarget(u, 10*time.Second, func(v targetJSON) bool { return v.Load != nil && v.Load.PrefillTokens > 0 }) {
			t.Fatalf("%s never became busy", u)
		}
	}
	onSlow := f.flowSend(context.Background(), "cached-on-slow", "/v1/chat/completions", chatRequest(prefix(1), "question A"), nil)
	f.awaitQueued(1)
	onFast := f.flowSend(context.Background(), "cached-on-fast", "/v1/chat/completions", chatRequest(prefix(2), "question B"), nil)
	f.awaitQueued(2)
	if b1.ok(t).header.Get("X-Kvgate-Worker") != slow || b2.ok(t).header.Get("X-Kvgate-Worker") != fast {
		t.Fatal("the requests occupying the workers did not go to their prefix's worker")
	}
	onSlow.ok(t)
	onFast.ok(t)
	if got := onFast.header.Get("X-Kvgate-Worker"); got != fast {
		t.Errorf("the request cached on %s went to %s", fast, got)
	}
	endOrder(t, onFast, onSlow)
}
