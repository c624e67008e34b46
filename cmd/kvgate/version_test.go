package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestVersionCommand(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"version"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"version: ", "commit: ", "go: go", "built: "} {
		if !strings.Contains(out.String(), key) {
			t.Errorf("kvgate version printed %q, lacks %q", out.String(), key)
		}
	}
	if err := run(context.Background(), []string{"version", "extra"}, &out, &out); err == nil {
		t.Error("kvgate version extra: no error")
	}
}

func TestHealthcheckAddr(t *testing.T) {
	for _, tt := range []struct{ listen, want string }{
		{"", "127.0.0.1:8000"},
		{"0.0.0.0:9000", "127.0.0.1:9000"},
		{"[::]:9000", "127.0.0.1:9000"},
		{":9000", "127.0.0.1:9000"},
		{"10.1.2.3:8000", "10.1.2.3:8000"},
		{"gw.local:8000", "gw.local:8000"},
	} {
		if got := healthcheckAddr(tt.listen); got != tt.want {
			t.Errorf("healthcheckAddr(%q) = %q, want %q", tt.listen, got, tt.want)
		}
	}
}

func TestHealthcheck(t *testing.T) {
	tests := []struct {
		name    string
		ready   int
		args    []string
		wantErr string
	}{
		{"live and ready", http.StatusOK, nil, ""},
		{"not ready", http.StatusServiceUnavailable, nil, `503 Service Unavailable: {"ready":false}`},
		{"not ready, live only", http.StatusServiceUnavailable, []string{"--live-only"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/live":
					w.Write([]byte(`{"status":"live"}`))
				case "/ready":
					w.WriteHeader(tt.ready)
					w.Write([]byte(`{"ready":false}`))
				default:
					http.NotFound(w, r)
				}
			}))
			defer srv.Close()
			var out bytes.Buffer
			args := append([]string{"healthcheck", "--addr", strings.TrimPrefix(srv.URL, "http://")}, tt.args...)
			err := run(context.Background(), args, &out, &out)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("healthcheck: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("healthcheck error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
	// Nothing listening: an error, not a hang.
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := strings.TrimPrefix(srv.URL, "http://")
	srv.Close()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"healthcheck", "--addr", addr, "--timeout", "1s"}, &out, &out); err == nil {
		t.Error("healthcheck against a closed port: no error")
	}
}
