package sim_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/sim"
)

// TestGatewayIndexSeesSimCache connects the gateway's real subscriber and index to a simulated
// worker and checks that the index follows the worker's cache: a prompt's blocks served before
// the subscription started appear in G1 (through the join replay, with no further request), and
// after the GPU evicts them into the host tier (token-less CPU
// placeholder events) they are found in G2 — with the simulator's ids equal to kvgate's keys,
// and with vLLM-like opaque ids that the index must map.
func TestGatewayIndexSeesSimCache(t *testing.T) {
	for _, opaque := range []bool{false, true} {
		t.Run(fmt.Sprintf("opaque=%v", opaque), func(t *testing.T) { testGatewayIndex(t, opaque) })
	}
}

func testGatewayIndex(t *testing.T, opaque bool) {
	w, err := sim.New(sim.Options{ServedModelName: "m", Speedup: 1000, NumGPUBlocks: 8, NumCPUBlocks: 16,
		Encoding: sim.EventEncoding{OpaqueHashes: opaque, HashSeed: 42},
		KVEvents: sim.KVEventsConfig{EnableKVCacheEvents: true, Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", Topic: "kv"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(w.Handler())
	defer func() {
		srv.Close()
		_ = w.Close()
	}()
	ix := indexers.NewIndex(indexers.Options{BlockSize: 16})
	mgr, err := indexers.NewSubscribers(ix, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	ep := w.EventEndpoints()[0]
	target := kvkey.Target{Worker: srv.URL}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	words := func(prefix string, n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "%s%d ", prefix, i)
		}
		return b.String()
	}
	promptA := words("a", 40) // 40 tokens with the word tokenizer: 2 full blocks
	send := func(prompt string) {
		t.Helper()
		body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1}`, prompt)
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	hashesA := func() []kvkey.BlockHash {
		resp, err := http.Post(srv.URL+"/tokenize", "application/json", strings.NewReader(fmt.Sprintf(`{"prompt":%q}`, promptA)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var tr struct{ Tokens []uint32 }
		if err := json.NewDecoder(resp.Body).Decode(&tr); err != nil {
			t.Fatal(err)
		}
		return kvkey.BlockHashes(tr.Tokens, 16, kvkey.HashOptions{})
	}()
	waitFor := func(what string, ok func(indexers.Overlap) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		var last indexers.Overlap
		for time.Now().Before(deadline) {
			last = indexers.Overlap{}
			for _, o := range ix.Match(hashesA) {
				if o.Target == target {
					last = o
				}
			}
			if ok(last) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("%s: index shows %+v", what, last)
	}
	// A is served before the gateway subscribes: its events reach nobody live and are only in
	// the worker's replay ring, which the subscriber reads as soon as it connects.
	send(promptA)
	if err := mgr.Start(ctx, indexers.SubscriberConfig{Target: target, Endpoint: ep.Endpoint, ReplayEndpoint: ep.Replay, Topic: "kv"}); err != nil {
		t.Fatal(err)
	}
	waitFor("after A", func(o indexers.Overlap) bool { return o.G1 == 2 && o.G2 == 0 })
	send(words("c", 100)) // needs 7 blocks: every block of A is evicted to the host tier
	waitFor("after eviction", func(o indexers.Overlap) bool { return o.G1 == 0 && o.G2 == 2 })
}
