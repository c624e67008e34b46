package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
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
		req.Header.Set(testNameHeader, name)
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

// testNameHeader names a request; the gateway forwards it, so the workers' gate sees it.
const testNameHeader = "X-Test-Name"

// workerGate stands in front of each simulated worker: it records the order in which named
// requests reach each worker and holds the ones named in hold until they are released, so a
// test decides exactly when a worker stops being busy (the gateway sees no first byte before).
type workerGate struct {
	mu       sync.Mutex
	arrivals map[int][]string
	holds    map[string]chan struct{}
	// opened names the requests held after their first two flushed writes (holdOpened).
	opened map[string]bool
	// cancelled names the held requests whose client (the gateway) left while held.
	cancelled map[string]bool
}

// gatedFleet starts workers simulated workers (with KV events when events), each behind one
// gate (so a test decides when a held request gets its first token), and a gateway with flow
// control on and args. A failed test's held requests are released before the fleet stops.
func gatedFleet(t *testing.T, workers int, events bool, args ...string) (*fleet, *workerGate) {
	t.Helper()
	tok := needModel(t)
	gate := newWorkerGate()
	f := startFleet(t, tok, fleetSpec{workers: workers, events: events, wrap: gate.wrap,
		simOpts: func(_ int, o *sim.Options) { o.TTFT = 20 * time.Millisecond },
		args:    append([]string{"--flow-control-enabled"}, args...)})
	t.Cleanup(gate.releaseAll) // runs before the fleet's cleanup
	return f, gate
}

func newWorkerGate() *workerGate {
	return &workerGate{arrivals: map[int][]string{}, holds: map[string]chan struct{}{}, opened: map[string]bool{}, cancelled: map[string]bool{}}
}

func (g *workerGate) wrap(i int, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name := r.Header.Get(testNameHeader); name != "" {
			g.mu.Lock()
			g.arrivals[i] = append(g.arrivals[i], name)
			ch := g.holds[name]
			opened := g.opened[name]
			g.mu.Unlock()
			if ch != nil && opened {
				h.ServeHTTP(&openedHold{ResponseWriter: w, g: g, name: name, ch: ch, done: r.Context().Done()}, r)
				return
			}
			if ch != nil {
				// Read the body first, as vLLM does: the worker's server sees its client leave
				// only once the request body was read.
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				select {
				case <-ch:
				case <-r.Context().Done():
					g.mu.Lock()
					g.cancelled[name] = true
					g.mu.Unlock()
				}
			}
		}
		h.ServeHTTP(w, r)
	})
}

// wasCancelled reports whether the held request named name was cancelled by the gateway
// within wait (the worker's server sees its client leave a moment after it left).
func (g *workerGate) wasCancelled(name string, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	for {
		g.mu.Lock()
		c := g.cancelled[name]
		g.mu.Unlock()
		if c || time.Now().After(deadline) {
			return c
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// hold makes the worker keep a request named name until release(name).
func (g *workerGate) hold(name string) {
	g.mu.Lock()
	g.holds[name] = make(chan struct{})
	g.mu.Unlock()
}

// holdOpened makes the worker answer a request named name up to its second flushed write
// (a Responses stream's response.created and response.in_progress, sent before the prefill)
// and keep the rest until release(name).
func (g *workerGate) holdOpened(name string) {
	g.mu.Lock()
	g.holds[name] = make(chan struct{})
	g.opened[name] = true
	g.mu.Unlock()
}

// openedHold is the ResponseWriter of a request held after its opening (holdOpened).
type openedHold struct {
	http.ResponseWriter
	g       *workerGate
	name    string
	ch      chan struct{}
	done    <-chan struct{}
	flushes int
}

func (o *openedHold) Flush() {
	o.ResponseWriter.(http.Flusher).Flush()
	if o.flushes++; o.flushes != 2 {
		return
	}
	select {
	case <-o.ch:
	case <-o.done:
		o.g.mu.Lock()
		o.g.cancelled[o.name] = true
		o.g.mu.Unlock()
	}
}

func (g *workerGate) release(name string) {
	g.mu.Lock()
	close(g.holds[name])
	g.mu.Unlock()
}

// order returns the named requests that reached worker i, in order, among those given.
func (g *workerGate) order(i int, among ...string) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, n := range g.arrivals[i] {
		if slices.Contains(among, n) {
			out = append(out, n)
		}
	}
	return out
}

// occupy sends a request the worker holds (until gate.release(name)) and returns once the
// gateway accounts its prefill on worker u: u is busy until then.
func (f *fleet) occupy(gate *workerGate, name, u string, req any, h map[string]string) *flowCall {
	f.t.Helper()
	gate.hold(name)
	fc := f.flowSend(context.Background(), name, "/v1/chat/completions", req, h)
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

// A gate in front of the one worker keeps a first request there (no first token), a threshold
// of one prompt token in flight makes the worker busy meanwhile, so every further request waits
// at the gateway; once the first is released the worker takes one waiting request at a time
// (busy again until its first token), so the order they reach the worker is the order the
// queue dispatched them.
func TestFlowControlQueueE2E(t *testing.T) {
	f, gate := gatedFleet(t, 1, false, "--router-policy", "kv", "--router-busy-prefill-tokens", "1",
		"--flow-control-max-requests", "3", "--flow-control-queue-timeout", "30s", "--flow-control-retry-after", "2s")
	u := f.urls[0]
	blocker := func(name string, h map[string]string) *flowCall {
		return f.occupy(gate, name, u, chatRequest("occupy "+name, longText(len(name), 20)), h)
	}

	t.Run("higher priority first", func(t *testing.T) {
		b := blocker("blocker-1", nil)
		low := f.queued("low", 1, map[string]string{"X-Kvgate-Priority": "-1"})
		high := f.queued("high", 2, map[string]string{"X-Kvgate-Priority": "1"})
		gate.release("blocker-1")
		b.ok(t)
		high.ok(t)
		low.ok(t)
		if got := gate.order(0, "low", "high"); !slices.Equal(got, []string{"high", "low"}) {
			t.Errorf("dispatch order %v, want high first", got)
		}
	})

	t.Run("the tenant with less attained service first", func(t *testing.T) {
		heavy := map[string]string{"X-Gateway-Inference-Fairness-Id": "heavy"}
		light := map[string]string{"X-Gateway-Inference-Fairness-Id": "light"}
		b := blocker("heavy-0", heavy) // let through at once, charged to heavy
		calls := []*flowCall{f.queued("heavy-1", 1, heavy), f.queued("heavy-2", 2, heavy), f.queued("light-1", 3, light)}
		gate.release("heavy-0")
		b.ok(t)
		for _, c := range calls {
			c.ok(t)
		}
		if got := gate.order(0, "heavy-1", "heavy-2", "light-1"); !slices.Equal(got, []string{"light-1", "heavy-1", "heavy-2"}) {
			t.Errorf("dispatch order %v, want light-1 first", got)
		}
	})

	t.Run("queue full: 429 with Retry-After in the route's shape", func(t *testing.T) {
		b := blocker("blocker-2", nil)
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
		gate.release("blocker-2")
		b.ok(t)
		for _, w := range waiting {
			w.ok(t)
		}
	})

	t.Run("a client that leaves is removed at once", func(t *testing.T) {
		b := blocker("blocker-3", nil)
		ctx, cancel := context.WithCancel(context.Background())
		gone := f.flowSend(ctx, "gone", "/v1/chat/completions", chatRequest("gone", "bye"), nil)
		f.awaitQueued(1)
		before := f.metric("kvgate_flow_dispatched_total", map[string]string{"reason": "freed"})
		cancel()
		gone.wait(t)
		f.awaitQueued(0) // while the worker is still held: removed by the client's context
		if got := f.metric("kvgate_flow_shed_total", map[string]string{"reason": "client_gone"}); got != 1 {
			t.Errorf("shed client_gone = %v, want 1", got)
		}
		gate.release("blocker-3")
		b.ok(t)
		if after := f.metric("kvgate_flow_dispatched_total", map[string]string{"reason": "freed"}); after != before {
			t.Errorf("a request whose client left was dispatched (%v → %v)", before, after)
		}
		if got := gate.order(0, "gone"); len(got) != 0 {
			t.Errorf("the worker received the request whose client left")
		}
	})
}

// A worker busy longer than flow_control.queue_timeout: the waiting request is answered 503
// with Retry-After, in OpenAI's shape, once the timeout passed since its arrival (timeout), or
// at once when the time model predicts that its own prefill alone would end past it
// (deadline: a 1 ms/token prior, so ~2,000 prompt tokens take ~2 s against a 1 s timeout).
func TestFlowControlTimeoutE2E(t *testing.T) {
	cases := []struct {
		name        string
		prompt      string
		reason      string
		atLeast     time.Duration // answered no sooner
		before      time.Duration // and sooner than this
		wantMessage string
	}{
		{"a short request waits the whole timeout", "hello", "timeout", time.Second, 10 * time.Second, "queue_timeout"},
		{"a request that cannot prefill in time is shed at once", longText(7, 300), "deadline", 0, 900 * time.Millisecond, "first token within 1s"},
	}
	f, gate := gatedFleet(t, 1, false, "--router-policy", "kv", "--router-busy-prefill-tokens", "1",
		"--flow-control-queue-timeout", "1s", "--router-latency-prefill-ms-per-token", "1",
		// Within a poll of its deadline the timer answers: the short request (~50 ms of its
		// own by the model) is never shed as hopeless first.
		"--flow-control-poll-interval", "200ms")
	b := f.occupy(gate, "blocker", f.urls[0], chatRequest("occupy", longText(1, 20)), nil)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := f.metric("kvgate_flow_shed_total", map[string]string{"reason": tc.reason})
			start := time.Now()
			code, h, body := f.post("/v1/chat/completions", chatRequest(tc.prompt, "question"), nil)
			waited := time.Since(start)
			if code != http.StatusServiceUnavailable || h.Get("Retry-After") != "1" || !bytes.Contains(body, []byte(tc.wantMessage)) {
				t.Errorf("%d Retry-After %q %s", code, h.Get("Retry-After"), body)
			}
			if waited < tc.atLeast || waited >= tc.before {
				t.Errorf("answered after %s, want from %s and before %s", waited, tc.atLeast, tc.before)
			}
			if got := f.metric("kvgate_flow_shed_total", map[string]string{"reason": tc.reason}); got != before+1 {
				t.Errorf("shed %s = %v, want %v", tc.reason, got, before+1)
			}
		})
	}
	gate.release("blocker")
	b.ok(t)
}

// A request that waited at the gateway is held to its first-token deadline (its arrival
// plus queue_timeout) even when the time model predicted it in time: the worker gate keeps
// the dispatched request (a prefill far slower than predicted), and at the deadline the
// gateway cancels it upstream and answers 503 with Retry-After in the route's shape, not
// after it (go-openai's streaming client sees an APIError 503). A non-stream request (its
// first byte is its whole answer) and one let through at once are not cut.
func TestFlowControlFirstTokenLateE2E(t *testing.T) {
	stream := chatRequest("late", "question")
	stream.Stream = true
	cases := []struct {
		name   string
		path   string
		body   any
		queued bool // sent while the worker is busy: it waits at the gateway
		cut    bool // answered 503 at its deadline (else 200 once the worker lets it go)
		shape  func(body []byte) bool
		sdk    bool // sent by go-openai's streaming client (body: its APIError's message)
		opened bool // the worker sends its opening events, then holds (gate.holdOpened)
	}{
		{"a streamed chat request that waited: 503 at its deadline, OpenAI's shape", "/v1/chat/completions", stream, true, true,
			func(b []byte) bool {
				var oa struct {
					Error struct {
						Message string `json:"message"`
					} `json:"error"`
				}
				return json.Unmarshal(b, &oa) == nil && bytes.Contains([]byte(oa.Error.Message), []byte("queue_timeout"))
			}, false, false},
		{"a streamed Anthropic request that waited: 503 overloaded_error at its deadline", "/v1/messages", messagesBody(true), true, true,
			func(b []byte) bool {
				var an struct {
					Type  string `json:"type"`
					Error struct {
						Type string `json:"type"`
					} `json:"error"`
				}
				return json.Unmarshal(b, &an) == nil && an.Type == "error" && an.Error.Type == "overloaded_error"
			}, false, false},
		{"a streamed Responses request that waited: its opening events held, 503 at its deadline", "/v1/responses",
			map[string]any{"model": servedModel, "input": "question", "stream": true, "store": false, "max_output_tokens": 8}, true, true,
			func(b []byte) bool { return bytes.Contains(b, []byte("queue_timeout")) }, false, true},
		{"go-openai's stream sees an APIError 503 at the deadline", "/v1/chat/completions", stream, true, true,
			func(b []byte) bool { return bytes.Contains(b, []byte("queue_timeout")) }, true, false},
		{"a non-stream request that waited is not cut", "/v1/chat/completions", chatRequest("late", "question"), true, false, nil, false, false},
		{"a streamed request let through at once is not cut", "/v1/chat/completions", stream, false, false, nil, false, false},
	}
	const timeout = time.Second
	f, gate := gatedFleet(t, 1, false, "--router-policy", "kv", "--router-busy-prefill-tokens", "1",
		"--flow-control-queue-timeout", timeout.String(), "--router-latency-prefill-ms-per-token", "0.05",
		"--flow-control-poll-interval", "100ms")
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := f.metric("kvgate_flow_shed_total", map[string]string{"reason": "first_token_late"})
			name := fmt.Sprint("late-", i)
			var b *flowCall
			if tc.queued {
				b = f.occupy(gate, fmt.Sprint("blocker-", i), f.urls[0], chatRequest("occupy", longText(1, 20)), nil)
			}
			if tc.opened {
				gate.holdOpened(name)
			} else {
				gate.hold(name)
			}
			sent := time.Now()
			var call *flowCall
			if tc.sdk {
				call = f.sdkStream(name, tc.body.(openai.ChatCompletionRequest))
			} else {
				call = f.flowSend(context.Background(), name, tc.path, tc.body, nil)
			}
			if tc.queued {
				f.awaitQueued(1)
				time.Sleep(200 * time.Millisecond)
				gate.release(fmt.Sprint("blocker-", i)) // the worker frees: the request is dispatched there, and held
				b.ok(t)
			}
			if !tc.cut {
				time.Sleep(timeout + 300*time.Millisecond - time.Since(sent))
				gate.release(name)
				call.ok(t)
				if gate.wasCancelled(name, 0) {
					t.Error("the worker's request was cancelled")
				}
				if got := f.metric("kvgate_flow_shed_total", map[string]string{"reason": "first_token_late"}); got != before {
					t.Errorf("shed first_token_late = %v, want %v", got, before)
				}
				return
			}
			call.wait(t)
			took := call.ended.Sub(sent)
			if tc.sdk {
				var ae *openai.APIError
				if !errors.As(call.err, &ae) || ae.HTTPStatusCode != http.StatusServiceUnavailable || !tc.shape(call.body) {
					t.Errorf("go-openai: %v, want an APIError 503 naming queue_timeout", call.err)
				}
			} else if call.err != nil || call.status != http.StatusServiceUnavailable || call.header.Get("Retry-After") != "1" || !tc.shape(call.body) {
				t.Errorf("%d Retry-After %q err %v %s", call.status, call.header.Get("Retry-After"), call.err, call.body)
			}
			// The deadline counts from the request's arrival at the gateway, just after it
			// was sent; the answer comes at it, within the machine's scheduling slack.
			if took < timeout-50*time.Millisecond || took > timeout+250*time.Millisecond {
				t.Errorf("answered %s after it was sent, want at its %s deadline", took, timeout)
			}
			if !gate.wasCancelled(name, 2*time.Second) {
				t.Error("the worker's request was not cancelled")
			}
			if got := f.metric("kvgate_flow_shed_total", map[string]string{"reason": "first_token_late"}); got != before+1 {
				t.Errorf("shed first_token_late = %v, want %v", got, before+1)
			}
			gate.release(name)
		})
	}
}

// sdkStream opens a chat stream through the gateway with go-openai in the background, its
// requests named name for the worker gate, and reads its first event: the call's err is the
// client's error (an *openai.APIError's message in body), status 200 once an event came.
func (f *fleet) sdkStream(name string, req openai.ChatCompletionRequest) *flowCall {
	cc := openai.DefaultConfig("none")
	cc.BaseURL = f.gw.URL + "/v1"
	cc.HTTPClient = &http.Client{Transport: namedTransport(name)}
	client := openai.NewClientWithConfig(cc)
	fc := &flowCall{name: name, done: make(chan struct{})}
	go func() {
		defer close(fc.done)
		defer func() { fc.ended = time.Now() }()
		s, err := client.CreateChatCompletionStream(context.Background(), req)
		if err == nil {
			_, err = s.Recv()
			s.Close()
			fc.status = http.StatusOK
		}
		fc.err = err
		var ae *openai.APIError
		if errors.As(err, &ae) {
			fc.status, fc.body = ae.HTTPStatusCode, []byte(ae.Message)
		}
	}()
	return fc
}

// namedTransport sets testNameHeader on every request it sends.
type namedTransport string

func (n namedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(testNameHeader, string(n))
	return http.DefaultTransport.RoundTrip(r)
}

// Late binding: two requests wait, the older one's prefix cached on worker 0, the newer one's
// on worker 1. When worker 1 frees first it takes the newer request (its prefix is there),
// not the older one: a FIFO queue would do the reverse.
func TestFlowControlLateBindingE2E(t *testing.T) {
	f, gate := gatedFleet(t, 2, true, "--router-busy-prefill-tokens", "1")
	w0, w1 := f.urls[0], f.urls[1]
	prefix := func(seed int) string { return longText(seed, 300) } // ~2,000 tokens
	// Each prefix cached on its worker (sent straight there), and the gateway's index knows it.
	for _, w := range []struct {
		u    string
		seed int
	}{{w0, 1}, {w1, 2}} {
		if _, err := f.direct[w.u].CreateChatCompletion(context.Background(), chatRequest(prefix(w.seed), "warm")); err != nil {
			t.Fatal(err)
		}
		f.awaitCached(chatRequest(prefix(w.seed), "warm"), w.u, nil)
	}
	// Both workers held busy, each by a request on its own cached prefix (so kv sends it there).
	b0 := f.occupy(gate, "busy-0", w0, chatRequest(prefix(1), "first"), nil)
	b1 := f.occupy(gate, "busy-1", w1, chatRequest(prefix(2), "first"), nil)
	onW0 := f.flowSend(context.Background(), "cached-on-0", "/v1/chat/completions", chatRequest(prefix(1), "question A"), nil)
	f.awaitQueued(1)
	onW1 := f.flowSend(context.Background(), "cached-on-1", "/v1/chat/completions", chatRequest(prefix(2), "question B"), nil)
	f.awaitQueued(2)
	gate.release("busy-1")
	onW1.ok(t)
	if got := onW1.header.Get("X-Kvgate-Worker"); got != w1 {
		t.Errorf("the request cached on %s went to %s", w1, got)
	}
	gate.release("busy-0")
	for _, c := range []*flowCall{b0, b1, onW0} {
		c.ok(t)
	}
	if b0.header.Get("X-Kvgate-Worker") != w0 || b1.header.Get("X-Kvgate-Worker") != w1 {
		t.Fatal("the requests occupying the workers did not go to their prefix's worker")
	}
	if got := gate.order(1, "cached-on-0", "cached-on-1"); len(got) == 0 || got[0] != "cached-on-1" {
		t.Errorf("worker 1 took %v, want cached-on-1 first", got)
	}
}
