package tokenize

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// fakeHub mimics the hub's resolve URLs: /{org}/{name}/resolve/{revision}/{file}, an
// X-Repo-Commit header, 404 for absent files and 401 without the right token.
func fakeHub(t *testing.T, files map[string]string, token string) (*httptest.Server, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	const commit = "0123456789abcdef0123456789abcdef01234567"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.Path)
		mu.Unlock()
		if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "Access to model is restricted", http.StatusUnauthorized)
			return
		}
		prefix := "/acme/tiny/resolve/main/"
		if !strings.HasPrefix(r.URL.Path, prefix) {
			http.NotFound(w, r)
			return
		}
		body, ok := files[strings.TrimPrefix(r.URL.Path, prefix)]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("X-Repo-Commit", commit)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

func TestDownloadTokenizer(t *testing.T) {
	files := map[string]string{"tokenizer.json": `{"model":{}}`, "tokenizer_config.json": `{"chat_template":"x"}`}
	tests := []struct {
		name      string
		serverTok string
		clientTok string
		envTok    string
		wantErr   error
	}{
		{name: "public repo"},
		{name: "gated with token option", serverTok: "s3cret", clientTok: "s3cret"},
		{name: "gated with HF_TOKEN", serverTok: "s3cret", envTok: "s3cret"},
		{name: "gated without token", serverTok: "s3cret", wantErr: ErrHubAuth},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, seen := fakeHub(t, files, tc.serverTok)
			t.Setenv("HF_TOKEN", tc.envTok)
			t.Setenv("HF_ENDPOINT", srv.URL)
			cache := t.TempDir()
			dir, err := DownloadTokenizer(context.Background(), "acme/tiny", HubOptions{Token: tc.clientTok, CacheDir: cache})
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := filepath.Join(cache, "models--acme--tiny", "snapshots", "0123456789abcdef0123456789abcdef01234567")
			if dir != want {
				t.Errorf("dir %s, want %s", dir, want)
			}
			for name, body := range files {
				b, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil || string(b) != body {
					t.Errorf("%s: %q, %v", name, b, err)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "chat_template.jinja")); !os.IsNotExist(err) {
				t.Errorf("absent optional file must not be created: %v", err)
			}
			if got := seen(); len(got) != len(hubFiles()) {
				t.Errorf("requests %v, want one per hub file", got)
			}
		})
	}
}

func TestDownloadTokenizerFallsBackToCache(t *testing.T) {
	srv, _ := fakeHub(t, map[string]string{"tokenizer.json": `{}`}, "")
	cache := t.TempDir()
	first, err := DownloadTokenizer(context.Background(), "acme/tiny", HubOptions{Endpoint: srv.URL, CacheDir: cache})
	if err != nil {
		t.Fatal(err)
	}
	srv.Close() // the hub is gone: the cached snapshot must still be found
	second, err := DownloadTokenizer(context.Background(), "acme/tiny", HubOptions{Endpoint: srv.URL, CacheDir: cache})
	if err != nil || second != first {
		t.Fatalf("offline: %s, %v; want %s", second, err, first)
	}
}

func TestDownloadTokenizerRejects(t *testing.T) {
	srv, _ := fakeHub(t, map[string]string{}, "")
	for _, repo := range []string{"../etc", "noslash", "a/b/c", ""} {
		if _, err := DownloadTokenizer(context.Background(), repo, HubOptions{Endpoint: srv.URL, CacheDir: t.TempDir()}); err == nil {
			t.Errorf("%q: want an error", repo)
		}
	}
	// tokenizer.json is required: a repo without it fails.
	if _, err := DownloadTokenizer(context.Background(), "acme/tiny", HubOptions{Endpoint: srv.URL, CacheDir: t.TempDir()}); err == nil {
		t.Error("missing tokenizer.json: want an error")
	}
}
