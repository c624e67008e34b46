package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// The session identity agents send unmodified reaches the session tracker through the gateway:
// Codex's session-id and thread-id headers with prompt_cache_key on Responses, pi's session_id
// header, prompt_cache_key on chat, and Claude Code's metadata.user_id. Each conversation is a
// session (GET /debug/sessions/{id} answers for the id the agent sent), kept only under its
// hash, with affinity to the worker that served it; its second turn goes there.
func TestAgentSessionsThroughGateway(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 2, events: true})
	chat := func(system, user string) map[string]any {
		return map[string]any{"model": servedModel, "max_tokens": 2, "messages": []any{
			map[string]any{"role": "system", "content": system}, map[string]any{"role": "user", "content": user}}}
	}
	userID := `{"device_id":"d3v1ce","account_uuid":"","session_id":"54c1eb09-bc4c-4d2f-98eb-6d2ab2d5e2fe"}`
	cases := []struct {
		name, path, raw string
		header          map[string]string
		body            func(turn int) map[string]any
	}{
		{"codex", "/v1/responses", "codex-thread-1", map[string]string{"session-id": "codex-thread-1", "thread-id": "codex-thread-1"},
			func(turn int) map[string]any {
				return map[string]any{"model": servedModel, "max_output_tokens": 2, "store": false, "prompt_cache_key": "codex-thread-1",
					"instructions": "You are Codex. " + longText(11, 40), "input": strings.Repeat("turn ", turn+1)}
			}},
		{"pi", "/v1/chat/completions", "pi-session-1", map[string]string{"session_id": "pi-session-1"},
			func(turn int) map[string]any {
				return chat("You are pi. "+longText(12, 40), strings.Repeat("turn ", turn+1))
			}},
		{"prompt_cache_key", "/v1/chat/completions", "pck-1", nil,
			func(turn int) map[string]any {
				r := chat("You cache by key. "+longText(13, 40), strings.Repeat("turn ", turn+1))
				r["prompt_cache_key"] = "pck-1"
				return r
			}},
		{"claude code user_id", "/v1/messages", "54c1eb09-bc4c-4d2f-98eb-6d2ab2d5e2fe", nil,
			func(turn int) map[string]any {
				return map[string]any{"model": servedModel, "max_tokens": 2, "metadata": map[string]any{"user_id": userID},
					"system": "You are Claude Code. " + longText(14, 40), "messages": []any{map[string]any{"role": "user", "content": strings.Repeat("turn ", turn+1)}}}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var workers []string
			for turn := range 2 {
				code, hdr, body := f.post(tc.path, tc.body(turn), tc.header)
				if code != http.StatusOK {
					t.Fatalf("turn %d: %d %s", turn, code, body)
				}
				workers = append(workers, hdr.Get("X-Kvgate-Worker"))
			}
			got := f.get("/debug/sessions/" + tc.raw)
			var view struct {
				ID       string `json:"id"`
				Routed   int    `json:"routed_requests"`
				Affinity *struct {
					Worker string `json:"worker"`
				} `json:"affinity"`
			}
			if err := json.Unmarshal([]byte(got), &view); err != nil || !strings.HasPrefix(view.ID, "sh-") || view.Routed != 2 ||
				view.Affinity == nil || view.Affinity.Worker != workers[0] {
				t.Fatalf("session view %s; workers %v", got, workers)
			}
			if strings.Contains(got, tc.raw) || strings.Contains(got, "d3v1ce") {
				t.Errorf("the session view shows what the agent sent: %s", got)
			}
			if workers[1] != workers[0] {
				t.Errorf("turn 2 went to %s, turn 1 to %s", workers[1], workers[0])
			}
		})
	}
}
