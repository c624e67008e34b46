package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/sim"
)

// TestGatewayRoutesRepeatsToTheCache drives `kvgate serve`'s assembly (config loading,
// buildRouting, server) with the go-openai client against simulated vLLM workers, with live
// KV events and again without (approximate mode): a repeated long prompt goes back to the
// worker that cached it, the response headers say so, the worker's usage.cached_tokens
// confirms it (non-stream and from the stream's usage chunk), the gateway's feedback metrics
// saw it, and all load returns to zero.
func TestGatewayRoutesRepeatsToTheCache(t *testing.T) {
	tok := needModel(t)
	for _, events := range []bool{true, false} {
		mode := router.ModeApproximate
		if events {
			mode = router.ModeEvents
		}
		t.Run(mode, func(t *testing.T) {
			spec := fleetSpec{workers: 3, events: events}
			if !events {
				spec.args = []string{"--router-policy", "kv"} // auto is round_robin without kv_events
			}
			f := startFleet(t, tok, spec)
			ctx := context.Background()
			for seed := range 2 {
				req := chatRequest("You are auditor "+strconv.Itoa(seed)+".", longText(seed, 200))
				first, err := f.client.CreateChatCompletion(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				w1 := first.Header().Get("X-Kvgate-Worker")
				if _, ok := f.sims[w1]; !ok {
					t.Fatalf("X-Kvgate-Worker %q is not a worker", w1)
				}
				if first.Usage.PromptTokens < 1000 {
					t.Fatalf("prompt too short for the test: %d tokens", first.Usage.PromptTokens)
				}
				d := f.awaitCached(req, w1, nil)
				if d.Chosen.Worker != w1 {
					t.Fatalf("dry run chose %s, the cache is on %s (%s)", d.Chosen.Worker, w1, d.Chosen.Reason)
				}

				again, err := f.client.CreateChatCompletion(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				if got := again.Header().Get("X-Kvgate-Worker"); got != w1 {
					t.Fatalf("seed %d: repeat went to %s, first to %s", seed, got, w1)
				}
				blocks, _ := strconv.Atoi(again.Header().Get(router.HeaderCachedBlocks))
				if blocks != d.PromptBlocks {
					t.Errorf("%s = %d, want all %d prompt blocks", router.HeaderCachedBlocks, blocks, d.PromptBlocks)
				}
				want := router.PredictedCachedTokens(blocks, 16, again.Usage.PromptTokens)
				if again.Usage.PromptTokensDetails == nil || again.Usage.PromptTokensDetails.CachedTokens != want || want == 0 {
					t.Fatalf("seed %d: worker reported cached %+v, gateway predicted %d", seed, again.Usage.PromptTokensDetails, want)
				}
				if again.Usage.PromptTokens != d.PromptTokens {
					t.Errorf("worker counted %d prompt tokens, gateway %d", again.Usage.PromptTokens, d.PromptTokens)
				}

				// The same through a stream: the usage chunk is relayed and read on the way.
				sreq := req
				sreq.Stream = true
				sreq.StreamOptions = &openai.StreamOptions{IncludeUsage: true}
				st, err := f.client.CreateChatCompletionStream(ctx, sreq)
				if err != nil {
					t.Fatal(err)
				}
				if got := st.Header().Get("X-Kvgate-Worker"); got != w1 {
					t.Errorf("stream went to %s, cache is on %s", got, w1)
				}
				var usage *openai.Usage
				for {
					chunk, err := st.Recv()
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					if chunk.Usage != nil {
						usage = chunk.Usage
					}
				}
				st.Close()
				if usage == nil || usage.PromptTokensDetails == nil || usage.PromptTokensDetails.CachedTokens != want {
					t.Fatalf("stream usage %+v, want cached %d", usage, want)
				}
			}
			f.awaitIdle()
			labels := map[string]string{"model": servedModel, "mode": mode}
			// Per seed: the repeat and the stream reported the full hit the gateway predicted.
			if got := f.metric("kvgate_router_cached_tokens_reported_total", labels); got <= 0 {
				t.Errorf("no cached tokens reported to the feedback metrics (%v)", got)
			}
			if p, r := f.metric("kvgate_router_cached_tokens_predicted_total", labels), f.metric("kvgate_router_cached_tokens_reported_total", labels); p != r {
				t.Errorf("predicted %v cached tokens, workers reported %v", p, r)
			}
			// The repeat and the stream of each prompt report their hit. The first request of each
			// prompt is a miss, which vLLM (and the sim) reports without prompt_tokens_details.
			if got := f.metric("kvgate_router_usage_reports_total", nil); got != 4 {
				t.Errorf("usage reports with cached_tokens = %v, want 4 (2 hits × 2 prompts, stream included)", got)
			}
			if got := f.metric("kvgate_router_usage_without_cached_tokens_total", nil); got != 2 {
				t.Errorf("usage reports without cached_tokens = %v, want 2 (the first, cold request per prompt)", got)
			}
			if got := f.metric("kvgate_router_prompt_token_mismatches_total", nil); got != 0 {
				t.Errorf("%v prompt token mismatches between gateway and workers", got)
			}
			for _, v := range f.targets() {
				if v.Mode != mode {
					t.Errorf("%s: mode %q, want %q", v.Worker, v.Mode, mode)
				}
				if events && (v.Subscription == nil || v.Subscription.State != "live") {
					t.Errorf("%s: subscription %+v, want live", v.Worker, v.Subscription)
				}
			}
		})
	}
}

// TestDebugRouteContract pins POST /debug/route's documented JSON (docs/operations.md, "POST /debug/route"):
// fixed fields with per-candidate tiers, mode and cost; a dry run sends nothing, accounts no load
// and creates no session; the session headers it saw are echoed.
func TestDebugRouteContract(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 2, events: true})
	req := chatRequest("You are a contract tester.", longText(7, 120))
	resp, err := f.client.CreateChatCompletion(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	w1 := resp.Header().Get("X-Kvgate-Worker")
	f.awaitCached(req, w1, nil)
	before := map[string]int64{}
	for u, s := range f.sims {
		before[u] = s.Stats().Requests
	}

	code, _, body := f.post("/debug/route", req, map[string]string{"X-Session-ID": "dry-1", "X-Parent-Session-ID": "root-1"})
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	// Every documented key, with its JSON type.
	var raw map[string]any
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"prompt_tokens", "prompt_blocks"} {
		if _, ok := raw[k].(float64); !ok {
			t.Errorf("%s missing or not a number in %s", k, body)
		}
	}
	chosen, _ := raw["chosen"].(map[string]any)
	if raw["policy"] != "kv" || chosen == nil || chosen["worker"] != w1 || chosen["dp_rank"] != 0.0 || chosen["reason"] == "" {
		t.Errorf("policy/chosen: %s", body)
	}
	cands, _ := raw["candidates"].([]any)
	if len(cands) != 2 {
		t.Fatalf("candidates: %s", body)
	}
	for _, c := range cands {
		m := c.(map[string]any)
		for _, k := range []string{"dp_rank", "g1_blocks", "g2_blocks", "g3_blocks", "cost"} {
			if _, ok := m[k].(float64); !ok {
				t.Errorf("candidate %v lacks numeric %s", m, k)
			}
		}
		if _, ok := f.sims[m["worker"].(string)]; !ok || m["mode"] != "events" {
			t.Errorf("candidate %v: worker must be a configured URL and mode events", m)
		}
	}
	var d routeJSON
	_ = json.Unmarshal(body, &d)
	if d.g1Of(w1) != d.PromptBlocks || d.PromptBlocks != d.PromptTokens/16 {
		t.Errorf("g1 on %s = %d of %d blocks (%d tokens)", w1, d.g1Of(w1), d.PromptBlocks, d.PromptTokens)
	}
	for _, c := range d.Candidates {
		if c.Worker != w1 && c.G1Blocks != 0 {
			t.Errorf("%s: g1 %d, but only %s computed the prompt", c.Worker, c.G1Blocks, w1)
		}
	}
	if d.SessionID != kvkey.HashSessionID("dry-1") {
		t.Errorf("session_id = %q", d.SessionID)
	}
	// Nothing was sent, nothing accounted, no session created.
	for u, s := range f.sims {
		if s.Stats().Requests != before[u] {
			t.Errorf("%s served a request during a dry run", u)
		}
	}
	f.awaitIdle()
	if code, _, _ := f.post("/debug/route", map[string]any{"model": servedModel, "prompt": "hello"}, nil); code != http.StatusOK {
		t.Errorf("completions dry run: %d", code)
	}
	if got := f.get("/debug/sessions/dry-1"); !json.Valid([]byte(got)) || !strings.Contains(got, "unknown session") {
		t.Errorf("a dry run created session state: %s", got)
	}
	if code, _, body := f.post("/debug/route", map[string]any{"model": servedModel}, nil); code != http.StatusBadRequest {
		t.Errorf("a body without messages or prompt: %d %s, want 400", code, body)
	}
}

// TestTemplateErrorIs400: a request the model's chat template raises on, or that vLLM's chat
// preprocessing refuses, gets 400 with the template's message before any worker sees it.
func TestTemplateErrorIs400(t *testing.T) {
	// The workers' template (vllm serve --chat-template) refuses system messages, as several
	// real templates do; the gateway is given the same file (chat_template).
	tmpl := filepath.Join(t.TempDir(), "no-system.jinja")
	src := "{%- for m in messages %}{%- if m.role == 'system' %}{{ raise_exception('System role not supported by this template') }}{%- endif %}" +
		"{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}{{ '<|im_start|>assistant\\n' }}"
	if err := os.WriteFile(tmpl, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 1, args: []string{"--chat-template", tmpl, "--router-policy", "kv",
		"--default-chat-template-kwargs", `{"enable_thinking": false}`}})
	cases := []struct {
		name, param, message string
		body                 any
	}{
		{"template raises", "", "System role not supported by this template", chatRequest("be brief", "hi")},
		{"preprocessing refuses", "chat_template_kwargs", "Found unexpected chat template kwargs from request",
			map[string]any{"model": servedModel, "messages": []map[string]string{{"role": "user", "content": "hi"}},
				"chat_template_kwargs": map[string]any{"tokenize": true}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, path := range []string{"/v1/chat/completions", "/debug/route"} {
				code, _, body := f.post(path, c.body, nil)
				var e struct {
					Error struct {
						Message string  `json:"message"`
						Type    string  `json:"type"`
						Param   *string `json:"param"`
						Code    int     `json:"code"`
					} `json:"error"`
				}
				if err := json.Unmarshal(body, &e); err != nil || code != http.StatusBadRequest || e.Error.Code != 400 ||
					e.Error.Type != "BadRequestError" || !strings.Contains(e.Error.Message, c.message) {
					t.Fatalf("%s: %d %s, want 400 BadRequestError with %q", path, code, body, c.message)
				}
				if (c.param == "") != (e.Error.Param == nil) || (e.Error.Param != nil && *e.Error.Param != c.param) {
					t.Errorf("%s: param %v, want %q", path, e.Error.Param, c.param)
				}
			}
		})
	}
	for u, s := range f.sims {
		if n := s.Stats().Requests; n != 0 {
			t.Errorf("%s served %d requests; refused requests must not reach a worker", u, n)
		}
	}
	// The same template accepts requests without a system message.
	if _, err := f.client.CreateChatCompletion(context.Background(), openai.ChatCompletionRequest{Model: servedModel,
		MaxCompletionTokens: 2, Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}}}); err != nil {
		t.Fatal(err)
	}
}

// TestSessionEndpointsAndClose: a session's request is forwarded with X-Session-ID, its state is
// visible at GET /debug/sessions/{id} (affinity on the worker that served it, and a frontier the
// worker's session-attributed KV events advanced), a later turn returns there, and
// X-Dynamo-Session-Final closes it.
func TestSessionEndpointsAndClose(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 2, events: true})
	h := map[string]string{"X-Correlation-ID": "conv/7"}
	req := chatRequest("You are session seven.", longText(70, 60))
	code, hdr, body := f.post("/v1/chat/completions", req, h)
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	w1 := hdr.Get("X-Kvgate-Worker")
	var view struct {
		ID       string `json:"id"`
		Affinity *struct {
			Worker string `json:"worker"`
		} `json:"affinity"`
		Routed    int `json:"routed_requests"`
		Frontiers []struct {
			Target struct {
				Worker string `json:"worker"`
			} `json:"target"`
			Depth int `json:"depth"`
		} `json:"frontiers"`
	}
	got := f.get("/debug/sessions/conv/7")
	if err := json.Unmarshal([]byte(got), &view); err != nil || view.ID != kvkey.HashSessionID("conv/7") || view.Affinity == nil || view.Affinity.Worker != w1 {
		t.Fatalf("session view %s, want affinity %s", got, w1)
	}
	// The worker's KV events, attributed to the forwarded X-Session-ID, move the session's
	// frontier on w1 down to the prompt's last full block (routing found nothing cached).
	blocks := f.dryRun(req, nil).PromptBlocks
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got = f.get("/debug/sessions/conv/7")
		view.Frontiers = nil
		_ = json.Unmarshal([]byte(got), &view)
		if len(view.Frontiers) == 1 && view.Frontiers[0].Target.Worker == w1 && view.Frontiers[0].Depth == blocks {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session frontier never reached the prompt's %d blocks on %s: %s", blocks, w1, got)
		}
	}
	d := f.dryRun(req, h)
	if d.Chosen.Worker != w1 || !strings.Contains(d.Chosen.Reason, "affinity") {
		t.Errorf("the session's next turn: %s (%s), want %s by affinity", d.Chosen.Worker, d.Chosen.Reason, w1)
	}
	h["X-Dynamo-Session-Final"] = "true"
	if code, _, body := f.post("/v1/chat/completions", req, h); code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	if got := f.get("/debug/sessions/conv/7"); !strings.Contains(got, "unknown session") {
		t.Errorf("closed session still tracked: %s", got)
	}
	if w := f.sims[w1].Stats(); w.Requests < 2 {
		t.Errorf("%s served %d requests, want both turns", w1, w.Requests)
	}
}

// TestLoadReturnsToZero: whatever way a request ends — finished, cancelled by the client mid-
// stream, broken off by a dying worker, or refused — the gateway's load accounting (in flight,
// prefill tokens, held blocks) returns to zero.
func TestLoadReturnsToZero(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 2, events: true, simOpts: func(i int, o *sim.Options) {
		o.ITL = 5 * time.Millisecond
		if i == 1 {
			o.DieMidStreamAfter = 3 // worker 1 crashes every stream after 3 tokens
		}
	}})
	ctx := context.Background()
	// Six concurrent prompts spread over both workers by load, so the dying one usually breaks
	// some of the three that are not cancelled; when timing puts all three on the healthy one,
	// another round of six follows (at most four), so that every end is covered.
	covered := func() bool {
		return f.sims[f.urls[1]].Stats().DiedMidStream > 0 && f.metric("kvgate_client_disconnects_total", nil) > 0
	}
	for round := 0; round < 4 && !covered(); round++ {
		loadRound(ctx, f, round)
	}
	f.awaitIdle()
	if died := f.sims[f.urls[1]].Stats().DiedMidStream; died == 0 {
		t.Error("no stream was broken off by the dying worker; the test did not cover that end")
	}
	if f.metric("kvgate_client_disconnects_total", nil) == 0 {
		t.Error("no client disconnect was seen; the test did not cancel any stream")
	}
}

// loadRound sends six concurrent streamed prompts; the even ones are cancelled by the client
// after their second token.
func loadRound(ctx context.Context, f *fleet, round int) {
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			req := chatRequest("You are load test "+strconv.Itoa(round)+"."+strconv.Itoa(i)+".", longText(200+10*round+i, 40))
			req.Stream, req.MaxCompletionTokens = true, 200
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			st, err := f.client.CreateChatCompletionStream(cctx, req)
			if err != nil {
				return // a refused or failed request is one of the ends under test
			}
			defer st.Close()
			for n := 0; ; n++ {
				if _, err := st.Recv(); err != nil {
					return // finished, or broken off by the dying worker
				}
				if i%2 == 0 && n == 1 {
					// The client goes away mid-stream, before the dying worker would cut it
					// (after 3 tokens), so that this end is covered wherever it was routed.
					cancel()
				}
			}
		})
	}
	wg.Wait()
}
