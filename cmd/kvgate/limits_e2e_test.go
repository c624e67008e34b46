package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/sim"
)

// A prompt that leaves no room in the workers' max_model_len (learned from their /v1/models)
// gets vLLM's 400 from the gateway without reaching a worker; one token less is served.
func TestPromptOverMaxModelLenIs400(t *testing.T) {
	tok := needModel(t)
	const maxLen = 256
	f := startFleet(t, tok, fleetSpec{workers: 1, args: []string{"--router-policy", "kv_no_load"},
		simOpts: func(_ int, o *sim.Options) { o.MaxModelLen = maxLen }})
	ids := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = 1000 + i
		}
		return out
	}
	cases := []struct {
		name    string
		path    string
		body    any
		want    int
		message string
	}{
		{"token ids one short of max_model_len", "/v1/completions",
			map[string]any{"model": servedModel, "prompt": ids(maxLen - 1), "max_tokens": 1}, http.StatusOK, ""},
		{"token ids at max_model_len", "/v1/completions",
			map[string]any{"model": servedModel, "prompt": ids(maxLen), "max_tokens": 1}, http.StatusBadRequest,
			"This model's maximum context length is 256 tokens. However, your request has 256 input tokens. Please reduce the length of the input messages."},
		{"long chat prompt", "/v1/chat/completions", chatRequest("be brief", strings.Repeat(longText(1, 200), 50)), http.StatusBadRequest,
			"This model's maximum context length is 256 tokens. However, your request has at least 256 input tokens. Please reduce the length of the input messages."},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := f.sims[f.urls[0]].Stats().Requests
			code, _, body := f.post(c.path, c.body, nil)
			if code != c.want {
				t.Fatalf("status %d %s, want %d", code, body, c.want)
			}
			reached := f.sims[f.urls[0]].Stats().Requests - before
			if c.want == http.StatusOK {
				if reached != 1 {
					t.Errorf("worker served %d requests, want 1", reached)
				}
				return
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Message != c.message || e.Error.Type != "BadRequestError" || e.Error.Code != 400 {
				t.Fatalf("body %s, want message %q", body, c.message)
			}
			if reached != 0 {
				t.Errorf("a refused prompt reached the worker (%d requests)", reached)
			}
		})
	}
}
