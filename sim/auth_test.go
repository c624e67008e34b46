package sim

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// With API keys the simulator guards /v1/* like vllm serve --api-key: 401 {"error":
// "Unauthorized"} without the right bearer key; /health and /metrics stay open.
func TestAPIKey(t *testing.T) {
	w, err := New(Options{ServedModelName: "m", TTFT: time.Millisecond, ITL: time.Millisecond, APIKeys: []string{"k1", "k2"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(w.Handler())
	t.Cleanup(func() { srv.Close(); _ = w.Close() })
	chat := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	cases := []struct {
		name, method, path, auth, body string
		status                         int
	}{
		{"models without key", "GET", "/v1/models", "", "", 401},
		{"models wrong key", "GET", "/v1/models", "Bearer k3", "", 401},
		{"models no scheme", "GET", "/v1/models", "k1", "", 401},
		{"models first key", "GET", "/v1/models", "Bearer k1", "", 200},
		{"models second key", "GET", "/v1/models", "Bearer k2", "", 200},
		{"chat without key", "POST", "/v1/chat/completions", "", chat, 401},
		{"chat with key", "POST", "/v1/chat/completions", "Bearer k2", chat, 200},
		{"health open", "GET", "/health", "", "", 200},
		{"metrics open", "GET", "/metrics", "", "", 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("%d %s, want %d", resp.StatusCode, body, tc.status)
			}
			if tc.status == 401 && strings.TrimSpace(string(body)) != `{"error":"Unauthorized"}` {
				t.Errorf("401 body %s, want vLLM's {\"error\":\"Unauthorized\"}", body)
			}
		})
	}
}
