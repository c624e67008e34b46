package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// respCall sends method path with body (nil: none) to the gateway; it returns status, the
// worker that served it (X-Kvgate-Worker) and the body.
func respCall(t *testing.T, f *fleet, method, path string, body any) (int, string, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		r = strings.NewReader(string(data))
	}
	req, _ := http.NewRequest(method, f.gw.URL+path, r)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Kvgate-Worker"), b
}

// streamedID reads a Responses event stream: the id of response.created, and whether it ended
// with response.completed and nothing after (no gateway error event).
func streamedID(t *testing.T, body []byte) (string, bool) {
	t.Helper()
	id, last := "", ""
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type     string `json:"type"`
			Response struct {
				ID string `json:"id"`
			} `json:"response"`
		}
		if json.Unmarshal([]byte(data), &ev) != nil {
			last = "unparsable: " + data
			continue
		}
		if ev.Type == "response.created" {
			id = ev.Response.ID
		}
		last = ev.Type
	}
	return id, last == "response.completed"
}

// TestResponsesPinnedConversation: with 3 workers under round robin (which would spread the
// turns), a conversation chained by previous_response_id stays on the worker that stores its
// responses, streamed or not; GET of the id goes there too; once that worker is gone the
// follow-up gets vLLM's 404 for an unknown response id.
func TestResponsesPinnedConversation(t *testing.T) {
	tok := needModel(t)
	var gone [3]atomic.Bool // worker i drops every connection (it left the fleet)
	f := startFleet(t, tok, fleetSpec{workers: 3, args: []string{"--router-policy", "round_robin"},
		wrap: func(i int, h http.Handler) http.Handler {
			return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
				if gone[i].Load() {
					panic(http.ErrAbortHandler)
				}
				h.ServeHTTP(rw, r)
			})
		}})
	code, w1, body := respCall(t, f, http.MethodPost, "/v1/responses", map[string]any{
		"model": servedModel, "instructions": "Be brief.", "input": "hello there", "max_output_tokens": 4})
	if code != http.StatusOK || w1 == "" {
		t.Fatalf("turn 1: %d %s", code, body)
	}
	var r1 struct{ ID, Object string }
	if err := json.Unmarshal(body, &r1); err != nil || r1.Object != "response" || r1.ID == "" {
		t.Fatalf("turn 1 body %s", body)
	}
	prev := r1.ID
	for turn := 2; turn <= 5; turn++ {
		stream := turn%2 == 0
		code, w, body := respCall(t, f, http.MethodPost, "/v1/responses", map[string]any{
			"model": servedModel, "input": "and more", "previous_response_id": prev, "stream": stream, "max_output_tokens": 4})
		if code != http.StatusOK {
			t.Fatalf("turn %d: %d %s", turn, code, body)
		}
		if w != w1 {
			t.Fatalf("turn %d went to %s, want the pinned %s", turn, w, w1)
		}
		if stream {
			id, clean := streamedID(t, body)
			if id == "" || !clean {
				t.Fatalf("turn %d stream: id %q clean %v\n%s", turn, id, clean, body)
			}
			prev = id
		} else {
			var r struct{ ID string }
			_ = json.Unmarshal(body, &r)
			prev = r.ID
		}
	}
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/v1/responses/" + prev, http.StatusOK},
		{http.MethodPost, "/v1/responses/" + prev + "/cancel", http.StatusBadRequest}, // synchronous
		{http.MethodDelete, "/v1/responses/" + prev, http.StatusMethodNotAllowed},     // vLLM has no DELETE
		{http.MethodGet, "/v1/responses/resp_unknown", http.StatusNotFound},
	} {
		code, w, body := respCall(t, f, tc.method, tc.path, nil)
		if code != tc.want {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, code, body, tc.want)
		}
		if tc.want != http.StatusNotFound && w != w1 {
			t.Errorf("%s %s went to %s, want %s", tc.method, tc.path, w, w1)
		}
	}
	if pins := f.get("/debug/sessions/"); !strings.Contains(pins, prev) || !strings.Contains(pins, w1) {
		t.Errorf("/debug/sessions/ does not show the pin %s → %s: %s", prev, w1, pins)
	}

	// The pinned worker goes away: the follow-up must not land elsewhere.
	for i, u := range f.urls {
		if u == w1 {
			gone[i].Store(true)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, w, body := respCall(t, f, http.MethodPost, "/v1/responses", map[string]any{
			"model": servedModel, "input": "still there?", "previous_response_id": prev, "max_output_tokens": 4})
		if code == http.StatusOK && w != w1 {
			t.Fatalf("follow-up served by %s, not the pinned %s", w, w1)
		}
		if code == http.StatusNotFound {
			want := `{"error":{"message":"Response with id '` + prev + `' not found.","type":"invalid_request_error","param":"response_id","code":404}}`
			if string(body) != want {
				t.Fatalf("404 body %s\nwant %s", body, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("follow-up after the worker left: %d %s, want 404", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestResponsesTokensMatchSimulator: for a set of Responses bodies the gateway's prompt token
// count (POST /debug/route) equals the simulator's (usage.input_tokens) for every field vLLM
// renders, tools included, so routing hashes what the worker holds and
// kvgate_router_prompt_token_mismatches_total stays 0.
func TestResponsesTokensMatchSimulator(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 1, args: []string{"--router-policy", "kv_no_load"}})
	bodies := map[string]map[string]any{
		"string input":             {"input": "What is the capital of France?"},
		"instructions":             {"instructions": "You are terse.", "input": "Name three colours."},
		"message items":            {"input": []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "Hi"}}}, map[string]any{"role": "assistant", "content": "Hello!"}, map[string]any{"role": "user", "content": "Tell me a joke."}}},
		"function call and output": {"instructions": "Use tools.", "input": []any{map[string]any{"role": "user", "content": "Weather in Paris?"}, map[string]any{"type": "reasoning", "summary": []any{}, "content": []any{map[string]any{"type": "reasoning_text", "text": "Need the tool."}}}, map[string]any{"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": `{"city":"Paris"}`}, map[string]any{"type": "function_call_output", "call_id": "call_1", "output": `{"temp_c":18}`}}},
		"output message":           {"input": []any{map[string]any{"role": "user", "content": "Q"}, map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "A"}}}, map[string]any{"role": "user", "content": "Q2"}}},
		// Every field vLLM renders into the prompt: tools (function, namespaced, built-in),
		// tool_choice, instructions, reasoning; text.format is read and renders nothing.
		"tools and the rest": {"instructions": "You are a coding agent.", "reasoning": map[string]any{"effort": "low"}, "tool_choice": "auto",
			"text": map[string]any{"format": map[string]any{"type": "json_schema", "name": "answer", "schema": map[string]any{"type": "object"}}},
			"tools": []any{
				map[string]any{"type": "function", "name": "shell", "description": "Run a command", "parameters": map[string]any{"type": "object", "properties": map[string]any{"cmd": map[string]any{"type": "string"}}}, "strict": false},
				map[string]any{"type": "namespace", "name": "mcp__docs", "description": "Docs server", "tools": []any{map[string]any{"type": "function", "name": "search", "parameters": map[string]any{"type": "object"}}}},
				map[string]any{"type": "web_search"}, map[string]any{"type": "custom", "name": "apply_patch"}},
			"input": []any{map[string]any{"role": "user", "content": "List the files."},
				map[string]any{"type": "function_call", "call_id": "c1", "name": "shell", "arguments": `{"cmd":"ls"}`},
				map[string]any{"type": "function_call_output", "call_id": "c1", "output": "a.go b.go"}}},
		"tool_choice none": {"tool_choice": "none", "input": "Hi", "tools": []any{map[string]any{"type": "function", "name": "shell", "parameters": map[string]any{"type": "object"}}}},
	}
	for name, b := range bodies {
		t.Run(name, func(t *testing.T) {
			b["model"], b["max_output_tokens"] = servedModel, 2
			d := f.dryRun(b, nil)
			code, _, body := respCall(t, f, http.MethodPost, "/v1/responses", b)
			if code != http.StatusOK {
				t.Fatalf("%d %s", code, body)
			}
			var r struct {
				Usage struct {
					InputTokens int `json:"input_tokens"`
				} `json:"usage"`
			}
			_ = json.Unmarshal(body, &r)
			if d.PromptTokens == 0 || d.PromptTokens != r.Usage.InputTokens {
				t.Errorf("gateway %d prompt tokens, simulator %d", d.PromptTokens, r.Usage.InputTokens)
			}
		})
	}
}

// TestPassthroughAndUnmatched: vLLM's other endpoints reach a worker with its status; an
// unmatched route is an OpenAI-shaped 404 counted under endpoint "unmatched".
func TestPassthroughAndUnmatched(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 2, args: []string{"--router-policy", "round_robin"}})
	cases := []struct {
		method, path string
		body         any
		want         int
		contains     string
	}{
		{http.MethodPost, "/v1/embeddings", map[string]any{"model": servedModel, "input": []string{"a b", "c"}}, http.StatusOK, `"embedding"`},
		{http.MethodPost, "/tokenize", map[string]any{"model": servedModel, "prompt": "hello world"}, http.StatusOK, `"tokens"`},
		{http.MethodPost, "/detokenize", map[string]any{"model": servedModel, "tokens": []int{1, 2}}, http.StatusOK, `"prompt"`},
		{http.MethodGet, "/version", nil, http.StatusOK, `"version"`},
		{http.MethodPost, "/v1/embeddings", map[string]any{"input": 5}, http.StatusBadRequest, `"error"`},
		{http.MethodPost, "/v1/rerank", map[string]any{"query": "q", "documents": []string{"d"}}, http.StatusNotFound, ""}, // the simulator has no rerank: its own 404
		{http.MethodGet, "/v1/nope", nil, http.StatusNotFound, `{"error":{"message":"no route GET /v1/nope","type":"NotFoundError","param":null,"code":404}}`},
	}
	for _, tc := range cases {
		code, _, body := respCall(t, f, tc.method, tc.path, tc.body)
		if code != tc.want || !strings.Contains(string(body), tc.contains) {
			t.Errorf("%s %s: %d %s, want %d with %s", tc.method, tc.path, code, body, tc.want, tc.contains)
		}
	}
	if n := f.metric("kvgate_requests_total", map[string]string{"endpoint": "unmatched", "code": "404"}); n != 1 {
		t.Errorf("unmatched 404s counted %v, want 1", n)
	}
	if n := f.metric("kvgate_requests_total", map[string]string{"endpoint": "/v1/embeddings", "code": "200"}); n != 1 {
		t.Errorf("/v1/embeddings 200s counted %v, want 1", n)
	}
}
