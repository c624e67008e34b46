package main

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/internal/kubefake"
	"github.com/kvgate/kvgate/server"
	"github.com/kvgate/kvgate/workers"
	"github.com/kvgate/kvgate/workers/discovery"
)

// discoveredGateway is a gateway whose fleet comes from Kubernetes discovery against a fake
// API, assembled as runServe assembles it: registry, routing, discovery source, server.
type discoveredGateway struct {
	cfg    configs.Config
	reg    *workers.Registry
	src    discovery.Source
	prom   *prometheus.Registry
	gw     *httptest.Server
	admin  *httptest.Server
	client *openai.Client
}

// startDiscoveredGateway serves the slices of Service vllm in namespace llm of api; args are
// extra `kvgate serve` flags.
func startDiscoveredGateway(t *testing.T, api *kubefake.Server, log *slog.Logger, args ...string) *discoveredGateway {
	t.Helper()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	all := append([]string{"--model", servedModel, "--tokenizer", modelDir, "--listen", "127.0.0.1:0",
		"--discovery-kubernetes-service", "vllm", "--discovery-kubernetes-namespace", "llm",
		"--discovery-kubernetes-api-url", api.URL, "--discovery-kubernetes-token-file", "",
		"--discovery-kubernetes-ca-file", ""}, args...)
	cfg, err := configs.Load(all, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	g := &discoveredGateway{cfg: cfg, prom: prometheus.NewRegistry()}
	ctx, cancel := context.WithCancel(context.Background())
	if g.reg, err = workers.NewRegistry(cfg, log); err != nil {
		t.Fatal(err)
	}
	rt, err := buildRoutingWith(ctx, cfg, g.reg, g.prom, log, nil, testTokenizers.load)
	if err != nil {
		t.Fatal(err)
	}
	if g.src, err = newDiscovery(cfg, g.reg, g.prom, log); err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.Options{Config: cfg, Registry: g.reg, Router: rt.dispatcher, Enricher: rt.enricher,
		Metrics: g.prom, Logger: log, Readiness: []server.ReadinessCheck{g.src}})
	if err != nil {
		t.Fatal(err)
	}
	forgetRemovedWorkers(g.reg, s)
	var wg sync.WaitGroup
	wg.Go(func() { g.reg.Run(ctx) })
	wg.Go(func() { g.src.Run(ctx) })
	g.gw = httptest.NewServer(s.Handler())
	g.admin = httptest.NewServer(s.AdminHandler())
	t.Cleanup(func() {
		g.gw.CloseClientConnections()
		g.gw.Close()
		g.admin.CloseClientConnections()
		g.admin.Close()
		cancel()
		wg.Wait()
		rt.close()
		g.reg.Close()
	})
	cc := openai.DefaultConfig("none")
	cc.BaseURL = g.gw.URL + "/v1"
	g.client = openai.NewClientWithConfig(cc)
	return g
}
