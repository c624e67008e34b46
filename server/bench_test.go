package server

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/sim"
)

// benchClient has a pool big enough that every request reuses a connection.
func benchClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}}
}

func postOnce(b *testing.B, cl *http.Client, url, body string) int {
	resp, err := cl.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		data, _ := io.ReadAll(resp.Body)
		b.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	events := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if bytes.HasPrefix(sc.Bytes(), []byte("data: ")) {
			events++
		}
	}
	return events
}

// BenchmarkProxyOverhead sends the same one-token request to a simulated worker directly and
// through the gateway, alternating, and reports both latencies, the added latency per request
// and their ratio. The worker's own timing is near zero so the gateway's cost dominates.
func BenchmarkProxyOverhead(b *testing.B) {
	cases := []struct {
		name string
		body string
	}{
		{"non-stream", `{"model":"test-model","max_tokens":1,"messages":[{"role":"user","content":"hello there"}]}`},
		{"stream", `{"model":"test-model","max_tokens":1,"stream":true,"messages":[{"role":"user","content":"hello there"}]}`},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			w := startSim(b, sim.Options{ServedModelName: testModel, TTFT: time.Microsecond, ITL: time.Microsecond})
			g := startGateway(b, nil, w.srv.URL)
			cl := benchClient()
			direct, gw := w.srv.URL+pathChat, g.url+pathChat
			postOnce(b, cl, direct, tc.body)
			postOnce(b, cl, gw, tc.body)
			var dDirect, dGateway time.Duration
			b.ResetTimer()
			for b.Loop() {
				t0 := time.Now()
				postOnce(b, cl, direct, tc.body)
				t1 := time.Now()
				postOnce(b, cl, gw, tc.body)
				dDirect += t1.Sub(t0)
				dGateway += time.Since(t1)
			}
			n := float64(b.N)
			b.ReportMetric(float64(dDirect.Microseconds())/n, "direct-µs/req")
			b.ReportMetric(float64(dGateway.Microseconds())/n, "gateway-µs/req")
			b.ReportMetric(float64((dGateway-dDirect).Microseconds())/n, "added-µs/req")
			b.ReportMetric(float64(dGateway)/float64(dDirect), "gateway/direct")
		})
	}
}

// blaster is a worker that writes n vLLM-shaped chunks as fast as it can, one flush each:
// the gateway's relay is then the only limit on events per second.
func blaster(n int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for range n {
			_, _ = io.WriteString(w, chunk)
			f.Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}
}

// BenchmarkSSERelay streams 2000 events per request from a blasting worker, directly and
// through the gateway, and reports relayed events per second for both and their ratio.
func BenchmarkSSERelay(b *testing.B) {
	const perStream = 2000
	up := httptest.NewServer(blaster(perStream))
	defer up.Close()
	g := startGateway(b, nil, up.URL)
	cl := benchClient()
	body := `{"model":"test-model","stream":true,"messages":[{"role":"user","content":"x"}]}`
	var dDirect, dGateway time.Duration
	events := 0
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		if got := postOnce(b, cl, up.URL+pathChat, body); got != perStream+1 {
			b.Fatalf("direct: %d events", got)
		}
		t1 := time.Now()
		if got := postOnce(b, cl, g.url+pathChat, body); got != perStream+1 {
			b.Fatalf("gateway: %d events", got)
		}
		dDirect += t1.Sub(t0)
		dGateway += time.Since(t1)
		events += perStream + 1
	}
	b.ReportMetric(float64(events)/dDirect.Seconds(), "direct-events/s")
	b.ReportMetric(float64(events)/dGateway.Seconds(), "gateway-events/s")
	b.ReportMetric(dDirect.Seconds()/dGateway.Seconds(), "gateway/direct-throughput")
}
