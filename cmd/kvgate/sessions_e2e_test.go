package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/sim"
)

// agentSystemPrompt is the root agent's long system prompt (about 1,800 tokens).
func agentSystemPrompt() string {
	return "You are the orchestrating agent of a code review. " + longText(4242, 250)
}

// childReply is what one subagent request returned through the gateway.
type childReply struct {
	worker       string
	cachedBlocks int
	usage        openai.Usage
	status       int
	body         string
}

// sendChildren sends the first requests of n subagents of parent at once (parallel tool calls),
// each forked from the parent's context (its system prompt) with its own task.
func (f *fleet) sendChildren(parent string, first, n int) []childReply {
	f.t.Helper()
	out := make([]childReply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := first + i
			req := chatRequest(agentSystemPrompt(), fmt.Sprintf("Subtask %d: review file %d.go for races.", id, id))
			h := map[string]string{"X-Session-ID": parent + "/sub-" + strconv.Itoa(id), "X-Parent-Session-ID": parent}
			code, hdr, body := f.post("/v1/chat/completions", req, h)
			r := childReply{status: code, body: string(body), worker: hdr.Get("X-Kvgate-Worker")}
			r.cachedBlocks, _ = strconv.Atoi(hdr.Get(router.HeaderCachedBlocks))
			var resp openai.ChatCompletionResponse
			if json.Unmarshal(body, &resp) == nil {
				r.usage = resp.Usage
			}
			out[i] = r
		})
	}
	wg.Wait()
	for _, r := range out {
		if r.status != http.StatusOK {
			f.t.Fatalf("subagent request: %d %s", r.status, r.body)
		}
	}
	return out
}

// startRoot sends the root agent's first turn and waits until its prefix is indexed; it
// returns the worker that serves the root.
func (f *fleet) startRoot(root string) string {
	f.t.Helper()
	req := chatRequest(agentSystemPrompt(), "Plan the review of the repository.")
	h := map[string]string{"X-Session-ID": root}
	code, hdr, body := f.post("/v1/chat/completions", req, h)
	if code != http.StatusOK {
		f.t.Fatalf("root: %d %s", code, body)
	}
	w := hdr.Get("X-Kvgate-Worker")
	f.awaitCached(req, w, nil)
	return w
}

// TestParentAwarePlacement is the end-to-end test of parent-aware placement with simulated vLLM
// workers and live KV events: a root session with a long system prompt spawns four subagents at
// once (parent header set). With parent-aware placement they land on the parent's worker, where its
// prefix is, and their first requests report cached tokens; when the parent's worker is saturated
// they spread over the others. With it off, the parent's worker gets no preference: a child whose
// prompt shares nothing cached sees equal costs everywhere and is placed at random.
func TestParentAwarePlacement(t *testing.T) {
	tok := needModel(t)
	// Four running sequences per worker; three waiting mark a worker busy.
	maxSeqs := func(_ int, o *sim.Options) { o.MaxNumSeqs = 4 }
	args := []string{"--router-busy-waiting-requests", "3"}

	t.Run("on", func(t *testing.T) {
		f := startFleet(t, tok, fleetSpec{workers: 3, events: true, simOpts: maxSeqs, args: args})
		parentWorker := f.startRoot("root-A")
		for _, r := range f.sendChildren("root-A", 1, 4) {
			if r.worker != parentWorker {
				t.Errorf("a subagent went to %s, the parent's prefix is on %s", r.worker, parentWorker)
			}
			want := router.PredictedCachedTokens(r.cachedBlocks, 16, r.usage.PromptTokens)
			if r.usage.PromptTokensDetails == nil || r.usage.PromptTokensDetails.CachedTokens != want || want < 1000 {
				t.Errorf("subagent's first request: cached %+v of %d prompt tokens, gateway predicted %d (want most of the system prompt)",
					r.usage.PromptTokensDetails, r.usage.PromptTokens, want)
			}
		}
		var view struct {
			Children []string `json:"children"`
			Group    []struct {
				Target struct {
					Worker string `json:"worker"`
				} `json:"target"`
				Members int `json:"members"`
			} `json:"sibling_group"`
		}
		if err := json.Unmarshal([]byte(f.get("/debug/sessions/root-A")), &view); err != nil || len(view.Children) != 4 ||
			len(view.Group) != 1 || view.Group[0].Target.Worker != parentWorker || view.Group[0].Members != 4 {
			t.Errorf("root's session view: %s", f.get("/debug/sessions/root-A"))
		}
		// A new child's decision names the rule that placed it.
		d := f.dryRun(chatRequest(agentSystemPrompt(), "Subtask 9."), map[string]string{"X-Session-ID": "root-A/sub-9", "X-Parent-Session-ID": "root-A"})
		if d.Chosen.Worker != parentWorker || !strings.Contains(d.Chosen.Reason, "session rule parent") {
			t.Errorf("dry run of a new child: %s (%s)", d.Chosen.Worker, d.Chosen.Reason)
		}

		// Saturate the parent's worker with other clients' long requests (straight to it): its
		// queue passes the busy threshold and the next subagents spread over the others.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var fill sync.WaitGroup
		for i := range 8 {
			fill.Go(func() {
				// ignore_eos: the simulator (like vLLM) would otherwise end it at its natural EOS.
				body := map[string]any{"model": servedModel, "max_tokens": 20000, "ignore_eos": true,
					"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("filler %d %s", i, longText(900+i, 10))}}}
				data, _ := json.Marshal(body)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, parentWorker+"/v1/chat/completions", bytes.NewReader(data))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("filler: %v", err)
					}
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			})
		}
		defer fill.Wait()
		defer cancel()
		if !f.pollTarget(parentWorker, 5*time.Second, func(v targetJSON) bool { return v.Metrics != nil && v.Metrics.Waiting >= 3 }) {
			t.Fatalf("the parent's worker never reported a queue: %s", f.get("/debug/workers"))
		}
		spread := map[string]int{}
		for _, r := range f.sendChildren("root-A", 5, 4) {
			spread[r.worker]++
			if r.worker == parentWorker {
				t.Errorf("a subagent went to the saturated parent's worker %s", parentWorker)
			}
		}
		d = f.dryRun(chatRequest(agentSystemPrompt(), "Subtask 10."), map[string]string{"X-Session-ID": "root-A/sub-10", "X-Parent-Session-ID": "root-A"})
		if d.Chosen.Worker == parentWorker || !strings.Contains(d.Chosen.Reason, "avoided 1 busy target") {
			t.Errorf("dry run with the parent's worker saturated: %s (%s)", d.Chosen.Worker, d.Chosen.Reason)
		}
		t.Logf("with the parent's worker saturated, subagents went to %v", spread)
	})

	t.Run("off", func(t *testing.T) {
		f := startFleet(t, tok, fleetSpec{workers: 3, events: true, simOpts: maxSeqs,
			args: append(args, "--sessions-parent-aware=false")})
		parentWorker := f.startRoot("root-B")
		// A child whose prompt shares nothing cached: without parent-aware placement the parent's
		// worker earns nothing, every target costs the same and the tie is broken at random.
		cold := chatRequest("You are a test-writing subagent. "+longText(77, 60), "Subtask 1.")
		h := map[string]string{"X-Session-ID": "root-B/sub-1", "X-Parent-Session-ID": "root-B"}
		// Wait for a metrics scrape after the root's turn: one taken while it ran still shows its
		// KV usage on the parent's worker for up to metrics_interval.
		f.awaitSettled()
		d := f.dryRun(cold, h)
		if strings.Contains(d.Chosen.Reason, "session rule") || !strings.Contains(d.Chosen.Reason, "tie among 3") {
			t.Errorf("off: %s (%s), want a random tie with no session rule", d.Chosen.Worker, d.Chosen.Reason)
		}
		for _, c := range d.Candidates {
			if c.Cost != d.Candidates[0].Cost {
				t.Errorf("off: costs differ: %s\nworkers: %s", d.raw, f.get("/debug/workers"))
				break
			}
		}
		// Ties are drawn at random: over repeated dry runs the child is placed on every worker.
		seen := map[string]bool{}
		for i := 0; i < 200 && len(seen) < 3; i++ {
			seen[f.dryRun(cold, h).Chosen.Worker] = true
		}
		if len(seen) != 3 {
			t.Errorf("off: a cold child was only ever placed on %v", seen)
		}
		// Subagents forked from the parent's context still find its prefix through the KV index,
		// without any session rule.
		var onParent atomic.Int32
		for _, r := range f.sendChildren("root-B", 1, 4) {
			if r.worker == parentWorker {
				onParent.Add(1)
			}
		}
		d = f.dryRun(chatRequest(agentSystemPrompt(), "Subtask 5."), map[string]string{"X-Session-ID": "root-B/sub-5", "X-Parent-Session-ID": "root-B"})
		if strings.Contains(d.Chosen.Reason, "session rule parent") {
			t.Errorf("off: parent rule applied: %s", d.Chosen.Reason)
		}
		t.Logf("off: %d of 4 forked subagents on the parent's worker by KV overlap alone", onParent.Load())

		// With placement on, the same cold child goes to the parent's worker every time (a random
		// tie would pick it 20 times in a row with probability 3^-20).
		on := startFleet(t, tok, fleetSpec{workers: 3, events: true, simOpts: maxSeqs, args: args})
		pw := on.startRoot("root-C")
		h = map[string]string{"X-Session-ID": "root-C/sub-1", "X-Parent-Session-ID": "root-C"}
		for range 20 {
			if d := on.dryRun(cold, h); d.Chosen.Worker != pw || !strings.Contains(d.Chosen.Reason, "session rule parent") {
				t.Fatalf("on: cold child placed on %s (%s), want the parent's %s by the parent rule", d.Chosen.Worker, d.Chosen.Reason, pw)
			}
		}
	})
}

// TestHealthFlapChecksKVState: a worker whose /health flaps (ejected, then readmitted) may have
// restarted with an empty cache. Approximate mode forgets what it assumed about it; the
// KV-event index asks the worker's replay ring and, since this engine did not restart (its
// ring still holds the last applied batch), keeps its state: no reset, same residency version.
// The other worker is untouched.
func TestHealthFlapChecksKVState(t *testing.T) {
	tok := needModel(t)
	var down [2]atomic.Bool
	wrap := func(i int, h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/health" && down[i].Load() {
				http.Error(w, "restarting", http.StatusServiceUnavailable)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	f := startFleet(t, tok, fleetSpec{workers: 2, events: true, wrap: wrap,
		args: []string{"--health-failure-threshold", "1", "--health-success-threshold", "1"}})
	req := chatRequest("You are flapping.", longText(31, 60))
	resp, err := f.client.CreateChatCompletion(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	w := resp.Header().Get("X-Kvgate-Worker")
	flap, other := 0, f.urls[1]
	if w != f.urls[0] {
		flap, other = 1, f.urls[0]
	}
	f.awaitCached(req, w, nil)
	before := map[string]targetJSON{}
	for _, v := range f.targets() {
		before[v.Worker] = v
	}
	// (A target whose events are healthy keeps its routed prompts out of the approximate index,
	// in a ring that Forget drops: router/kv_recent.go; so only the index is checked here.)
	if before[w].IndexBlocks == 0 || before[other].IndexBlocks == 0 {
		t.Fatalf("nothing known before the flap: %s", f.get("/debug/workers"))
	}

	down[flap].Store(true)
	if !f.pollTarget(w, 5*time.Second, func(v targetJSON) bool { return v.Mode != "" && !isHealthy(f, w) }) {
		t.Fatalf("worker never ejected: %s", f.get("/debug/workers"))
	}
	down[flap].Store(false)
	checked := func(v targetJSON) bool {
		return v.Subscription != nil && v.Subscription.ReplaysOK > before[w].Subscription.ReplaysOK
	}
	if !f.pollTarget(w, 5*time.Second, func(v targetJSON) bool { return isHealthy(f, w) && checked(v) }) {
		t.Fatalf("readmitted worker's KV state not checked against its ring: %s", f.get("/debug/workers"))
	}
	for _, v := range f.targets() {
		switch v.Worker {
		case w:
			if v.ApproximateBlocks == nil || *v.ApproximateBlocks != 0 {
				t.Errorf("flapped worker: approximate mode still assumes %v blocks", v.ApproximateBlocks)
			}
			if v.Subscription.Resets["health"] != 0 || v.Subscription.ResidencyVersion != before[w].Subscription.ResidencyVersion ||
				v.IndexBlocks != before[w].IndexBlocks {
				t.Errorf("flapped worker that did not restart lost its index: %+v (before %d blocks)", v, before[w].IndexBlocks)
			}
		case other:
			if v.Subscription.Resets["health"] != 0 || v.IndexBlocks != before[other].IndexBlocks {
				t.Errorf("the other worker lost state: %+v (before %d blocks)", v, before[other].IndexBlocks)
			}
		}
	}
	// The stream continues: its blocks are still indexed, new ones are indexed as before.
	f.awaitCached(req, w, nil)
	fresh := chatRequest("You are back.", longText(32, 60))
	if _, err := f.direct[w].CreateChatCompletion(context.Background(), fresh); err != nil {
		t.Fatal(err)
	}
	f.awaitCached(fresh, w, nil)
}

func isHealthy(f *fleet, u string) bool {
	var out struct {
		Targets []struct {
			Worker  string `json:"worker"`
			Healthy bool   `json:"healthy"`
		} `json:"targets"`
	}
	_ = json.Unmarshal([]byte(f.get("/debug/workers")), &out)
	for _, v := range out.Targets {
		if v.Worker == u {
			return v.Healthy
		}
	}
	return false
}
