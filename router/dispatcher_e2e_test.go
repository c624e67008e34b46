package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/sim"
	"github.com/kvgate/kvgate/tokenize"
)

const e2eModelDir = "../models/qwen3"

// e2eFleet is three simulated vLLM workers (real HTTP, real tokenizer, real ZMQ KV events when
// enabled) with the gateway-side pieces this package owns: the event index fed by live
// subscribers, the kv policy and the dispatcher.
type e2eFleet struct {
	disp    *Dispatcher
	tok     *tokenize.Tokenizer
	cands   []Candidate
	clients map[string]*openai.Client
	reg     *prometheus.Registry
}

func startE2EFleet(t *testing.T, events bool, tok *tokenize.Tokenizer) *e2eFleet {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	f := &e2eFleet{clients: map[string]*openai.Client{}, reg: prometheus.NewRegistry(), tok: tok}
	ix := indexers.NewIndex(indexers.Options{BlockSize: 16})
	mgr, err := indexers.NewSubscribers(ix, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if err := mgr.Close(); err != nil {
			t.Error(err)
		}
	})
	// Start the workers in parallel: each loads the tokenizer, the slow part.
	sims := make([]*sim.Worker, 3)
	errs := make([]error, 3)
	var start sync.WaitGroup
	for i := range sims {
		start.Add(1)
		go func() {
			defer start.Done()
			o := sim.Options{ServedModelName: "qwen", Model: e2eModelDir, TTFT: 2 * time.Millisecond, ITL: time.Millisecond,
				Speedup: 1, Logger: quiet}
			if events {
				o.KVEvents = sim.KVEventsConfig{EnableKVCacheEvents: true, Endpoint: "tcp://127.0.0.1:*",
					ReplayEndpoint: "tcp://127.0.0.1:*", Topic: "kv"}
			}
			sims[i], errs[i] = sim.New(o)
		}()
	}
	start.Wait()
	for i, w := range sims {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		srv := httptest.NewServer(w.Handler())
		t.Cleanup(func() { srv.Close(); _ = w.Close() })
		target := kvkey.Target{Worker: srv.URL}
		f.cands = append(f.cands, Candidate{Target: target})
		cfg := openai.DefaultConfig("none")
		cfg.BaseURL = srv.URL + "/v1"
		f.clients[srv.URL] = openai.NewClientWithConfig(cfg)
		for _, ep := range w.EventEndpoints() {
			err := mgr.Start(ctx, indexers.SubscriberConfig{Target: kvkey.Target{Worker: srv.URL, DPRank: ep.DPRank},
				Endpoint: ep.Endpoint, ReplayEndpoint: ep.Replay, Topic: "kv"})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if events {
		f.awaitEvents(t, ix)
	}
	// Without events no subscription exists, so SubscriberHealth puts every target in approximate mode.
	deps := KVDeps{Approx: NewApproxIndex(DefaultKVConfig().Approximate), Events: SubscriberHealth(mgr)}
	if events {
		deps.Matcher = ix
	}
	p, err := NewKV(DefaultKVConfig(), deps)
	if err != nil {
		t.Fatal(err)
	}
	targets := make([]kvkey.Target, len(f.cands))
	for i, c := range f.cands {
		targets[i] = c.Target
	}
	f.disp, err = NewDispatcher(DispatcherOptions{KV: p, Registerer: f.reg, Log: quiet,
		Targets: func() []kvkey.Target { return targets }, MetricsInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); f.disp.Run(ctx) }()
	return f
}

// awaitEvents returns once every worker's KV events reach the index. A ZMQ SUB joins
// asynchronously and a PUB drops what it publishes before then, so it sends distinct warm-up
// prompts to each worker until one of them shows up in the index.
func (f *e2eFleet) awaitEvents(t *testing.T, ix *indexers.Index) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range f.cands {
		for attempt := 0; ; attempt++ {
			if time.Now().After(deadline) {
				t.Fatalf("%v: KV events never reached the index", c.Target)
			}
			chat := openai.ChatCompletionRequest{Model: "qwen", MaxCompletionTokens: 1, Messages: []openai.ChatCompletionMessage{
				{Role: "user", Content: fmt.Sprintf("warm-up %d for %s: %s", attempt, c.Worker, strings.Repeat("lorem ipsum ", 20))}}}
			body, _ := json.Marshal(chat)
			prompt, err := f.tok.TokenizeRequest(ctx, body)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.clients[c.Worker].CreateChatCompletion(ctx, chat); err != nil {
				t.Fatal(err)
			}
			hashes := prompt.BlockHashes(16)
			seen := false
			for wait := time.Now().Add(300 * time.Millisecond); time.Now().Before(wait) && !seen; time.Sleep(10 * time.Millisecond) {
				seen = ix.DeepestG1(c.Target, hashes) > 0
			}
			if seen {
				break
			}
		}
	}
}

// longPrompt is a chat request of roughly words×1.3 tokens; seed makes prompts distinct from
// their first words on.
func longPrompt(seed, words int) openai.ChatCompletionRequest {
	var b strings.Builder
	for i := range words {
		fmt.Fprintf(&b, "item %d of ledger %d reads %x; ", i, seed, (i*7919+seed*104729)%65536)
	}
	return openai.ChatCompletionRequest{Model: "qwen", MaxCompletionTokens: 4, Messages: []openai.ChatCompletionMessage{
		{Role: "system", Content: fmt.Sprintf("You are auditor number %d.", seed)},
		{Role: "user", Content: b.String()},
	}}
}

// send does what the gateway does for one request: tokenize, route, proxy (here with the
// go-openai client straight to the chosen worker), account, close the loop.
func (f *e2eFleet) send(t *testing.T, chat openai.ChatCompletionRequest) (Decision, openai.Usage) {
	t.Helper()
	ctx := context.Background()
	body, err := json.Marshal(chat)
	if err != nil {
		t.Fatal(err)
	}
	prompt, err := f.tok.TokenizeRequest(ctx, body)
	if err != nil {
		t.Fatal(err)
	}
	req := &Request{Model: chat.Model, PromptTokens: len(prompt.TokenIDs), BlockHashes: prompt.BlockHashes(16), BlockSize: 16}
	d, h, err := pickAndBegin(ctx, f.disp, req, f.cands)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Done()
	resp, err := f.clients[d.Chosen.Worker].CreateChatCompletion(ctx, chat)
	if err != nil {
		t.Fatal(err)
	}
	h.FirstToken()
	u := Usage{PromptTokens: resp.Usage.PromptTokens}
	if resp.Usage.PromptTokensDetails != nil {
		u.CachedTokens, u.HasCached = resp.Usage.PromptTokensDetails.CachedTokens, true
	}
	f.disp.Observe(chat.Model, req, d, u)
	return d, resp.Usage
}

// dryRun returns the decision for chat without sending it.
func (f *e2eFleet) dryRun(t *testing.T, chat openai.ChatCompletionRequest) Decision {
	t.Helper()
	body, _ := json.Marshal(chat)
	prompt, err := f.tok.TokenizeRequest(context.Background(), body)
	if err != nil {
		t.Fatal(err)
	}
	req := &Request{Model: chat.Model, PromptTokens: len(prompt.TokenIDs), BlockHashes: prompt.BlockHashes(16), BlockSize: 16}
	d, err := f.disp.Pick(context.Background(), req, f.cands)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestE2ERepeatedPromptReturns: with live KV events, and again with events off (approximate
// mode), a repeated long prompt goes back to the worker that served it, that worker reports
// the cached tokens the gateway predicted, and the load returns to zero.
func TestE2ERepeatedPromptReturns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts simulated workers")
	}
	tok, err := tokenize.Load(e2eModelDir, tokenize.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, events := range []bool{true, false} {
		mode := ModeApproximate
		if events {
			mode = ModeEvents
		}
		t.Run(mode, func(t *testing.T) {
			f := startE2EFleet(t, events, tok)
			for seed := range 3 {
				chat := longPrompt(seed, 300)
				d1, u1 := f.send(t, chat)
				if u1.PromptTokens < 1500 {
					t.Fatalf("prompt too short for the test: %d tokens", u1.PromptTokens)
				}
				if events {
					// Events are asynchronous: wait until the index shows all of the prompt's blocks
					// on the first worker.
					deadline := time.Now().Add(5 * time.Second)
					for {
						dd := f.dryRun(t, chat)
						row, _ := ChosenScore(dd)
						if row.Target == d1.Chosen.Target && row.G1Blocks == dd.PromptBlocks {
							break
						}
						if time.Now().After(deadline) {
							t.Fatalf("KV events never reached the index for %v", d1.Chosen.Target)
						}
						time.Sleep(10 * time.Millisecond)
					}
				}
				d2, u2 := f.send(t, chat)
				row, _ := ChosenScore(d2)
				if d2.Chosen.Target != d1.Chosen.Target {
					t.Fatalf("prompt %d: repeat went to %v, first to %v (%s)", seed, d2.Chosen.Target, d1.Chosen.Target, d2.Chosen.Reason)
				}
				if row.Mode != mode || row.G1Blocks != d2.PromptBlocks {
					t.Fatalf("prompt %d: chosen row mode %s g1 %d, want mode %s and all %d blocks on G1 (%s)",
						seed, row.Mode, row.G1Blocks, mode, d2.PromptBlocks, d2.Chosen.Reason)
				}
				want := PredictedCachedTokens(row.G1Blocks, 16, d2.PromptTokens)
				if u2.PromptTokensDetails == nil || u2.PromptTokensDetails.CachedTokens != want || want == 0 {
					t.Fatalf("prompt %d: worker reported %+v cached tokens, gateway predicted %d", seed, u2.PromptTokensDetails, want)
				}
				if u2.PromptTokens != d2.PromptTokens {
					t.Fatalf("worker counted %d prompt tokens, gateway %d", u2.PromptTokens, d2.PromptTokens)
				}
			}
			for _, c := range f.cands {
				if got := f.disp.Load().Load(c.Target); got != (TargetLoad{}) {
					t.Errorf("%v: load %+v after all requests ended", c.Target, got)
				}
			}
			if n := metricValue(t, f.disp.feedback.mismatches.WithLabelValues("qwen")); n != 0 {
				t.Errorf("%v tokenization mismatches", n)
			}
			// The scraper reads the workers' vLLM-format /metrics. (vllm:cache_config_info, which
			// carries num_gpu_blocks, is not asserted: the simulator does not export it yet.)
			deadline := time.Now().Add(3 * time.Second)
			for _, c := range f.cands {
				for {
					m, ok := f.disp.Load().Metrics(c.Target, time.Second)
					if ok {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%v: no fresh worker metrics (%+v)", c.Target, m)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
}
