package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/server"
	"github.com/kvgate/kvgate/sim"
)

// modelSpec is one served model of a multi-model e2e test: its tokenizer folder and workers.
type modelSpec struct {
	name, dir string
	workers   int
}

// modelsFleet is simulated pools (one per model, each with its own tokenizer and KV events)
// behind one gateway built as `kvgate serve` builds it from a models: config.
type modelsFleet struct {
	t      *testing.T
	pools  map[string][]string // model -> its workers' URLs
	sims   map[string]*sim.Worker
	direct map[string]*openai.Client
	gw     *httptest.Server
	admin  *httptest.Server
	client *openai.Client
	prom   *prometheus.Registry
}

func startModels(t *testing.T, specs []modelSpec, simOpts func(model string, i int, o *sim.Options)) *modelsFleet {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	f := &modelsFleet{t: t, pools: map[string][]string{}, sims: map[string]*sim.Worker{},
		direct: map[string]*openai.Client{}, prom: prometheus.NewRegistry()}
	var yaml strings.Builder
	yaml.WriteString("listen: 127.0.0.1:0\nhealth:\n  interval: 200ms\nrouter:\n  metrics_interval: 100ms\nproxy:\n  expose_routing_headers: true\nmodels:\n")
	for _, spec := range specs {
		tok, err := testTokenizers.load(configs.Config{Tokenizer: spec.dir})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&yaml, "  - name: %s\n    tokenizer: %s\n    workers:\n", spec.name, spec.dir)
		for i := range spec.workers {
			o := sim.Options{ServedModelName: spec.name, Tokenize: tok, TTFT: 5 * time.Millisecond, ITL: time.Millisecond,
				Speedup: 1, Logger: quiet, KVEvents: sim.KVEventsConfig{EnableKVCacheEvents: true, Endpoint: "tcp://127.0.0.1:*",
					ReplayEndpoint: "tcp://127.0.0.1:*", Topic: "kv-events"}}
			if simOpts != nil {
				simOpts(spec.name, i, &o)
			}
			w, err := sim.New(o)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(w.Handler())
			t.Cleanup(func() { srv.CloseClientConnections(); srv.Close(); _ = w.Close() })
			f.pools[spec.name] = append(f.pools[spec.name], srv.URL)
			f.sims[srv.URL] = w
			cc := openai.DefaultConfig("none")
			cc.BaseURL = srv.URL + "/v1"
			f.direct[srv.URL] = openai.NewClientWithConfig(cc)
			ep := w.EventEndpoints()[0]
			fmt.Fprintf(&yaml, "      - url: %s\n        kv_events: %s\n        replay: %s\n        topic: kv\n", srv.URL, ep.Endpoint, ep.Replay)
		}
	}
	path := filepath.Join(t.TempDir(), "kvgate.yaml")
	if err := os.WriteFile(path, []byte(yaml.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := configs.Load([]string{"--config", path}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatalf("%v\n%s", err, yaml.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	ps, err := buildPoolsWith(ctx, cfg, f.prom, quiet, nil, testTokenizers.load)
	if err != nil {
		t.Fatal(err)
	}
	ps.probe(ctx)
	s, err := server.New(server.Options{Config: cfg, Pools: ps.serverPools(), Metrics: f.prom, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	f.gw, f.admin = httptest.NewServer(s.Handler()), httptest.NewServer(s.AdminHandler())
	t.Cleanup(func() {
		f.gw.CloseClientConnections()
		f.gw.Close()
		f.admin.Close()
		cancel()
		ps.close()
	})
	cc := openai.DefaultConfig("none")
	cc.BaseURL = f.gw.URL + "/v1"
	f.client = openai.NewClientWithConfig(cc)
	for _, spec := range specs {
		f.awaitEvents(spec.name)
	}
	return f
}

// targets reads GET /debug/workers?model=M.
func (f *modelsFleet) targets(model string) []targetJSON {
	f.t.Helper()
	resp, err := http.Get(f.admin.URL + "/debug/workers?model=" + model)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Model   string       `json:"model"`
		Targets []targetJSON `json:"targets"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Model != model {
		f.t.Fatalf("/debug/workers?model=%s: model %q, %v", model, out.Model, err)
	}
	return out.Targets
}

// awaitEvents returns once every worker of model's pool feeds that pool's index (see
// fleet.awaitEvents).
func (f *modelsFleet) awaitEvents(model string) {
	f.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for i, u := range f.pools[model] {
		for attempt := 0; ; attempt++ {
			if time.Now().After(deadline) {
				f.t.Fatalf("%s: KV events never reached model %s's index", u, model)
			}
			req := chatRequest(fmt.Sprintf("warm-up %d of worker %d", attempt, i), strings.Repeat("lorem ipsum dolor ", 20))
			req.Model = model
			if _, err := f.direct[u].CreateChatCompletion(context.Background(), req); err != nil {
				f.t.Fatal(err)
			}
			seen := false
			for end := time.Now().Add(300 * time.Millisecond); !seen && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
				for _, v := range f.targets(model) {
					seen = seen || v.Worker == u && v.IndexBlocks > 0
				}
			}
			if seen {
				break
			}
		}
	}
}

// metric sums a metric family's series whose labels contain want (see fleet.metric).
func (f *modelsFleet) metric(name string, want map[string]string) float64 {
	return (&fleet{t: f.t, prom: f.prom}).metric(name, want)
}

// Two models with different tokenizers behind one gateway, each with its own simulated pool:
// requests go to their model's pool and are KV-matched there (predicted = reported cached
// tokens per pool, prompt tokens counted with the pool's own tokenizer); /v1/models lists both
// and an adapter loaded on one worker at runtime, which then routes to that worker; an unknown
// model is OpenAI's 404 model_not_found.
func TestMultiModelE2E(t *testing.T) {
	needModel(t)
	llamaDir := "../../models/llama3_1"
	if _, err := os.Stat(filepath.Join(llamaDir, "tokenizer.json")); err != nil {
		t.Skipf("%s/tokenizer.json is absent (scripts/fetch-tokenizers.sh): %v", llamaDir, err)
	}
	const qwen, llama, adapter = "qwen", "llama", "sql-lora"
	f := startModels(t, []modelSpec{{qwen, modelDir, 2}, {llama, llamaDir, 2}}, func(model string, i int, o *sim.Options) {
		o.AllowRuntimeLoRAUpdating = model == llama && i == 1
	})
	ctx := context.Background()

	for _, model := range []string{qwen, llama} {
		t.Run("routed and matched in pool "+model, func(t *testing.T) {
			own := f.pools[model]
			for seed := range 2 {
				req := chatRequest("You are auditor "+strconv.Itoa(seed)+" of "+model+".", longText(seed, 150))
				req.Model = model
				first, err := f.client.CreateChatCompletion(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				w1 := first.Header().Get("X-Kvgate-Worker")
				if w1 != own[0] && w1 != own[1] {
					t.Fatalf("model %s went to %q, not one of its workers %v", model, w1, own)
				}
				// The pool's index sees the prompt's blocks on w1 (KV events are asynchronous).
				var again openai.ChatCompletionResponse
				deadline := time.Now().Add(5 * time.Second)
				for {
					if again, err = f.client.CreateChatCompletion(ctx, req); err != nil {
						t.Fatal(err)
					}
					blocks, _ := strconv.Atoi(again.Header().Get(router.HeaderCachedBlocks))
					if again.Header().Get("X-Kvgate-Worker") == w1 && blocks > 0 && blocks == again.Usage.PromptTokens/16 {
						want := router.PredictedCachedTokens(blocks, 16, again.Usage.PromptTokens)
						if d := again.Usage.PromptTokensDetails; d == nil || d.CachedTokens != want {
							t.Fatalf("worker reported cached %+v, the pool predicted %d", d, want)
						}
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("the repeat never matched all its blocks on %s: went to %s with %s blocks",
							w1, again.Header().Get("X-Kvgate-Worker"), again.Header().Get(router.HeaderCachedBlocks))
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			// The model's predicted and reported cached-token series agree on a request the
			// index has caught up with. (Their totals need not: a repeat above that went out
			// before the worker's KV events arrived was predicted short of what it found.)
			labels := map[string]string{"model": model}
			predicted := func() float64 { return f.metric("kvgate_router_cached_tokens_predicted_total", labels) }
			reported := func() float64 { return f.metric("kvgate_router_cached_tokens_reported_total", labels) }
			p0, r0 := predicted(), reported()
			req := chatRequest("You are auditor 0 of "+model+".", longText(0, 150))
			req.Model = model
			settled, err := f.client.CreateChatCompletion(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			for end := time.Now().Add(2 * time.Second); reported() == r0 && time.Now().Before(end); {
				time.Sleep(10 * time.Millisecond) // the usage is observed as the response ends
			}
			if p, r := predicted()-p0, reported()-r0; r <= 0 || p != r || settled.Usage.PromptTokensDetails == nil ||
				float64(settled.Usage.PromptTokensDetails.CachedTokens) != r {
				t.Errorf("model %s: one settled repeat predicted %v cached tokens, the series reported %v, the worker %+v",
					model, p, r, settled.Usage.PromptTokensDetails)
			}
			// Each pool tokenizes with its own tokenizer: the workers counted the same prompts.
			if n := f.metric("kvgate_router_prompt_token_mismatches_total", labels); n != 0 {
				t.Errorf("model %s: %v prompt-token mismatches", model, n)
			}
		})
	}
	// The two tokenizers really differ on these prompts, so a crossed pool would show.
	req := chatRequest("You are auditor 0 of x.", longText(0, 150))
	var counts []int
	for _, model := range []string{qwen, llama} {
		req.Model = model
		resp, err := f.client.CreateChatCompletion(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		counts = append(counts, resp.Usage.PromptTokens)
	}
	if counts[0] == counts[1] {
		t.Errorf("both tokenizers counted %d tokens: the test cannot tell the pools apart", counts[0])
	}

	t.Run("unknown model", func(t *testing.T) {
		req := chatRequest("s", "u")
		req.Model = "gpt-9"
		_, err := f.client.CreateChatCompletion(ctx, req)
		var apiErr *openai.APIError
		if !errors.As(err, &apiErr) || apiErr.HTTPStatusCode != 404 || apiErr.Code != "model_not_found" {
			t.Fatalf("err = %#v", err)
		}
	})

	t.Run("runtime adapter", func(t *testing.T) {
		target := f.pools[llama][1]
		resp, err := http.Post(target+"/v1/load_lora_adapter", "application/json",
			strings.NewReader(`{"lora_name":"`+adapter+`","lora_path":"/adapters/sql"}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("load_lora_adapter: %d %s", resp.StatusCode, body)
		}
		list, err := f.client.ListModels(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range list.Models {
			ids = append(ids, m.ID)
		}
		if strings.Join(ids, ",") != qwen+","+llama+","+adapter {
			t.Errorf("/v1/models ids %v, want both models and the adapter", ids)
		}
		// Routable once the pool's health probe reread the worker's /v1/models (200ms here).
		req := chatRequest("You are an SQL assistant.", longText(7, 100))
		req.Model = adapter
		deadline := time.Now().Add(5 * time.Second)
		for {
			resp, err := f.client.CreateChatCompletion(ctx, req)
			var apiErr *openai.APIError
			if errors.As(err, &apiErr) && apiErr.HTTPStatusCode == 404 && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.Header().Get("X-Kvgate-Worker"); got != target {
				t.Fatalf("adapter request went to %s, the adapter is on %s", got, target)
			}
			break
		}
	})
}
