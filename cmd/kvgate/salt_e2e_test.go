package main

import (
	"net/http"
	"strings"
	"testing"
)

// One cache_salt rule for every policy, vLLM's (vllm/entrypoints/openai/protocol.py,
// check_cache_salt_support: a non-empty string): the same salt gets the same answer from the
// gateway under round_robin (no tokenizer on the request path) and under a KV policy (which
// tokenizes and hashes the salt in full), both for the proxied request and the dry run.
func TestCacheSaltSameRuleEveryPolicy(t *testing.T) {
	tok := needModel(t)
	fleets := map[string]*fleet{
		"round_robin": startFleet(t, tok, fleetSpec{workers: 1, args: []string{"--router-policy", "round_robin"}}),
		"kv_no_load":  startFleet(t, tok, fleetSpec{workers: 1, args: []string{"--router-policy", "kv_no_load"}}),
	}
	cases := []struct {
		name string
		salt any
		want int
	}{
		{"plain", "tenant-a", http.StatusOK},
		{"slash", "tenant/a", http.StatusOK},
		{"at sign", "user@example.com", http.StatusOK},
		{"backslash", `dom\user`, http.StatusOK},
		{"NUL", "a\x00b", http.StatusOK},
		{"longer than 128 characters", strings.Repeat("s", 300), http.StatusOK},
		{"empty", "", http.StatusBadRequest},
		{"number", 5, http.StatusBadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := map[string]any{"model": servedModel, "max_tokens": 1, "cache_salt": tc.salt,
				"messages": []map[string]string{{"role": "user", "content": "hello"}}}
			for name, f := range fleets {
				for _, path := range []string{"/v1/chat/completions", "/debug/route"} {
					if code, _, data := f.post(path, body, nil); code != tc.want {
						t.Errorf("%s %s: status %d %s, want %d", name, path, code, data, tc.want)
					}
				}
			}
		})
	}
}
