package server

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/sim"
	"github.com/kvgate/kvgate/workers"
)

const testModel = "test-model"

// simWorker is a real simulated vLLM worker behind a loopback HTTP server. The recorder sees
// every request exactly as the worker received it.
type simWorker struct {
	*sim.Worker
	srv *httptest.Server
	rec *recorder
}

type recorded struct {
	path   string
	header http.Header
	body   []byte
}

type recorder struct {
	mu   sync.Mutex
	reqs []recorded
}

func (r *recorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodPost {
			body, _ := io.ReadAll(req.Body)
			r.mu.Lock()
			r.reqs = append(r.reqs, recorded{req.URL.Path, req.Header.Clone(), body})
			r.mu.Unlock()
			req.Body = io.NopCloser(bytes.NewReader(body))
		}
		h.ServeHTTP(w, req)
	})
}

func (r *recorder) all() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recorded(nil), r.reqs...)
}

// fastSim are options for a quick deterministic worker.
func fastSim() sim.Options {
	return sim.Options{ServedModelName: testModel, TTFT: time.Millisecond, ITL: time.Millisecond}
}

func startSim(t testing.TB, opts sim.Options) *simWorker {
	t.Helper()
	w, err := sim.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	srv := httptest.NewServer(rec.wrap(w.Handler()))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		_ = w.Close()
	})
	return &simWorker{Worker: w, srv: srv, rec: rec}
}

// gateway is a Server on a loopback listener in front of some workers, with its admin
// listener (/debug/*) on another.
type gateway struct {
	*Server
	srv      *httptest.Server
	reg      *workers.Registry
	url      string
	adminURL string
}

func testGatewayConfig(urls ...string) configs.Config {
	c := configs.Default()
	c.Model = testModel
	c.Router.Policy = "round_robin" // Load would resolve "auto" so; these workers have no events
	for _, u := range urls {
		c.Workers = append(c.Workers, configs.Worker{URL: u, DPSize: 1})
	}
	c.Health.Timeout = configs.Duration(time.Second)
	c.Proxy.ExposeRoutingHeaders = true // most tests read X-Kvgate-Worker
	c.ShutdownDrainDelay = 0            // no load balancer to wait for; drain tests set it
	return c
}

func startGateway(t testing.TB, mutate func(*configs.Config), urls ...string) *gateway {
	t.Helper()
	cfg := testGatewayConfig(urls...)
	if mutate != nil {
		mutate(&cfg)
	}
	pol, err := router.New(cfg.Router.Policy, router.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return startGatewayWith(t, cfg, routerFor(t, pol), nil)
}

func startGatewayWith(t testing.TB, cfg configs.Config, rt router.Router, enricher RequestEnricher) *gateway {
	t.Helper()
	reg, err := workers.NewRegistry(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Config: cfg, Registry: reg, Router: rt, Enricher: enricher})
	if err != nil {
		t.Fatal(err)
	}
	reg.ProbeAll(context.Background())
	srv := httptest.NewServer(s.Handler())
	admin := httptest.NewServer(s.AdminHandler())
	g := &gateway{Server: s, srv: srv, reg: reg, url: srv.URL, adminURL: admin.URL}
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		admin.CloseClientConnections()
		admin.Close()
		reg.Close()
	})
	t.Cleanup(func() { g.requireNoInFlight(t) })
	return g
}

// requireNoInFlight checks the per-worker in-flight accounting returned to zero.
func (g *gateway) requireNoInFlight(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		busy := 0
		for _, w := range g.reg.Workers() {
			for r := 0; r < w.DPSize(); r++ {
				busy += w.InFlight(r)
			}
		}
		if busy == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("in-flight accounting did not return to zero: %d", busy)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (g *gateway) client() *openai.Client {
	cfg := openai.DefaultConfig("unused")
	cfg.BaseURL = g.url + "/v1"
	return openai.NewClientWithConfig(cfg)
}

// post sends body to path: /debug/* paths go to the admin listener, the rest to the client one.
func (g *gateway) post(t testing.TB, path, body string, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	base := g.url
	if strings.HasPrefix(path, "/debug/") {
		base = g.adminURL
	}
	req, err := http.NewRequest(http.MethodPost, base+path, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return resp, data
}

func chatReq(stream bool, maxTokens int) openai.ChatCompletionRequest {
	return openai.ChatCompletionRequest{
		Model:               testModel,
		MaxCompletionTokens: maxTokens,
		Stream:              stream,
		Messages:            []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: "Hello there, how are you?"}},
	}
}
