package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/sim"
)

// priorityKeys are the client keys of the priority tests: a batch key at priority 0 and a
// live key at 1 (auth.keys[].priority).
const priorityKeys = `auth:
  keys:
    - key: key-batch-secret
      name: batch
      priority: 0
    - key: key-live-secret
      name: live
      priority: 1
`

// bodyTap stands in front of a worker and records the top-level priority field of each named
// request's body as the worker received it ("absent" when there is none).
type bodyTap struct {
	mu   sync.Mutex
	seen map[string]string
}

func (b *bodyTap) wrap(_ int, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name := r.Header.Get(testNameHeader); name != "" && r.Body != nil {
			data, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(data))
			var body struct {
				Priority json.RawMessage `json:"priority"`
			}
			got := "absent"
			if json.Unmarshal(data, &body) == nil && body.Priority != nil {
				got = string(body.Priority)
			}
			b.mu.Lock()
			b.seen[name] = got
			b.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

func (b *bodyTap) priority(name string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seen[name]
}

// TestForwardPriorityE2E: one worker running vLLM's priority policy with one seat, held by a
// batch request while two more batch requests queue on it. A live-key request sent last
// overtakes the queued ones when proxy.forward_priority is on (the worker gets priority -1,
// the batch requests 0), on chat completions and Responses, with flow_control off or on (then
// the class the gateway queue gave it is used), and waits its turn when it is off
// (the body goes as sent). A batch key cannot lift itself: its body priority -100 and its
// x-kvgate-priority 50 both give way to the key's ceiling (0). On Messages the priority is
// written too, though vLLM's Messages request drops it (so does the simulator): it waits.
func TestForwardPriorityE2E(t *testing.T) {
	tok := needModel(t)
	batch := map[string]string{"Authorization": "Bearer key-batch-secret"}
	live := map[string]string{"Authorization": "Bearer key-live-secret"}
	cheat := map[string]string{"Authorization": "Bearer key-batch-secret", "X-Kvgate-Priority": "50"}
	anthropicLive := map[string]string{"X-Api-Key": "key-live-secret", "Anthropic-Version": "2023-06-01"}
	tests := []struct {
		name      string
		forward   bool
		flow      bool // flow_control.enabled: the priority comes from the gateway queue's class
		path      string
		last      map[string]string
		lastExtra map[string]any // added to the last request's body
		wantFirst bool           // the last request finishes before the queued ones
		wantBody  string         // the priority field the worker got for the last request
	}{
		{"on/chat", true, false, "/v1/chat/completions", live, nil, true, "-1"},
		{"on/chat/flow_control", true, true, "/v1/chat/completions", live, nil, true, "-1"},
		{"on/responses", true, false, "/v1/responses", live, nil, true, "-1"},
		{"off/chat", false, false, "/v1/chat/completions", live, nil, false, "absent"},
		{"on/ceiling", true, false, "/v1/chat/completions", cheat, map[string]any{"priority": -100}, false, "0"},
		{"on/messages", true, false, "/v1/messages", anthropicLive, nil, false, "-1"},
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "keys.yaml")
	if err := os.WriteFile(cfgPath, []byte(priorityKeys), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tap := &bodyTap{seen: map[string]string{}}
			w := startSimWorkers(t, tok, fleetSpec{workers: 1, wrap: tap.wrap, simOpts: func(_ int, o *sim.Options) {
				o.SchedulingPolicy, o.MaxNumSeqs, o.OutputLen = sim.PolicyPriority, 1, -1
				o.TTFT, o.ITL = 10*time.Millisecond, 5*time.Millisecond
			}})
			args := []string{"--config", cfgPath, "--router-policy", "least_loaded"}
			if tc.forward {
				args = append(args, "--proxy-forward-priority")
			}
			if tc.flow {
				args = append(args, "--flow-control-enabled")
			}
			f := startGateway(t, w, gatewayArgs(w, args...))
			worker := w.sims[w.urls[0]]
			awaitLoad := func(n int) {
				t.Helper()
				deadline := time.Now().Add(10 * time.Second)
				for st := worker.Stats(); st.Running != 1 || st.Running+st.Waiting != n; st = worker.Stats() {
					if time.Now().After(deadline) {
						t.Fatalf("worker never held %d requests, one running (now %+v)", n, st)
					}
					time.Sleep(2 * time.Millisecond)
				}
			}
			ctx := context.Background()
			chat := func(user string, maxTok int) map[string]any {
				return map[string]any{"model": servedModel, "max_tokens": maxTok,
					"messages": []map[string]string{{"role": "user", "content": user}}}
			}
			var order []string
			var mu sync.Mutex
			send := func(name, path string, body map[string]any, h map[string]string) *flowCall {
				fc := f.flowSend(ctx, name, path, body, h)
				go func() {
					<-fc.done
					mu.Lock()
					order = append(order, name)
					mu.Unlock()
				}()
				return fc
			}
			calls := []*flowCall{send("busy", "/v1/chat/completions", chat("hold the seat", 80), batch)}
			awaitLoad(1)
			for i, name := range []string{"q1", "q2"} {
				calls = append(calls, send(name, "/v1/chat/completions", chat("queued "+name, 2), batch))
				awaitLoad(2 + i)
			}
			var body map[string]any
			switch tc.path {
			case "/v1/responses":
				body = map[string]any{"model": servedModel, "input": "urgent question", "max_output_tokens": 2, "store": false}
			default: // chat completions and Messages share the shape used here
				body = chat("urgent question", 2)
			}
			for k, v := range tc.lastExtra {
				body[k] = v
			}
			calls = append(calls, send("last", tc.path, body, tc.last))
			for _, c := range calls {
				c.ok(t)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				mu.Lock()
				n := len(order)
				mu.Unlock()
				if n == len(calls) || time.Now().After(deadline) {
					break
				}
				time.Sleep(time.Millisecond)
			}
			mu.Lock()
			defer mu.Unlock()
			pos := slices.Index(order, "last")
			if first := pos >= 0 && pos < slices.Index(order, "q1"); first != tc.wantFirst {
				t.Errorf("finish order %v: last before the queued ones = %v, want %v", order, first, tc.wantFirst)
			}
			if got := tap.priority("last"); got != tc.wantBody {
				t.Errorf("the worker got priority %s for the last request, want %s", got, tc.wantBody)
			}
			want := "absent"
			if tc.forward {
				want = "0"
			}
			if got := tap.priority("q1"); got != want {
				t.Errorf("the worker got priority %s for a batch request, want %s", got, want)
			}
		})
	}
}
