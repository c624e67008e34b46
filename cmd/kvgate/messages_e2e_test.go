package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// messagesBody is an Anthropic tool loop: tools, a tool_use with its tool_result, thinking.
func messagesBody(stream bool) map[string]any {
	return map[string]any{
		"model": servedModel, "max_tokens": 8, "stream": stream,
		"system": []any{map[string]any{"type": "text", "text": "You are a coding agent. " + longText(7, 60)}},
		"tools": []any{map[string]any{"name": "read_file", "description": "Read a file",
			"input_schema": map[string]any{"properties": map[string]any{"path": map[string]any{"type": "string"}}}}},
		"messages": []any{
			map[string]any{"role": "user", "content": "Show me /etc/hostname"},
			map[string]any{"role": "assistant", "content": []any{
				map[string]any{"type": "thinking", "thinking": "Read it.", "signature": "s"},
				map[string]any{"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": map[string]any{"path": "/etc/hostname"}}}},
			map[string]any{"role": "user", "content": []any{
				map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": "box-1"},
				map[string]any{"type": "text", "text": "Summarize."}}},
		},
	}
}

func (f *fleet) rawPost(url string, body any) (int, http.Header, []byte) {
	f.t.Helper()
	data, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(data))
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// /v1/messages through the gateway in front of the simulator: routed with the prompt's
// blocks, answered in Anthropic's shapes, streamed as Anthropic events, count_tokens answered
// by the gateway with the worker's own count, and errors in Anthropic's shape.
func TestMessagesThroughGateway(t *testing.T) {
	tok := needModel(t)
	var countHops atomic.Int32 // count_tokens requests that reached a worker
	f := startFleet(t, tok, fleetSpec{workers: 2, events: true, wrap: func(_ int, h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/messages/count_tokens" {
				countHops.Add(1)
			}
			h.ServeHTTP(w, r)
		})
	}})

	// The gateway's local count equals the worker's.
	code, _, gwCount := f.post("/v1/messages/count_tokens", messagesBody(false), nil)
	if code != http.StatusOK {
		t.Fatalf("count_tokens: %d %s", code, gwCount)
	}
	if n := countHops.Load(); n != 0 {
		t.Fatalf("count_tokens reached a worker %d times; the gateway answers it", n)
	}
	_, _, simCount := f.rawPost(f.urls[0]+"/v1/messages/count_tokens", messagesBody(false))
	var gc, sc struct {
		InputTokens int `json:"input_tokens"`
	}
	_ = json.Unmarshal(gwCount, &gc)
	_ = json.Unmarshal(simCount, &sc)
	if gc.InputTokens == 0 || gc.InputTokens != sc.InputTokens {
		t.Fatalf("count_tokens: gateway %s, worker %s", gwCount, simCount)
	}
	// /debug/route sees the same prompt length.
	if d := f.dryRunPath("/v1/messages", messagesBody(false)); d.PromptTokens != gc.InputTokens {
		t.Errorf("/debug/route prompt_tokens %d, want %d", d.PromptTokens, gc.InputTokens)
	}

	code, h, body := f.post("/v1/messages", messagesBody(false), nil)
	if code != http.StatusOK {
		t.Fatalf("messages: %d %s", code, body)
	}
	var msg struct {
		Type    string `json:"type"`
		Role    string `json:"role"`
		Content []struct {
			Type string `json:"type"`
		} `json:"content"`
		StopReason string `json:"stop_reason"`
		Usage      struct {
			InputTokens int `json:"input_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &msg); err != nil || msg.Type != "message" || msg.Role != "assistant" || len(msg.Content) != 1 || msg.StopReason == "" {
		t.Fatalf("not an Anthropic message: %s", body)
	}
	first := h.Get("X-Kvgate-Worker")
	// /debug/route tells a Messages body from a chat one by itself.
	f.awaitCached(messagesBody(false), first, nil)
	// The same conversation again goes where its prefix is cached, and the worker reports
	// the cache hit in Anthropic's usage.
	_, h2, body2 := f.post("/v1/messages", messagesBody(false), nil)
	if h2.Get("X-Kvgate-Worker") != first {
		t.Errorf("repeat went to %s, first to %s", h2.Get("X-Kvgate-Worker"), first)
	}
	if !strings.Contains(string(body2), `"cache_read_input_tokens"`) {
		t.Errorf("repeat reports no cache read: %s", body2)
	}

	// Streaming: Anthropic events, relayed whole, ending with message_stop and no error.
	code, h, body = f.post("/v1/messages", messagesBody(true), nil)
	if code != http.StatusOK || !strings.HasPrefix(h.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %d %s %s", code, h.Get("Content-Type"), body)
	}
	var names []string
	for _, line := range strings.Split(string(body), "\n") {
		if n, ok := strings.CutPrefix(line, "event: "); ok {
			names = append(names, n)
		}
	}
	want := "message_start content_block_start content_block_delta"
	if got := strings.Join(names, " "); !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "content_block_stop message_delta message_stop") {
		t.Errorf("events %q", got)
	}
	if strings.Contains(string(body), "[DONE]") || strings.Contains(string(body), "event: error") {
		t.Errorf("the gateway added to a complete Anthropic stream: %s", body)
	}

	// Errors the gateway answers itself are Anthropic-shaped, with vLLM's status and Anthropic's type.
	bad := messagesBody(false)
	bad["model"] = "nope"
	code, _, body = f.post("/v1/messages", bad, nil)
	var eb struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &eb); code != http.StatusNotFound || err != nil || eb.Type != "error" || eb.Error.Type != "not_found_error" || !strings.Contains(eb.Error.Message, "nope") {
		t.Errorf("unknown model: %d %s", code, body)
	}
	delete(bad, "max_tokens")
	bad["model"] = servedModel
	if code, _, body = f.post("/v1/messages", bad, nil); code != http.StatusBadRequest || !strings.Contains(string(body), `"type":"error"`) {
		t.Errorf("missing max_tokens: %d %s", code, body)
	}
}

// dryRunPath asks POST /debug/route for the decision of a body posted to path.
func (f *fleet) dryRunPath(path string, req any) routeJSON {
	f.t.Helper()
	code, _, body := f.rawPost(f.admin.URL+"/debug/route?endpoint="+path, req)
	if code != http.StatusOK {
		f.t.Fatalf("/debug/route: %d %s", code, body)
	}
	var d routeJSON
	if err := json.Unmarshal(body, &d); err != nil {
		f.t.Fatal(err)
	}
	return d
}

// Interactive Claude Code sends "tools": [] on its session-title request and its /context
// count_tokens calls: through the gateway they are served (KV-routed with the prompt the worker
// renders, no prompt-token mismatch), and counted as the worker counts them; chat keeps vLLM's
// refusal, from the gateway and the worker alike.
func TestEmptyToolsThroughGateway(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 1, events: true})
	title := map[string]any{"model": servedModel, "max_tokens": 8, "tools": []any{},
		"system":   []any{map[string]any{"type": "text", "text": "Write a 3-word title for the conversation."}},
		"messages": []any{map[string]any{"role": "user", "content": "fix the failing test in server/"}}}
	for _, stream := range []bool{false, true} {
		title["stream"] = stream
		if code, _, body := f.post("/v1/messages", title, nil); code != http.StatusOK {
			t.Fatalf("messages stream=%v: %d %s", stream, code, body)
		}
	}
	delete(title, "stream")
	delete(title, "max_tokens")
	code, _, gw := f.post("/v1/messages/count_tokens", title, nil)
	_, _, direct := f.rawPost(f.urls[0]+"/v1/messages/count_tokens", title)
	var gc, wc struct {
		InputTokens int `json:"input_tokens"`
	}
	_ = json.Unmarshal(gw, &gc)
	_ = json.Unmarshal(direct, &wc)
	if code != http.StatusOK || gc.InputTokens == 0 || gc.InputTokens != wc.InputTokens {
		t.Fatalf("count_tokens: gateway %d %s, worker %s", code, gw, direct)
	}
	chat := map[string]any{"model": servedModel, "max_tokens": 2, "tools": []any{},
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}}
	code, _, gwBody := f.post("/v1/chat/completions", chat, nil)
	wcode, _, wBody := f.rawPost(f.urls[0]+"/v1/chat/completions", chat)
	const refusal = "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely."
	if code != 400 || wcode != 400 || !strings.Contains(string(gwBody), refusal) || !strings.Contains(string(wBody), refusal) {
		t.Errorf("chat: gateway %d %s, worker %d %s", code, gwBody, wcode, wBody)
	}
	if n := f.metric("kvgate_router_prompt_token_mismatches_total", nil); n != 0 {
		t.Errorf("%v prompt-token mismatches, want 0", n)
	}
}
