package router

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router/latency"
	"github.com/kvgate/kvgate/tokenize"
)

// Saturation reads the gateway's own load, the worker's scraped waiting count moved forward by
// what was sent and started since, and the peer replicas' load; every change that may free
// capacity reaches the listeners.
func TestSaturationSimplePolicy(t *testing.T) {
	busy := KVConfig{BusyWaitingRequests: 2, BusyPrefillTokens: 1000}
	busy.MetricsMaxAge = DefaultKVConfig().MetricsMaxAge
	pol, err := New("round_robin", Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewDispatcher(DispatcherOptions{Policy: pol, Busy: busy})
	if err != nil {
		t.Fatal(err)
	}
	var changes atomic.Int64
	e.OnLoadChange(func() { changes.Add(1) })
	tg := tgt(0)
	steps := []struct {
		name       string
		do         func() *Handle
		wantBusy   bool
		wantWait   float64
		hasWaiting bool
		prefill    int
	}{
		{"idle, never scraped", nil, false, 0, false, 0},
		{"scraped: one waiting", func() *Handle { e.load.UpdateMetrics(tg, WorkerMetrics{Waiting: 1}); return nil }, false, 1, true, 0},
		{"one more sent since: two waiting", func() *Handle {
			return e.load.Begin(tg, &Request{PromptTokens: 10}, 0)
		}, true, 2, true, 10},
	}
	var h *Handle
	for _, s := range steps {
		if s.do != nil {
			if got := s.do(); got != nil {
				h = got
			}
		}
		sat := e.Saturation(tg)
		if sat.Busy != s.wantBusy || sat.Waiting != s.wantWait || sat.HasWaiting != s.hasWaiting || sat.PrefillTokens != s.prefill {
			t.Fatalf("%s: %+v", s.name, sat)
		}
		if sat.HasWait {
			t.Fatalf("%s: a simple policy predicted a wait", s.name)
		}
	}
	before := changes.Load()
	h.FirstToken()
	if sat := e.Saturation(tg); sat.Busy || sat.Waiting != 1 || sat.PrefillTokens != 0 {
		t.Fatalf("after the first token: %+v", sat)
	}
	h.Done()
	if got := changes.Load() - before; got != 2 {
		t.Fatalf("first token and end made %d load-change calls, want 2", got)
	}
	peers := NewPeerLoads(time.Minute)
	peers.ApplySnapshot("peer-1", 1, 1, []TargetLoadVector{{Target: tg, Load: LoadVector{PrefillTokens: 1500, PrefillRequests: 1, Requests: 1}}}, time.Now())
	e.SetFleet(Fleet{Peers: peers})
	if sat := e.Saturation(tg); !sat.Busy || sat.PrefillTokens != 1500 {
		t.Fatalf("a peer's prefill in flight is not seen: %+v", sat)
	}
	if sat := e.Saturation(tgt(1)); sat.Busy {
		t.Fatalf("another target is busy: %+v", sat)
	}
}

// Under kv the time model predicts the wait ahead of a new request: the prefill routed there
// and not yet past its first token.
func TestSaturationPredictedWait(t *testing.T) {
	p := newTestKV(t, PolicyKV, DefaultKVConfig(), KVDeps{}, nil)
	e, err := NewDispatcher(DispatcherOptions{KV: p})
	if err != nil {
		t.Fatal(err)
	}
	tg := tgt(0)
	if sat := e.Saturation(tg); !sat.HasWait || sat.WaitMs != 0 {
		t.Fatalf("idle target: %+v", sat)
	}
	hashes := make([]kvkey.BlockHash, 512) // 8,192 tokens
	for i := range hashes {
		hashes[i] = kvkey.BlockHash(i + 1)
	}
	_, life, err := e.Route(context.Background(), request(hashes), []Candidate{{Target: tg}})
	if err != nil {
		t.Fatal(err)
	}
	c := DefaultKVConfig().Latency
	own := c.PrefillMsPerToken*8192 + c.AttentionMsPerPair*8192*8192/2
	if sat := e.Saturation(tg); sat.WaitMs < own || sat.WaitMs > own+2*c.StepMs {
		t.Fatalf("wait behind an 8,192-token prefill = %v ms, want its prefill %v ms plus a step", sat.WaitMs, own)
	}
	life.FirstToken()
	if sat := e.Saturation(tg); sat.WaitMs != 0 {
		t.Fatalf("after its first token the wait is %v ms", sat.WaitMs)
	}
	life.Done()
}

// Gains prices each candidate's cached prefix (saved) and what the request adds to its TTFT
// there (own) by the time model: saved plus the prefill left is the whole prompt's prefill on
// every candidate, and own is that prefill with the engine steps it takes (idle targets: no
// queue, no decodes).
func TestGains(t *testing.T) {
	ix := indexers.NewIndex(indexers.Options{BlockSize: 16})
	tokens := promptTokens(7, 64*16)
	hashes := tokenize.BlockHashes(tokens, 16, tokenize.HashOptions{})
	ext := func(target int) func(int) uint64 { return func(b int) uint64 { return uint64(target)<<32 | uint64(b) } }
	cands := kvCands(3)
	for _, c := range cands {
		if err := ix.AddTarget(c.Target); err != nil {
			t.Fatal(err)
		}
	}
	storeBlocks(t, ix, tgt(0), indexers.MediumGPU, tokens, 0, 40, ext(0))
	storeBlocks(t, ix, tgt(1), indexers.MediumGPU, tokens, 0, 10, ext(1))
	p := newTestKV(t, PolicyKV, DefaultKVConfig(), KVDeps{Matcher: ix}, nil)
	e, err := NewDispatcher(DispatcherOptions{KV: p})
	if err != nil {
		t.Fatal(err)
	}
	saved, own := e.Gains(context.Background(), request(hashes), cands)
	th := e.thetaOf(tgt(0))
	whole := latency.PrefillMs(th, 64*16, 0)
	for i, cached := range []float64{40 * 16, 10 * 16, 0} {
		tg := tgt(i)
		if want := latency.PrefillMs(th, cached, 0); math.Abs(saved[tg]-want) > 1e-9 {
			t.Errorf("target %d: saved %v ms, want %v (%v cached tokens)", i, saved[tg], want, cached)
		}
		left := latency.PrefillMs(th, 64*16-cached, cached)
		if math.Abs(saved[tg]+left-whole) > 1e-6 {
			t.Errorf("target %d: saved %v ms and the %v ms left are not the whole prompt's %v", i, saved[tg], left, whole)
		}
		req := latency.Req{Uncached: 64*16 - cached, Cached: cached}
		want := latency.PredictTTFT(th, p.timed.params, latency.State{}, req).TotalMs -
			latency.PredictTTFT(th, p.timed.params, latency.State{}, latency.Req{}).TotalMs
		if math.Abs(own[tg]-want) > 1e-9 || own[tg] <= left {
			t.Errorf("target %d: own %v ms, want %v (its prefill %v plus its steps)", i, own[tg], want, left)
		}
	}
}
