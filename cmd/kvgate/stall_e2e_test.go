package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// One of two workers accepts completions and then says nothing, before its headers, while its
// /health keeps passing. Each request that lands there is moved to the other worker once the
// deadline its own prediction allows has passed (proxy.first_byte_multiple × predicted TTFT +
// proxy.first_byte_floor), streamed or not, far sooner than proxy.stream_idle_timeout or
// response_header_timeout (minutes); after first_byte_eject_after misses the worker is ejected
// though its /health passes. Before, such requests hung for the idle timeout (issue 32: 12 of
// 40 for minutes) and the worker was never ejected.
func TestStalledWorkerReplacedWithinDerivedDeadline(t *testing.T) {
	tok := needModel(t)
	var stalled atomic.Int64
	f := startFleet(t, tok, fleetSpec{workers: 2, args: []string{"--router-policy", "kv",
		"--proxy-first-byte-multiple", "4", "--proxy-first-byte-floor", "400ms", "--proxy-first-byte-eject-after", "2",
		"--health-failure-threshold", "2"},
		wrap: func(i int, h http.Handler) http.Handler {
			return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
				if i == 0 && strings.HasPrefix(r.URL.Path, "/v1/chat/") {
					stalled.Add(1)
					_, _ = io.Copy(io.Discard, r.Body) // then net/http notices the gateway hanging up
					<-r.Context().Done()               // accepted, then silent until the gateway gives up
					return
				}
				h.ServeHTTP(rw, r)
			})
		}})
	stalledURL := f.urls[0]
	const bound = 3 * time.Second // the derived deadline (400 ms floor + 4 × a few ms) and a retry, with room for a slow CI
	for i := 0; stalled.Load() < 2 && i < 40; i++ {
		req := chatRequest(longText(100+i, 5), longText(200+i, 20)) // nothing shared: no cache pulls them together
		req.Stream = i%2 == 0
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		if req.Stream {
			st, err := f.client.CreateChatCompletionStream(ctx, req)
			if err != nil {
				cancel()
				t.Fatalf("request %d (stream): %v after %v", i, err, time.Since(start))
			}
			for err == nil {
				_, err = st.Recv()
			}
			st.Close()
			if !errors.Is(err, io.EOF) {
				cancel()
				t.Fatalf("request %d (stream) ended with %v", i, err)
			}
		} else if _, err := f.client.CreateChatCompletion(ctx, req); err != nil {
			cancel()
			t.Fatalf("request %d: %v after %v", i, err, time.Since(start))
		}
		cancel()
		t.Logf("request %d (stream %v): %v, stalled so far %d", i, req.Stream, time.Since(start).Round(time.Millisecond), stalled.Load())
		if took := time.Since(start); took > bound {
			t.Errorf("request %d (stream %v) took %v, want under %v", i, req.Stream, took, bound)
		}
	}
	if stalled.Load() < 2 {
		t.Fatalf("only %d requests reached the stalled worker; the test needs 2", stalled.Load())
	}
	if got := f.metric("kvgate_upstream_errors_total", map[string]string{"worker": stalledURL, "kind": "first_byte_deadline"}); got < 2 {
		t.Errorf("first-byte deadline misses counted: %v, want at least 2", got)
	}
	// Ejected (its passing probes readmit it soon after: health.interval is 200 ms here).
	if got := f.metric("kvgate_worker_ejections_total", map[string]string{"worker": stalledURL}); got < 1 {
		t.Errorf("after 2 misses the stalled worker was never ejected (ejections %v): %s", got, f.get("/health"))
	}
}
