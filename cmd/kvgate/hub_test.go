package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/server"
)

// testHub serves testdata/hub/<name>/ as the Hugging Face hub serves a repo
// (/{org}/{name}/resolve/{revision}/{file}, huggingface_hub's hf_hub_url), with X-Repo-Commit,
// 404 for a file the repo lacks and 401 without the bearer token. It records every path asked.
type testHub struct {
	*httptest.Server
	mu   sync.Mutex
	seen []string
}

const hubCommit = "0123456789abcdef0123456789abcdef01234567"

func startTestHub(t *testing.T, token string) *testHub {
	t.Helper()
	h := &testHub{}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.seen = append(h.seen, r.URL.Path)
		h.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "Access to model acme/tiny is restricted.", http.StatusUnauthorized)
			return
		}
		parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 5) // org, name, resolve, rev, file
		if len(parts) != 5 || parts[0] != "acme" || parts[2] != "resolve" || parts[3] != "main" || strings.Contains(parts[4], "/") {
			http.NotFound(w, r)
			return
		}
		data, err := os.ReadFile(filepath.Join("testdata", "hub", parts[1], parts[4]))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("X-Repo-Commit", hubCommit)
		_, _ = w.Write(data)
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *testHub) paths() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.seen)
}

// A models: entry whose tokenizer is a hub id (org/name) is fetched at start from HF_ENDPOINT
// with HF_TOKEN into HF_HOME's hub cache (models--org--name/snapshots/<commit>/), only the
// files the tokenizer reads; the pool tokenizes with it; a later start with the hub gone uses
// the cached snapshot.
func TestHubTokenizerAtStart(t *testing.T) {
	hub := startTestHub(t, "hf_s3cret")
	home := t.TempDir()
	t.Setenv("HF_ENDPOINT", hub.URL)
	t.Setenv("HF_TOKEN", "hf_s3cret")
	t.Setenv("HF_HOME", home)
	t.Setenv("HF_HUB_CACHE", "")
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"tiny","object":"model"}]}`))
		}
	}))
	t.Cleanup(worker.Close)
	file := "models:\n  - name: tiny\n    tokenizer: acme/tiny\n    router: {policy: kv}\n    workers: [{url: " + worker.URL + "}]\n"
	path := filepath.Join(t.TempDir(), "kvgate.yaml")
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := configs.Load([]string{"--config", path}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}

	start := func() *httptest.Server {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		ps, err := buildPools(ctx, cfg, nil, slog.New(slog.DiscardHandler), nil)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); ps.close() })
		want := filepath.Join(home, "hub", "models--acme--tiny", "snapshots", hubCommit)
		if got := ps.list[0].cfg.Tokenizer; got != want {
			t.Fatalf("tokenizer folder %s, want %s", got, want)
		}
		s, err := server.New(server.Options{Config: cfg, Pools: ps.serverPools()})
		if err != nil {
			t.Fatal(err)
		}
		admin := httptest.NewServer(s.AdminHandler())
		t.Cleanup(admin.Close)
		return admin
	}
	// The pool renders "user hi user<|end|>" with the fetched template and counts its tokens:
	// hi, user, hi (BPE merges of testdata/hub/tiny) and the special <|end|>.
	checkRoute := func(admin *httptest.Server) {
		t.Helper()
		resp, err := http.Post(admin.URL+"/debug/route", "application/json",
			bytes.NewBufferString(`{"model":"tiny","messages":[{"role":"user","content":"hi user hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var d struct {
			PromptTokens int `json:"prompt_tokens"`
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || json.Unmarshal(body, &d) != nil || d.PromptTokens != 5 {
			t.Fatalf("/debug/route: %d %s, want 5 prompt tokens (user hi user hi <|end|>)", resp.StatusCode, body)
		}
	}
	checkRoute(start())
	var files []string
	for _, p := range hub.paths() {
		files = append(files, strings.TrimPrefix(p, "/acme/tiny/resolve/main/"))
	}
	wantFiles := []string{"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
		"special_tokens_map.json", "config.json", "generation_config.json"}
	if !slices.Equal(files, wantFiles) {
		t.Errorf("hub asked for %v, want only the tokenizer's files %v", files, wantFiles)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"} {
		if _, err := os.Stat(filepath.Join(home, "hub", "models--acme--tiny", "snapshots", hubCommit, f)); err != nil {
			t.Errorf("not cached: %v", err)
		}
	}

	hub.Close() // the hub is gone: the cached snapshot serves
	checkRoute(start())
}

// A hub id that the hub refuses (no token) stops the start with the key and the reason.
func TestHubTokenizerRefused(t *testing.T) {
	hub := startTestHub(t, "hf_s3cret")
	t.Setenv("HF_ENDPOINT", hub.URL)
	t.Setenv("HF_TOKEN", "")
	t.Setenv("HUGGING_FACE_HUB_TOKEN", "")
	t.Setenv("HF_HOME", t.TempDir())
	t.Setenv("HF_HUB_CACHE", "")
	cfg := configs.Default()
	cfg.Models = []configs.Model{{Name: "tiny", Tokenizer: "acme/tiny", BlockSize: 16, Router: cfg.Router, Sessions: cfg.Sessions,
		Workers: []configs.Worker{{URL: "http://127.0.0.1:9", DPSize: 1}}}}
	cfg.Models[0].Router.Policy = "kv"
	_, err := buildPools(context.Background(), cfg, nil, slog.New(slog.DiscardHandler), nil)
	if err == nil || !strings.Contains(err.Error(), "models[0].tokenizer: acme/tiny is not a folder and could not be fetched") ||
		!strings.Contains(err.Error(), "HF_TOKEN") {
		t.Fatalf("err = %v", err)
	}
}
