package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"
	"time"
)

// apiServer streams a scripted Messages or Responses answer: ttft before the first text delta,
// chunks text deltas, then the final usage, as vLLM's entrypoints order their events
// (vllm/entrypoints/anthropic/serving.py, message_stream_converter;
// vllm/entrypoints/openai/responses/serving.py, responses_stream_generator).
type apiServer struct {
	ttft   time.Duration
	chunks int
	mu     sync.Mutex
	paths  []string
	bodies []map[string]any
}

func (s *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	s.mu.Lock()
	s.paths = append(s.paths, r.URL.Path)
	s.bodies = append(s.bodies, body)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	send := func(event, data string) {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data)
		fl.Flush()
	}
	switch r.URL.Path {
	case "/v1/messages":
		send("message_start", `{"type":"message_start","message":{"id":"m","usage":{"input_tokens":0,"output_tokens":0}}}`)
		send("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
		time.Sleep(s.ttft)
		for i := range s.chunks {
			send("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"t%d "}}`, i))
		}
		send("content_block_stop", `{"type":"content_block_stop","index":0}`)
		send("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":60,"output_tokens":%d,"cache_read_input_tokens":32,"cache_creation_input_tokens":8}}`, s.chunks))
		send("message_stop", `{"type":"message_stop"}`)
	case "/v1/responses":
		send("response.created", `{"type":"response.created","response":{"id":"resp_1","status":"in_progress","usage":null}}`)
		send("response.output_item.added", `{"type":"response.output_item.added","output_index":0,"item":{"type":"message"}}`)
		time.Sleep(s.ttft)
		for i := range s.chunks {
			send("response.output_text.delta", fmt.Sprintf(`{"type":"response.output_text.delta","delta":"t%d "}`, i))
		}
		send("response.output_text.done", `{"type":"response.output_text.done","text":"..."}`)
		send("response.completed", fmt.Sprintf(`{"type":"response.completed","response":{"id":"resp_1","status":"completed","usage":{"input_tokens":100,"input_tokens_details":{"cached_tokens":40},"output_tokens":%d,"total_tokens":105}}}`, s.chunks))
	default:
		http.NotFound(w, r)
	}
}

// TestReplayAPIs replays a two-turn literal conversation as Anthropic Messages and as stateless
// Responses: the bodies carry the conversation in each API's shape (leading system as system
// blocks / instructions, every turn the full history), and usage and TTFT come from each
// API's own stream events.
func TestReplayAPIs(t *testing.T) {
	history := []Message{{Role: "system", Content: "sys"}, {Role: "user", Content: "u1"}, {Role: "assistant", Content: "a1"}, {Role: "user", Content: "u2"}}
	sess := func() *Session {
		return &Session{ID: "s", Mode: ContextStandalone, Turns: []Turn{
			{Messages: history[:2], OutputTokens: 5},
			{Messages: history, Delay: time.Millisecond}, // no recorded output length
		}}
	}
	cases := []struct {
		api                      API
		path                     string
		prompt, cached           int
		wantFirst, wantSecondKey map[string]any
	}{
		{APIMessages, "/v1/messages", 100, 32,
			map[string]any{"model": "m", "stream": true, "max_tokens": 5.0, "ignore_eos": true,
				"system":   []any{map[string]any{"type": "text", "text": "sys"}},
				"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "u1"}}}}},
			map[string]any{"max_tokens": float64(defaultMaxTokens)}},
		{APIResponses, "/v1/responses", 100, 40,
			map[string]any{"model": "m", "stream": true, "store": false, "max_output_tokens": 5.0, "ignore_eos": true,
				"instructions": "sys",
				"input":        []any{map[string]any{"type": "message", "role": "user", "content": "u1"}}},
			map[string]any{"max_output_tokens": nil}},
	}
	for _, tc := range cases {
		t.Run(string(tc.api), func(t *testing.T) {
			srv := &apiServer{ttft: 40 * time.Millisecond, chunks: 5}
			ts := httptest.NewServer(srv)
			defer ts.Close()
			tr := &Trace{Format: FormatSingleTurn, BlockSize: 64, Sessions: []*Session{sess()}}
			res, err := Replay(context.Background(), tr, nil, ReplayOptions{URL: ts.URL, Model: "m", API: tc.api, IgnoreEOS: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Records) != 2 {
				t.Fatalf("%d records", len(res.Records))
			}
			for i, r := range res.Records {
				if !r.OK() || !r.HasUsage || r.PromptTokens != tc.prompt || r.CachedTokens != tc.cached || r.OutputTokens != 5 || r.Chunks != 5 {
					t.Errorf("record %d: %+v", i, r)
				}
				if ms := r.TTFT.Milliseconds(); ms < 40 || ms > 400 {
					t.Errorf("record %d: TTFT %v, want about 40ms (at the first text delta)", i, r.TTFT)
				}
			}
			for i, p := range srv.paths {
				if p != tc.path {
					t.Errorf("request %d went to %s", i, p)
				}
			}
			if !reflect.DeepEqual(srv.bodies[0], tc.wantFirst) {
				t.Errorf("first body\n got %v\nwant %v", srv.bodies[0], tc.wantFirst)
			}
			second := srv.bodies[1]
			for k, v := range tc.wantSecondKey {
				if got, ok := second[k]; v == nil && ok || v != nil && got != v {
					t.Errorf("second body %s = %v, want %v", k, got, v)
				}
			}
			// The whole conversation, in order, on the second turn.
			items, _ := second["messages"].([]any)
			if tc.api == APIResponses {
				items, _ = second["input"].([]any)
			}
			if len(items) != 3 {
				t.Fatalf("second body has %d turns, want 3: %v", len(items), second)
			}
			if role := items[1].(map[string]any)["role"]; role != "assistant" {
				t.Errorf("second turn's history: %v", items)
			}
		})
	}
	if _, err := ParseAPI("completions"); err == nil {
		t.Error("an unknown api was accepted")
	}
}
