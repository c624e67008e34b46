package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// Every bounded cache reports its byte budget and its estimated use; after traffic the caches a
// chat request fills are non-empty, and none is over its budget.
func TestMemoryBudgetMetrics(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 2, events: true, args: []string{"--router-policy", "kv"}})
	for i := range 4 {
		body := map[string]any{"model": servedModel, "max_tokens": 4, "messages": []map[string]string{
			{"role": "system", "content": strings.Repeat("You answer questions about memory budgets. ", 20)},
			{"role": "user", "content": fmt.Sprintf("question %d: %s", i, strings.Repeat("how much is held? ", 30))}}}
		if code, _, b := f.post("/v1/chat/completions", body, map[string]string{"X-Session-ID": fmt.Sprintf("s%d", i)}); code != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, code, b)
		}
	}
	f.awaitEvents()
	tests := []struct {
		cache    string
		nonEmpty bool
	}{
		{"segment_cache", true}, {"chat_message_cache", true}, {"kv_index", true},
		{"session_forest", true}, {"sessions", true}, {"working_sets", true},
		{"approximate_index", false}, {"recent_prompts", false}, {"responses_pins", false},
	}
	for _, tc := range tests {
		t.Run(tc.cache, func(t *testing.T) {
			budget := f.metric("kvgate_memory_budget_bytes", map[string]string{"cache": tc.cache})
			used := f.metric("kvgate_memory_used_bytes", map[string]string{"cache": tc.cache})
			if budget <= 0 {
				t.Errorf("budget %v, want > 0", budget)
			}
			if used > budget {
				t.Errorf("used %v over budget %v", used, budget)
			}
			if tc.nonEmpty && used <= 0 {
				t.Errorf("used %v after traffic, want > 0", used)
			}
		})
	}
}
