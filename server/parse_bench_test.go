package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/apireq"
)

// agenticBody is a chat body shaped like an agent's turn: a long system prompt, tools, and many
// tool-calling turns (about 100 KB), with a session in nvext.
func agenticBody(turns int) []byte {
	msgs := []map[string]any{{"role": "system", "content": strings.Repeat("You are a careful coding agent. ", 200)}}
	for i := range turns {
		msgs = append(msgs,
			map[string]any{"role": "user", "content": fmt.Sprintf("step %d: %s", i, strings.Repeat("look at the file and fix it ", 20))},
			map[string]any{"role": "assistant", "content": nil, "tool_calls": []map[string]any{{"id": fmt.Sprintf("c%d", i), "type": "function",
				"function": map[string]any{"name": "read_file", "arguments": `{"path":"src/main.go"}`}}}},
			map[string]any{"role": "tool", "tool_call_id": fmt.Sprintf("c%d", i), "content": strings.Repeat("package main\n", 40)})
	}
	body, _ := json.Marshal(map[string]any{"model": testModel, "messages": msgs, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "max_tokens": 256, "cache_salt": "tenant-a",
		"tools": []map[string]any{{"type": "function", "function": map[string]any{"name": "read_file", "parameters": map[string]any{"type": "object"}}}},
		"nvext": map[string]any{"session_control": map[string]any{"session_id": "s-1"}}})
	return body
}

// BenchmarkParseRequest is the server's per-request parse: validation and session identity of
// a chat body (the enricher's template input comes from the same parse and is not measured here).
func BenchmarkParseRequest(b *testing.B) {
	p := apireq.NewParser(apireq.DefaultIdentity())
	for _, turns := range []int{1, 40} {
		body := agenticBody(turns)
		b.Run(fmt.Sprintf("%dKB", len(body)/1024), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				in, e := parseRequest(p, pathChat, body)
				if e != nil {
					b.Fatal(e)
				}
				if e := p.Identify(in, http.Header{}); e != nil || in.Session.SessionID != "s-1" {
					b.Fatal(e)
				}
			}
		})
	}
}
