package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/workers"
)

func TestHealthAndMetrics(t *testing.T) {
	a, b := startSim(t, fastSim()), startSim(t, fastSim())
	g := startGateway(t, nil, a.srv.URL, b.srv.URL)
	resp, err := http.Get(g.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Status          string `json:"status"`
		RoutableWorkers int    `json:"routable_workers"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if resp.StatusCode != 200 || h.Status != "ok" || h.RoutableWorkers != 2 {
		t.Fatalf("health %d %+v", resp.StatusCode, h)
	}

	for range 2 {
		if _, err := g.client().CreateChatCompletion(context.Background(), chatReq(false, 2)); err != nil {
			t.Fatal(err)
		}
	}
	// A stream the client closes right after [DONE] is a success, not a disconnect.
	st, err := g.client().CreateChatCompletionStream(context.Background(), chatReq(true, 2))
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = st.Recv()
	}
	st.Close()
	g.post(t, pathChat, `{`, nil)
	wants := []string{
		`kvgate_requests_total{code="200",endpoint="/v1/chat/completions"} 3`,
		`kvgate_requests_total{code="400",endpoint="/v1/chat/completions"} 1`,
		`kvgate_time_to_first_byte_seconds_count{endpoint="/v1/chat/completions"} 3`,
		`kvgate_worker_requests_total{code="200",worker="` + a.srv.URL + `"} 2`,
		`kvgate_worker_healthy{worker="` + b.srv.URL + `"} 1`,
		`kvgate_worker_in_flight{dp_rank="0",worker="` + a.srv.URL + `"} 0`,
		`kvgate_requests_in_flight{endpoint="/v1/chat/completions"} 0`,
	}
	// The handler counts a request just after the client has its last byte: poll briefly.
	// Every series is on the admin listener's /metrics (the per-worker ones only there).
	var m string
	deadline := time.Now().Add(3 * time.Second)
	for {
		m = scrapeAdmin(t, g)
		missing := 0
		for _, want := range wants {
			if !strings.Contains(m, want) {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range wants {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	public := scrape(t, g)
	for _, want := range wants {
		if present, detailed := strings.Contains(public, want), strings.Contains(want, `worker="`); present == detailed {
			t.Errorf("the client listener's /metrics: %s present %v, want %v", want, present, !detailed)
		}
	}
	// A second server in the same process has its own registry: no duplicate registration
	// panic and no shared counts.
	g2 := startGateway(t, nil, a.srv.URL)
	if strings.Contains(scrape(t, g2), `kvgate_requests_total{code="200"`) {
		t.Error("second server shares the first one's counters")
	}
}

// Graceful shutdown: a running stream finishes, new connections are refused; past the
// deadline the remaining stream is cut, ends with an error event in its API's shape, and its
// upstream is cancelled.
func TestGracefulShutdown(t *testing.T) {
	const (
		openAIBody    = `{"model":"test-model","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"x"}]}`
		anthropicBody = `{"model":"test-model","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"x"}]}`
	)
	cases := []struct {
		name      string
		path      string
		body      string
		deadline  time.Duration
		maxTokens int
		// wantTail is how the stream ends.
		wantTail string
		finishes bool
	}{
		{"stream finishes within the deadline", pathChat, openAIBody, 5 * time.Second, 15, "data: [DONE]\n\n", true},
		{"stream cut at the deadline", pathChat, openAIBody, 100 * time.Millisecond, 1000,
			`"type": "ServiceUnavailableError", "param": null, "code": 503}}` + "\n\ndata: [DONE]\n\n", false},
		{"messages stream finishes within the deadline", pathMessages, anthropicBody, 5 * time.Second, 15, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", true},
		{"messages stream cut at the deadline", pathMessages, anthropicBody, 100 * time.Millisecond, 1000,
			`event: error` + "\n" + `data: {"type":"error","error":{"type":"overloaded_error","message":"` + msgShutdownCut + `"}}` + "\n\n", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := fastSim()
			opts.ITL = 20 * time.Millisecond
			w := startSim(t, opts)
			cfg := testGatewayConfig(w.srv.URL)
			cfg.ShutdownTimeout = configs.Duration(tc.deadline)
			reg, _ := workers.NewRegistry(cfg, nil)
			defer reg.Close()
			s, err := New(Options{Config: cfg, Registry: reg, Router: routerFor(t, &router.RoundRobin{})})
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, stop := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() { served <- s.Serve(ctx, ln) }()
			url := "http://" + ln.Addr().String()

			resp, err := http.Post(url+tc.path, "application/json", strings.NewReader(fmt.Sprintf(tc.body, tc.maxTokens)))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			first := make([]byte, 16)
			if _, err := io.ReadFull(resp.Body, first); err != nil {
				t.Fatal(err)
			}
			stop()
			waitFor(t, "the listener to close", func() bool {
				c, err := net.DialTimeout("tcp", ln.Addr().String(), 100*time.Millisecond)
				if err == nil {
					c.Close()
				}
				return err != nil
			})
			rest, _ := io.ReadAll(resp.Body)
			if !strings.HasSuffix(string(rest), tc.wantTail) {
				t.Errorf("stream ends %q, want it to end %q", tail(rest, len(tc.wantTail)+20), tc.wantTail)
			}
			if cut := strings.Contains(string(rest), "error"); cut == tc.finishes {
				t.Errorf("error event present=%v in a stream that finishes=%v", cut, tc.finishes)
			}
			select {
			case err := <-served:
				if err != nil {
					t.Errorf("Serve: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Serve did not return")
			}
			if !tc.finishes {
				waitFor(t, "the worker to see the cancel", func() bool { return w.Stats().Cancelled == 1 })
				if st := reg.Workers()[0].Status(); !st.Healthy || st.LastError != "" {
					t.Errorf("the cut was reported against the worker: %+v", st)
				}
			}
			waitFor(t, "in flight to be released", func() bool { return reg.Workers()[0].InFlight(0) == 0 })
		})
	}
}

func tail(b []byte, n int) string { return string(b[max(0, len(b)-n):]) }

func TestServeReportsListenerErrors(t *testing.T) {
	cfg := testGatewayConfig("http://127.0.0.1:1")
	reg, _ := workers.NewRegistry(cfg, nil)
	s, _ := New(Options{Config: cfg, Registry: reg, Router: routerFor(t, &router.RoundRobin{})})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	ln.Close()
	if err := s.Serve(context.Background(), ln); err == nil || errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("err = %v", err)
	}
}

func TestDecideDryRun(t *testing.T) {
	a, b := startSim(t, fastSim()), startSim(t, fastSim())
	g := startGateway(t, nil, a.srv.URL, b.srv.URL)
	body := []byte(`{"model":"test-model","messages":[{"role":"user","content":"x"}]}`)
	h := http.Header{"X-Session-Id": {"s1"}}
	d, _, err := g.decide(context.Background(), pathChat, body, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Policy != "round_robin" || len(d.Candidates) != 2 || d.Chosen.Worker != a.srv.URL {
		t.Fatalf("decision %+v", d)
	}
	if len(a.rec.all())+len(b.rec.all()) != 0 {
		t.Error("a dry run reached a worker")
	}
	_, _, err = g.decide(context.Background(), pathChat, []byte(`{"model":"test-model"}`), h, nil)
	var ae *apiError
	if !errors.As(err, &ae) || ae.Status != 400 {
		t.Fatalf("err = %v", err)
	}
}
