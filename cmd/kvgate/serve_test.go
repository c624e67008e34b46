package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testport"
)

func TestRunDispatch(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		wantErr string
		wantOut string
	}{
		{"no command", nil, "no command given", ""},
		{"unknown", []string{"frobnicate"}, `unknown command "frobnicate"`, ""},
		{"help", []string{"help"}, "", "kvgate serve"},
		{"serve help", []string{"serve", "-h"}, "", ""},
		{"serve invalid", []string{"serve", "--model", "m", "--worker", "ftp://x"}, "workers[0].url", ""},
		{"serve bad policy", []string{"serve", "--model", "m", "--worker", "http://127.0.0.1:1", "--router-policy", "best"}, `router.policy: unknown policy "best"`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			err := run(context.Background(), tc.args, &out, io.Discard)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("err = %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("stdout %q lacks %q", out.String(), tc.wantOut)
			}
		})
	}
}

// kvgate serve in its quick form: it probes the worker, serves, and stops cleanly when its
// context ends (as on SIGTERM).
func TestServeLifecycle(t *testing.T) {
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"m","object":"model"}]}`))
		}
	}))
	defer worker.Close()
	addr := testport.Addr(t)

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--model", "m", "--worker", worker.URL, "--listen", addr, "--log-level", "error", "--shutdown-drain-delay", "0s"}, io.Discard, io.Discard)
	}()
	var health *http.Response
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if health, err = http.Get("http://" + addr + "/health"); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("gateway never answered: %v", err)
	}
	health.Body.Close()
	if health.StatusCode != 200 {
		t.Errorf("health %d", health.StatusCode)
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop")
	}
}

// log_format picks the handler: json lines or text (logfmt) lines.
func TestNewLoggerFormat(t *testing.T) {
	for _, tc := range []struct{ format, want string }{{"json", `{"time":`}, {"text", "time="}} {
		var b strings.Builder
		newLogger("info", tc.format, &b).Info("access", "status", 200)
		if !strings.HasPrefix(b.String(), tc.want) || !strings.Contains(b.String(), "200") {
			t.Errorf("%s: %q", tc.format, b.String())
		}
	}
}
