package server

import (
	"context"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/configs"
)

// A worker that stalls before sending headers is abandoned after proxy.stream_idle_timeout
// (not proxy.response_header_timeout) and the stream is retried on another worker; with no
// other worker the client gets 502 at the same point.
func TestStallBeforeHeadersIsRetried(t *testing.T) {
	cases := []struct {
		name     string
		healthy  bool // whether a second, healthy worker exists
		wantCode int
	}{
		{"retried on another worker", true, http.StatusOK},
		{"502 when no other worker", false, http.StatusBadGateway},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stall := fastSim()
			stall.Faults.StallHeadersRate, stall.Faults.StallHeadersFor = 1, time.Minute
			a := startSim(t, stall)
			urls := []string{a.srv.URL}
			if tc.healthy {
				urls = append(urls, startSim(t, fastSim()).srv.URL)
			}
			g := startGateway(t, func(c *configs.Config) {
				c.Proxy.StreamIdleTimeout = configs.Duration(300 * time.Millisecond)
				c.Proxy.ResponseHeaderTimeout = configs.Duration(10 * time.Minute)
				c.Health.FailureThreshold = 100
			}, urls...)
			// Round robin starts at the stalling worker.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.url+pathChat,
				strings.NewReader(`{"model":"`+testModel+`","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("no answer within 5s (the stall held the client): %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.wantCode {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tc.wantCode)
			}
			if tc.wantCode == http.StatusOK && !strings.Contains(string(body), "[DONE]") {
				t.Fatalf("stream incomplete: %s", body)
			}
			if n := len(a.rec.all()); n != 1 {
				t.Errorf("stalling worker got %d requests, want 1", n)
			}
		})
	}
}

// A bare 500 before the first byte (vLLM's answer when its engine dies or restarts) is retried
// on another worker; a 500 with an error body is the worker's answer (TestStatusPassThrough).
func TestEngineDeath500IsRetried(t *testing.T) {
	var hits atomic.Int32
	dead := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	})
	ok := startSim(t, fastSim())
	for _, stream := range []bool{false, true} {
		hits.Store(0)
		g := startGateway(t, func(c *configs.Config) { c.Health.FailureThreshold = 100 }, dead.URL, ok.srv.URL)
		body := `{"model":"` + testModel + `","max_tokens":2,"messages":[{"role":"user","content":"hi"}]`
		if stream {
			body += `,"stream":true`
		}
		resp, data := g.post(t, pathChat, body+"}", nil)
		if resp.StatusCode != http.StatusOK || hits.Load() != 1 {
			t.Fatalf("stream=%v: status %d (%s), dead worker hit %d times; want 200 after one retry", stream, resp.StatusCode, data, hits.Load())
		}
	}
}

// A lone worker whose engine restarts in place (a bare 500, then healthy again) is tried once
// more after a pause, rather than its 500 reaching the client; a worker that keeps failing
// gets no more tries than the attempt budget allows.
func TestRestartingLoneWorkerIsRetried(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int32
		want     int
		hits     int32
	}{
		{"restarts once", 1, http.StatusOK, 2},
		{"keeps failing", 100, http.StatusInternalServerError, 3}, // the last bare 500 is passed through
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hits atomic.Int32
			ok := startSim(t, fastSim())
			target, err := url.Parse(ok.srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			toSim := httputil.NewSingleHostReverseProxy(target)
			flaky := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == pathChat && hits.Add(1) <= tc.failures {
					w.WriteHeader(http.StatusInternalServerError)
					return
				}
				toSim.ServeHTTP(w, r)
			})
			g := startGateway(t, func(c *configs.Config) { c.Health.FailureThreshold = 100 }, flaky.URL)
			body := `{"model":"` + testModel + `","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
			resp, data := g.post(t, pathChat, body, nil)
			if resp.StatusCode != tc.want || hits.Load() != tc.hits {
				t.Fatalf("status %d (%s), worker hit %d times; want %d after %d tries", resp.StatusCode, data, hits.Load(), tc.want, tc.hits)
			}
		})
	}
}
