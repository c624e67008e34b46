package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBodyLog(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		got = append(got, string(raw))
	}))
	t.Cleanup(srv.Close)
	tests := []struct {
		name, method, body string
		want               string // the line written; "" = none
	}{
		{"json post", http.MethodPost, "{\n \"model\": \"m\",\n \"messages\": []\n}", `{"model":"m","messages":[]}`},
		{"get", http.MethodGet, "", ""},
		{"not json", http.MethodPost, "hello", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got = nil
			var out bytes.Buffer
			bl := newBodyLog(http.DefaultTransport, &out)
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			req, err := http.NewRequest(tc.method, srv.URL, body)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := (&http.Client{Transport: bl}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if err := bl.Flush(); err != nil {
				t.Fatal(err)
			}
			if want := strings.TrimSuffix(out.String(), "\n"); want != tc.want {
				t.Errorf("logged %q, want %q", want, tc.want)
			}
			if tc.body != "" && (len(got) != 1 || got[0] != tc.body) {
				t.Errorf("server received %q, want the body unchanged", got)
			}
		})
	}
}

func TestRunBodiesOut(t *testing.T) {
	srv, n := fakeGateway(t)
	dir := t.TempDir()
	bodies := filepath.Join(dir, "bodies.jsonl")
	args := []string{"run", "--url", srv.URL, "--model", "m", "--trace", filepath.Join("..", "..", "testdata", "traces", "trace_0026.json"),
		"--time-scale", "0.0001", "--out", filepath.Join(dir, "run"), "--quiet", "--bodies-out", bodies}
	if err := run(context.Background(), args, io.Discard, io.Discard, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(bodies)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var b struct {
			Model    string            `json:"model"`
			Messages []json.RawMessage `json:"messages"`
			Stream   bool              `json:"stream"`
		}
		if err := json.Unmarshal(sc.Bytes(), &b); err != nil {
			t.Fatalf("line %d: %v", lines+1, err)
		}
		if b.Model != "m" || len(b.Messages) == 0 || !b.Stream {
			t.Errorf("line %d: %+v", lines+1, b)
		}
		lines++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if int64(lines) != n.Load() || lines != 3 {
		t.Errorf("%d bodies logged, the server saw %d requests (want 3)", lines, n.Load())
	}
}
