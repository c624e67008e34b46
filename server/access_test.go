package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/workers"
)

// syncBuffer is a bytes.Buffer safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startLoggedGateway is startGateway with the server logging JSON into buf.
func startLoggedGateway(t *testing.T, buf *syncBuffer, mutate func(*configs.Config), urls ...string) string {
	t.Helper()
	cfg := testGatewayConfig(urls...)
	if mutate != nil {
		mutate(&cfg)
	}
	reg, err := workers.NewRegistry(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := router.New(cfg.Router.Policy, router.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewJSONHandler(buf, nil))
	s, err := New(Options{Config: cfg, Registry: reg, Router: routerFor(t, pol), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	reg.ProbeAll(context.Background())
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		reg.Close()
	})
	return srv.URL
}

// accessLines returns the "access" records of a JSON log.
func accessLines(t *testing.T, log string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		var rec map[string]any
		if line == "" || json.Unmarshal([]byte(line), &rec) != nil || rec["msg"] != "access" {
			continue
		}
		out = append(out, rec)
	}
	return out
}

// access_log (on by default) writes one info line per client request: method, path, status,
// latency, TTFT, worker, cached blocks, hashed session, model; never the prompt or the key.
func TestAccessLog(t *testing.T) {
	if !configs.Default().AccessLog {
		t.Fatal("access_log must default to true")
	}
	a := startSim(t, fastSim())
	var buf syncBuffer
	url := startLoggedGateway(t, &buf, func(c *configs.Config) { c.Auth.APIKeys = []string{"key-1"} }, a.srv.URL)
	const prompt = "the secret plan is in the attic"
	chat := `{"model":"` + testModel + `","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	msgs := `{"model":"` + testModel + `","max_tokens":2,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	key := map[string]string{"x-api-key": "key-1", "session-id": "codex-conv-42"}
	if code, body := sendWith(t, "POST", url+pathChat, chat, key); code != 200 {
		t.Fatalf("chat: %d %s", code, body)
	}
	if code, body := sendWith(t, "POST", url+pathMessages, msgs, key); code != 200 {
		t.Fatalf("messages: %d %s", code, body)
	}
	if code, _ := sendWith(t, "POST", url+pathChat, chat, nil); code != 401 {
		t.Fatalf("no key: %d", code)
	}
	if code, _ := sendWith(t, "HEAD", url+"/v1/models", "", key); code != 200 {
		t.Fatalf("HEAD: %d", code)
	}
	if code, _ := sendWith(t, "GET", url+"/health", "", nil); code != 200 {
		t.Fatalf("health: %d", code)
	}
	log := buf.String()
	recs := accessLines(t, log)
	if len(recs) != 4 {
		t.Fatalf("%d access lines, want 4 (chat, messages, 401, HEAD; no /health):\n%s", len(recs), log)
	}
	for i, want := range []struct {
		method, path string
		status       float64
		routed       bool
	}{{"POST", pathChat, 200, true}, {"POST", pathMessages, 200, true}, {"POST", pathChat, 401, false}, {"HEAD", "/v1/models", 200, false}} {
		r := recs[i]
		if r["level"] != "INFO" || r["method"] != want.method || r["path"] != want.path || r["status"] != want.status {
			t.Errorf("line %d: %v, want %+v", i, r, want)
		}
		if _, ok := r["latency_ms"].(float64); !ok {
			t.Errorf("line %d: no latency_ms: %v", i, r)
		}
		if !want.routed {
			continue
		}
		ttft, _ := r["ttft_ms"].(float64)
		lat, _ := r["latency_ms"].(float64)
		sess, _ := r["session"].(string)
		if r["worker"] != a.srv.URL || r["model"] != testModel || ttft <= 0 || ttft > lat ||
			!strings.HasPrefix(sess, "sh-") || len(sess) != 35 {
			t.Errorf("line %d: %v", i, r)
		}
		if _, ok := r["cached_blocks"].(float64); !ok {
			t.Errorf("line %d: no cached_blocks: %v", i, r)
		}
	}
	for _, secret := range []string{prompt, "codex-conv-42", "key-1"} {
		if strings.Contains(log, secret) {
			t.Errorf("the log holds %q:\n%s", secret, log)
		}
	}

	// access_log: false writes none.
	var quiet syncBuffer
	url = startLoggedGateway(t, &quiet, func(c *configs.Config) { c.AccessLog = false }, a.srv.URL)
	if code, _ := sendWith(t, "POST", url+pathChat, chat, nil); code != 200 {
		t.Fatal(code)
	}
	if n := len(accessLines(t, quiet.String())); n != 0 {
		t.Errorf("access_log false: %d lines", n)
	}
}
