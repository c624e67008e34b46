package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/cluster"
	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/server"
	"github.com/kvgate/kvgate/sim"
	"github.com/kvgate/kvgate/tokenize"
	"github.com/kvgate/kvgate/workers"
)

// modelDir is the Qwen3 tokenizer folder `make` fetches; tests that need it skip without it.
const modelDir = "../../models/qwen3"

const servedModel = "qwen"

// needModel skips the test when the tokenizer files are absent and returns the loaded tokenizer
// (one per test binary: testTokenizers).
func needModel(t testing.TB) *tokenize.Tokenizer {
	t.Helper()
	if testing.Short() {
		t.Skip("loads the real tokenizer (and starts simulated workers)")
	}
	if _, err := os.Stat(filepath.Join(modelDir, "tokenizer.json")); err != nil {
		t.Skipf("%s/tokenizer.json is absent (fetch it with scripts/fetch-tokenizers.sh qwen3): %v", modelDir, err)
	}
	tok, err := testTokenizers.load(configs.Config{Tokenizer: modelDir})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// fleetSpec describes the simulated workers and the gateway settings of one end-to-end test.
type fleetSpec struct {
	workers int
	events  bool
	// simOpts adjusts each worker's options (i is its index).
	simOpts func(i int, o *sim.Options)
	// args are extra `kvgate serve` flags (after --model, --tokenizer and the workers).
	args []string
	// wrap, when set, wraps worker i's HTTP handler (fault injection around the simulator).
	wrap func(i int, h http.Handler) http.Handler
}

// fleet is simulated vLLM workers (real HTTP, real tokenizer, real ZMQ KV events when enabled)
// behind a gateway assembled exactly as `kvgate serve` assembles it, on loopback. The gateways
// of a replicated fleet are each a fleet sharing the same workers (startGateway).
type fleet struct {
	t      *testing.T
	cfg    configs.Config
	urls   []string
	sims   map[string]*sim.Worker
	direct map[string]*openai.Client // straight to one worker, bypassing the gateway
	gw     *httptest.Server
	admin  *httptest.Server // the gateway's admin listener (/debug/*)
	client *openai.Client   // through the gateway
	prom   *prometheus.Registry
	rt     *routing
	node   *cluster.Node // the gateway's cluster membership (nil without a cluster section)
}

// simWorkers are a test's simulated workers.
type simWorkers struct {
	urls   []string
	flags  []string // each worker's --worker value (with its KV-event endpoints when enabled)
	sims   map[string]*sim.Worker
	direct map[string]*openai.Client
}

// startSimWorkers starts spec's simulated workers on loopback, stopped at the end of the test.
func startSimWorkers(t *testing.T, tok *tokenize.Tokenizer, spec fleetSpec) simWorkers {
	t.Helper()
	w := simWorkers{sims: map[string]*sim.Worker{}, direct: map[string]*openai.Client{}}
	for i := range spec.workers {
		o := sim.Options{ServedModelName: servedModel, Tokenize: tok, TTFT: 5 * time.Millisecond, ITL: time.Millisecond,
			Speedup: 1, Logger: slog.New(slog.DiscardHandler)}
		if spec.events {
			o.KVEvents = sim.KVEventsConfig{EnableKVCacheEvents: true, Endpoint: "tcp://127.0.0.1:*",
				ReplayEndpoint: "tcp://127.0.0.1:*", Topic: "kv-events"}
		}
		if spec.simOpts != nil {
			spec.simOpts(i, &o)
		}
		sw, err := sim.New(o)
		if err != nil {
			t.Fatal(err)
		}
		h := sw.Handler()
		if spec.wrap != nil {
			h = spec.wrap(i, h)
		}
		srv := httptest.NewServer(h)
		t.Cleanup(func() { srv.CloseClientConnections(); srv.Close(); _ = sw.Close() })
		w.urls = append(w.urls, srv.URL)
		w.sims[srv.URL] = sw
		cc := openai.DefaultConfig("none")
		cc.BaseURL = srv.URL + "/v1"
		w.direct[srv.URL] = openai.NewClientWithConfig(cc)
		flag := srv.URL
		if eps := sw.EventEndpoints(); spec.events && len(eps) > 0 {
			// The sim binds port 0 per rank; rank 0's endpoints with dp_size 1 are exact.
			flag += ",kv_events=" + eps[0].Endpoint + ",replay=" + eps[0].Replay + ",topic=kv"
		}
		w.flags = append(w.flags, flag)
	}
	return w
}

// gatewayArgs are the `kvgate serve` flags of a test gateway in front of w: the served model,
// its tokenizer, a loopback listener, a quick health interval, the workers, then extra.
func gatewayArgs(w simWorkers, extra ...string) []string {
	args := []string{"--model", servedModel, "--tokenizer", modelDir, "--listen", "127.0.0.1:0",
		"--health-interval", "200ms"}
	for _, f := range w.flags {
		args = append(args, "--worker", f)
	}
	return append(args, extra...)
}

func startFleet(t *testing.T, tok *tokenize.Tokenizer, spec fleetSpec) *fleet {
	t.Helper()
	w := startSimWorkers(t, tok, spec)
	f := startGateway(t, w, gatewayArgs(w, append([]string{"--router-metrics-interval", "100ms",
		"--proxy-expose-routing-headers"}, spec.args...)...))
	if spec.events {
		f.awaitEvents()
	}
	return f
}

// startGateway assembles a gateway from args as `kvgate serve` assembles it (the cluster node
// first when args configure one, then the registry, the routing with the test binary's shared
// tokenizer, and the server) in front of w, on loopback, and stops it at the end of the test.
func startGateway(t *testing.T, w simWorkers, args []string) *fleet {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	cfg, err := configs.Load(args, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, cfg: cfg, urls: w.urls, sims: w.sims, direct: w.direct, prom: prometheus.NewRegistry()}
	ctx, cancel := context.WithCancel(context.Background())
	var details []server.HealthDetail
	if cfg.Cluster.Enabled() {
		if f.node, err = cluster.Start(ctx, cfg.Cluster, cluster.Options{Log: quiet, Registerer: f.prom}); err != nil {
			cancel()
			t.Fatal(err)
		}
		details = append(details, f.node)
	}
	reg, err := workers.NewRegistry(cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	reg.ProbeAll(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { reg.Run(ctx) })
	if f.rt, err = buildRoutingWith(ctx, cfg, reg, f.prom, quiet, f.node, testTokenizers.load); err != nil {
		t.Fatal(err)
	}
	if f.rt.bindings != nil {
		details = append(details, f.rt.bindings)
	}
	s, err := server.New(server.Options{Config: cfg, Registry: reg, Router: f.rt.dispatcher, Enricher: f.rt.enricher,
		Metrics: f.prom, Logger: quiet, Details: details})
	if err != nil {
		t.Fatal(err)
	}
	f.gw = httptest.NewServer(s.Handler())
	f.admin = httptest.NewServer(s.AdminHandler())
	t.Cleanup(func() {
		f.gw.CloseClientConnections()
		f.gw.Close()
		f.admin.CloseClientConnections()
		f.admin.Close()
		cancel()
		wg.Wait()
		f.rt.close()
		reg.Close()
		if f.node != nil {
			f.node.Close()
		}
	})
	cc := openai.DefaultConfig("none")
	cc.BaseURL = f.gw.URL + "/v1"
	f.client = openai.NewClientWithConfig(cc)
	return f
}

// awaitEvents returns once every worker's KV events reach the gateway's index. A ZMQ SUB joins
// asynchronously and a PUB drops what it publishes before then, so each worker gets distinct
// warm-up prompts (straight, not through the gateway) until its index holds blocks.
func (f *fleet) awaitEvents() {
	f.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for i, u := range f.urls {
		for attempt := 0; ; attempt++ {
			if time.Now().After(deadline) {
				f.t.Fatalf("%s: KV events never reached the gateway's index: %s", u, f.get("/debug/workers"))
			}
			req := chatRequest(fmt.Sprintf("warm-up %d of worker %d", attempt, i), strings.Repeat("lorem ipsum dolor ", 20))
			if _, err := f.direct[u].CreateChatCompletion(context.Background(), req); err != nil {
				f.t.Fatal(err)
			}
			if f.pollTarget(u, 300*time.Millisecond, func(v targetJSON) bool { return v.IndexBlocks > 0 }) {
				break
			}
		}
	}
}

// targetJSON is the part of one GET /debug/workers row the tests read.
type targetJSON struct {
	Worker       string `json:"worker"`
	DPRank       int    `json:"dp_rank"`
	Mode         string `json:"mode"`
	InFlight     int    `json:"in_flight"`
	IndexBlocks  int    `json:"index_blocks"`
	Subscription *struct {
		State            string           `json:"state"`
		Resets           map[string]int64 `json:"resets"`
		ResidencyVersion uint64           `json:"residency_version"`
		ReplaysOK        int64            `json:"replays_ok"`
	} `json:"subscription"`
	ApproximateBlocks *int `json:"approximate_blocks"`
	Load              *struct {
		PrefillTokens int `json:"prefill_tokens"`
		Requests      int `json:"requests"`
		ActiveBlocks  int `json:"active_blocks"`
	} `json:"load"`
	Metrics *struct {
		Running    float64 `json:"running"`
		Waiting    float64 `json:"waiting"`
		KVUsage    float64 `json:"kv_usage"`
		AgeSeconds float64 `json:"age_seconds"`
	} `json:"metrics"`
}

func (f *fleet) targets() []targetJSON {
	f.t.Helper()
	var out struct {
		Targets []targetJSON `json:"targets"`
	}
	if err := json.Unmarshal([]byte(f.get("/debug/workers")), &out); err != nil {
		f.t.Fatal(err)
	}
	return out.Targets
}

// pollTarget polls GET /debug/workers until cond holds for worker u (rank 0) or d passes.
func (f *fleet) pollTarget(u string, d time.Duration, cond func(targetJSON) bool) bool {
	f.t.Helper()
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		for _, v := range f.targets() {
			if v.Worker == u && v.DPRank == 0 && cond(v) {
				return true
			}
		}
		if time.Now().After(end) {
			return false
		}
	}
}

func (f *fleet) get(path string) string {
	f.t.Helper()
	resp, err := http.Get(f.base(path) + path)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// base is the admin listener's URL for /debug/* paths, else the client listener's.
func (f *fleet) base(path string) string {
	if strings.HasPrefix(path, "/debug/") {
		return f.admin.URL
	}
	return f.gw.URL
}

// post sends a raw JSON body to the gateway with extra headers and returns status and body.
func (f *fleet) post(path string, body any, h map[string]string) (int, http.Header, []byte) {
	f.t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		f.t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, f.base(path)+path, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// routeJSON is the documented POST /debug/route body (docs/operations.md, "POST /debug/route").
type routeJSON struct {
	PromptTokens int    `json:"prompt_tokens"`
	PromptBlocks int    `json:"prompt_blocks"`
	Policy       string `json:"policy"`
	Chosen       struct {
		Worker string `json:"worker"`
		DPRank int    `json:"dp_rank"`
		Reason string `json:"reason"`
	} `json:"chosen"`
	Candidates []struct {
		Worker   string  `json:"worker"`
		DPRank   int     `json:"dp_rank"`
		Mode     string  `json:"mode"`
		G1Blocks int     `json:"g1_blocks"`
		G2Blocks int     `json:"g2_blocks"`
		G3Blocks int     `json:"g3_blocks"`
		Load     float64 `json:"load"`
		Cost     float64 `json:"cost"`
	} `json:"candidates"`
	SessionID string `json:"session_id"`
	raw       string // the whole response, for failure messages
}

// dryRun asks POST /debug/route for req's decision.
func (f *fleet) dryRun(req any, h map[string]string) routeJSON {
	f.t.Helper()
	code, _, body := f.post("/debug/route", req, h)
	if code != http.StatusOK {
		f.t.Fatalf("/debug/route: %d %s", code, body)
	}
	d := routeJSON{raw: string(body)}
	if err := json.Unmarshal(body, &d); err != nil {
		f.t.Fatal(err)
	}
	return d
}

// g1Of returns the dry-run's G1 blocks on worker u.
func (d routeJSON) g1Of(u string) int {
	for _, c := range d.Candidates {
		if c.Worker == u {
			return c.G1Blocks
		}
	}
	return -1
}

// awaitCached waits until the gateway's index (or approximate view) shows all of req's blocks
// on worker u: KV events are asynchronous.
func (f *fleet) awaitCached(req any, u string, h map[string]string) routeJSON {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		d := f.dryRun(req, h)
		if d.PromptBlocks > 0 && d.g1Of(u) == d.PromptBlocks {
			return d
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the gateway never saw the prompt's %d blocks on %s: %+v", d.PromptBlocks, u, d.Candidates)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// awaitIdle waits until the gateway accounts no load anywhere.
func (f *fleet) awaitIdle() {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		busy := ""
		for _, v := range f.targets() {
			if v.InFlight != 0 || (v.Load != nil && (v.Load.Requests != 0 || v.Load.PrefillTokens != 0 || v.Load.ActiveBlocks != 0)) {
				busy = fmt.Sprintf("%+v %+v", v, v.Load)
			}
		}
		if busy == "" {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("load never returned to zero: %s", busy)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// awaitSettled waits until the gateway accounts no load and every worker's latest scraped
// metrics, sent after that, show an idle worker. The latest scrape may predate the last
// request (idle) while one sent during it has yet to arrive and replace it; and one sent just
// after may still catch the worker finishing it (the simulator, like vLLM, updates its
// running count at the end of the engine step, after the response may have gone out).
func (f *fleet) awaitSettled() {
	f.t.Helper()
	f.awaitIdle()
	idleAt := time.Now()
	deadline := idleAt.Add(5 * time.Second)
	for {
		idle := true
		for _, v := range f.targets() {
			m := v.Metrics
			scrapedAfter := m != nil && time.Duration(m.AgeSeconds*float64(time.Second)) < time.Since(idleAt)
			if !scrapedAfter || m.Running != 0 || m.Waiting != 0 || m.KVUsage != 0 {
				idle = false
			}
		}
		if idle {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("workers never reported idle: %s", f.get("/debug/workers"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metric returns the sum of the series of a metric family whose labels contain every pair in
// want (nil for any), from the gateway's registry.
func (f *fleet) metric(name string, want map[string]string) float64 {
	f.t.Helper()
	return metricSum(f.t, f.prom, name, want)
}

// metricSum is the sum of g's series of name whose labels contain every pair in want: counters'
// and gauges' values, histograms' sample counts.
func metricSum(t testing.TB, g prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func chatRequest(system, user string) openai.ChatCompletionRequest {
	return openai.ChatCompletionRequest{Model: servedModel, MaxCompletionTokens: 4, Messages: []openai.ChatCompletionMessage{
		{Role: openai.ChatMessageRoleSystem, Content: system},
		{Role: openai.ChatMessageRoleUser, Content: user},
	}}
}

// longText is about words×7 tokens of text distinct per seed from its first words on.
func longText(seed, words int) string {
	var b strings.Builder
	for i := range words {
		fmt.Fprintf(&b, "entry %d of ledger %d reads %x; ", i, seed, (i*7919+seed*104729)%65536)
	}
	return b.String()
}
