package server

import (
	"context"
	"io"
	"net/http"
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
