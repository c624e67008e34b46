package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/internal/kubefake"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/sim"
)

// Kubernetes discovery end to end: a fake API lists one EndpointSlice per simulated worker
// (real HTTP, real ZMQ KV events); while clients send requests, one worker's endpoint turns
// terminating and is later removed and a fourth worker's slice appears. Every request
// succeeds, none starts on the drained worker 2 s after it began terminating, the new worker
// gets traffic within 2 s, its index is exact (the cached tokens it reports are the ones the
// gateway predicted), and the removed worker leaves /debug/workers and /metrics.
func TestDiscoveryKubernetesE2E(t *testing.T) {
	tok := needModel(t)
	quiet := slog.New(slog.DiscardHandler)
	api := kubefake.New("llm", "vllm")
	t.Cleanup(api.Shutdown)
	f := &fleet{t: t, sims: map[string]*sim.Worker{}, direct: map[string]*openai.Client{}}
	var slices []kubefake.Slice
	for i := range 4 {
		w, err := sim.New(sim.Options{ServedModelName: servedModel, Tokenize: tok, TTFT: 5 * time.Millisecond, ITL: time.Millisecond,
			Speedup: 1, Logger: quiet, KVEvents: sim.KVEventsConfig{EnableKVCacheEvents: true, Endpoint: "tcp://127.0.0.1:*",
				ReplayEndpoint: "tcp://127.0.0.1:*", Topic: "kv-events"}})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(w.Handler())
		t.Cleanup(func() { srv.CloseClientConnections(); srv.Close(); _ = w.Close() })
		f.urls = append(f.urls, srv.URL)
		f.sims[srv.URL] = w
		cc := openai.DefaultConfig("none")
		cc.BaseURL = srv.URL + "/v1"
		f.direct[srv.URL] = openai.NewClientWithConfig(cc)
		ep := w.EventEndpoints()[0]
		slices = append(slices, kubefake.Slice{Name: fmt.Sprintf("vllm-%d", i), Ports: map[string]int32{
			"http": portOf(t, srv.URL), "kv-events": portOf(t, ep.Endpoint), "kv-replay": portOf(t, ep.Replay)},
			Endpoints: []kubefake.Endpoint{{Addresses: []string{"127.0.0.1"}, Ready: kubefake.Bool(true)}}})
	}
	for _, s := range slices[:3] {
		api.Put(s)
	}
	api.SetForbidden(true) // the Role is not granted yet
	g := startDiscoveredGateway(t, api, quiet, "--health-interval", "200ms", "--router-metrics-interval", "100ms",
		"--proxy-expose-routing-headers")
	f.gw, f.admin, f.client, f.prom, f.cfg = g.gw, g.admin, g.client, g.prom, g.cfg
	// GET /ready says why: the source cannot list endpointslices.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		body := f.get("/ready")
		if strings.Contains(body, `"component":"discovery.kubernetes"`) && strings.Contains(body, "verbs [list, watch]") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/ready never named the missing Role: %s", body)
		}
	}
	api.SetForbidden(false)
	deadline := time.Now().Add(10 * time.Second)
	for _, ok, _ := g.src.Readiness(); !ok || g.reg.Len() != 3; _, ok, _ = g.src.Readiness() {
		if time.Now().After(deadline) {
			t.Fatalf("discovery never synced the 3 listed workers (%d)", g.reg.Len())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(f.get("/ready"), `"ready":true`); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("/ready after the sync: %s", f.get("/ready"))
		}
	}
	all := f.urls
	f.urls = all[:3]
	f.awaitEvents()
	drained, added := all[1], all[3]

	// Clients: three loops of short chats with fresh prompts (cached nowhere, so placed by
	// load), each recording when it started and where it went.
	type served struct {
		start  time.Time
		worker string
		err    error
	}
	var mu sync.Mutex
	var log []served
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range 3 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				resp, err := g.client.CreateChatCompletion(context.Background(),
					chatRequest(fmt.Sprintf("You are client %d.", c), longText(c*100000+i, 30)))
				s := served{start: start, err: err}
				if err == nil {
					s.worker = resp.Header().Get("X-Kvgate-Worker")
				}
				mu.Lock()
				log = append(log, s)
				mu.Unlock()
			}
		})
	}
	time.Sleep(time.Second)
	term := slices[1]
	term.Endpoints = []kubefake.Endpoint{{Addresses: []string{"127.0.0.1"}, Ready: kubefake.Bool(false), Terminating: kubefake.Bool(true)}}
	tDrain := time.Now()
	api.Put(term)
	time.Sleep(time.Second)
	tAdd := time.Now()
	api.Put(slices[3])
	time.Sleep(1500 * time.Millisecond)
	tRemove := time.Now()
	api.Delete(slices[1].Name)
	time.Sleep(2500 * time.Millisecond)
	close(stop)
	wg.Wait()

	var firstOnAdded time.Time
	for _, s := range log {
		switch {
		case s.err != nil:
			t.Errorf("request started %v after the drain failed: %v", s.start.Sub(tDrain), s.err)
		case s.worker == drained && s.start.After(tDrain.Add(2*time.Second)):
			t.Errorf("request started %v after %s began terminating went to it", s.start.Sub(tDrain), drained)
		case s.worker == added && (firstOnAdded.IsZero() || s.start.Before(firstOnAdded)):
			firstOnAdded = s.start
		case f.sims[s.worker] == nil:
			t.Errorf("X-Kvgate-Worker %q is not a worker", s.worker)
		}
	}
	if firstOnAdded.IsZero() || firstOnAdded.Sub(tAdd) > 2*time.Second {
		t.Errorf("the added worker's first request started %v after its slice appeared, want within 2s", firstOnAdded.Sub(tAdd))
	}
	t.Logf("%d requests; added worker served from %v after its slice appeared; drained at %v, removed at %v",
		len(log), firstOnAdded.Sub(tAdd).Round(time.Millisecond), tDrain.Format("15:04:05.000"), tRemove.Format("15:04:05.000"))

	// The added worker's index is exact: a prompt it computed (sent to it directly) is seen
	// there in full and routed there, and it reports the cached tokens the gateway predicted.
	req := chatRequest("You are the new worker's auditor.", longText(77, 200))
	if _, err := f.direct[added].CreateChatCompletion(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	d := f.awaitCached(req, added, nil)
	again, err := g.client.CreateChatCompletion(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	blocks, _ := strconv.Atoi(again.Header().Get(router.HeaderCachedBlocks))
	want := router.PredictedCachedTokens(blocks, 16, again.Usage.PromptTokens)
	if w := again.Header().Get("X-Kvgate-Worker"); w != added || blocks != d.PromptBlocks {
		t.Errorf("cached prompt went to %s with %d cached blocks, want %s with %d", w, blocks, added, d.PromptBlocks)
	}
	if again.Usage.PromptTokensDetails == nil || again.Usage.PromptTokensDetails.CachedTokens != want || want == 0 {
		t.Errorf("the added worker reported cached %+v, the gateway predicted %d", again.Usage.PromptTokensDetails, want)
	}

	// The removed worker left the debug view and every metric label set.
	for _, v := range f.targets() {
		if v.Worker == drained {
			t.Errorf("/debug/workers still lists the removed worker: %+v", v)
		}
	}
	if body := f.get("/metrics"); strings.Contains(body, drained) {
		for _, line := range strings.Split(body, "\n") {
			if strings.Contains(line, drained) {
				t.Errorf("/metrics still has a series of the removed worker: %s", line)
			}
		}
	}
}

// portOf is the port of a URL or ZMQ endpoint ("tcp://127.0.0.1:5557").
func portOf(t *testing.T, raw string) int32 {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	_, p, err := net.SplitHostPort(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return int32(n)
}
