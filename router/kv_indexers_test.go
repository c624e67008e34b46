package router

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/tokenize"
)

// promptTokens returns n deterministic pseudo-random token ids; seed separates prompts.
func promptTokens(seed uint32, n int) []uint32 {
	out := make([]uint32, n)
	x := seed*2654435761 + 1
	for i := range out {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		out[i] = x % 150000
	}
	return out
}

// storeBlocks announces blocks [from, to) of tokens (block size 16) on target t in the given
// medium, as vLLM would: one BlockStored whose parent is block from−1. ext gives the worker's
// opaque hash of a block index.
func storeBlocks(tb testing.TB, ix *indexers.Index, t kvkey.Target, medium string, tokens []uint32, from, to int, ext func(int) uint64) {
	tb.Helper()
	e := &indexers.BlockStored{
		TokenIDs:  tokens[from*16 : to*16],
		BlockSize: 16,
		Medium:    indexers.Some(medium),
	}
	for b := from; b < to; b++ {
		e.BlockHashes = append(e.BlockHashes, indexers.IntHash(ext(b)))
	}
	if from > 0 {
		e.ParentBlockHash = indexers.Some(indexers.IntHash(ext(from - 1)))
	}
	if err := ix.Apply(t, &indexers.EventBatch{Events: []indexers.Event{e}}); err != nil {
		tb.Fatal(err)
	}
}

// TestIndexAsMatcher: the real index (indexers.Matcher) maps its tiered overlaps onto the candidates, and
// the kv policy routes by them.
func TestIndexAsMatcher(t *testing.T) {
	ix := indexers.NewIndex(indexers.Options{BlockSize: 16})
	tokens := promptTokens(7, 64*16)
	hashes := tokenize.BlockHashes(tokens, 16, tokenize.HashOptions{})
	ext := func(target int) func(int) uint64 { return func(b int) uint64 { return uint64(target)<<32 | uint64(b) } }
	storeBlocks(t, ix, tgt(0), indexers.MediumGPU, tokens, 0, 40, ext(0))
	storeBlocks(t, ix, tgt(1), indexers.MediumGPU, tokens, 0, 10, ext(1))
	storeBlocks(t, ix, tgt(1), indexers.MediumCPU, tokens, 10, 60, ext(1))
	storeBlocks(t, ix, tgt(2), indexers.MediumDisk, tokens, 0, 64, ext(2))
	for _, n := range []int{4, 40} { // both MatchTiers paths: linear scan and map
		cs := kvCands(n)
		targets := make([]kvkey.Target, n)
		for i, c := range cs {
			targets[i] = c.Target
		}
		out := make([]indexers.TierMatch, n)
		ix.MatchTiers(hashes, targets, out)
		want := []indexers.TierMatch{{G1: 40}, {G1: 10, G2: 50}, {G3: 64}, {}}
		for i := range want {
			if out[i] != want[i] {
				t.Fatalf("n=%d target %d: %+v, want %+v", n, i, out[i], want[i])
			}
		}
		p, err := NewKVBlocks(DefaultKVConfig(), KVDeps{Matcher: ix})
		if err != nil {
			t.Fatal(err)
		}
		// Costs: 64−40 = 24; 64−10−37.5 = 16.5; 64−16 = 48; 64.
		d, err := p.Pick(context.Background(), request(hashes), cs)
		if err != nil {
			t.Fatal(err)
		}
		if d.Chosen.Target != tgt(1) || d.Candidates[0].Cost != 24 || d.Candidates[1].Cost != 16.5 {
			t.Fatalf("n=%d: %s", n, js(d))
		}
	}
}

// TestSubscriberHealth: a subscription is trusted once its SUB is connected to a live PUB; one
// whose publisher is unreachable (connecting), a stopped one and an unknown target are scored
// in approximate mode.
func TestSubscriberHealth(t *testing.T) {
	mgr, err := indexers.NewSubscribers(indexers.NewIndex(indexers.Options{}), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); _ = mgr.Close() }()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	pub, err := zctx.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	_ = pub.SetLinger(0)
	if err := pub.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := pub.GetLastEndpoint()
	// A port that was free a moment ago: nobody publishes there.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("tcp://%s", l.Addr())
	_ = l.Close()

	h := SubscriberHealth(mgr)
	live, down := tgt(0), tgt(1)
	for tg, e := range map[kvkey.Target]string{live: ep, down: dead} {
		if err := mgr.Start(ctx, indexers.SubscriberConfig{Target: tg, Endpoint: e}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for !h.EventsHealthy(live) {
		if time.Now().After(deadline) {
			t.Fatal("connected subscription never reported healthy")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if h.EventsHealthy(down) || h.EventsHealthy(tgt(2)) {
		t.Fatal("unreachable publisher or unknown target reported healthy")
	}
	mgr.Stop(live, false)
	if h.EventsHealthy(live) {
		t.Fatal("stopped subscription reported healthy")
	}
}

// TestBeginNotesRoutedPrompt: beginning a request on a target hands the request's hashes to
// the event index, so a store the chosen worker makes after the index lost its parent (a reset)
// is placed under the routed prompt instead of being dropped.
func TestBeginNotesRoutedPrompt(t *testing.T) {
	tokens := promptTokens(7, 6*16)
	local := tokenize.LocalHashes(tokens, 16, tokenize.HashOptions{})
	seq := tokenize.SequenceHashes(local)
	tests := []struct {
		name      string
		local     []uint64
		recovered int64
		wantG1    int
	}{
		{"with local hashes", local, 1, 6},
		{"without local hashes", nil, 0, 0},
		{"misaligned local hashes", local[:3], 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := indexers.NewIndex(indexers.Options{BlockSize: 16})
			cands := kvCands(2)
			for _, c := range cands {
				if err := ix.AddTarget(c.Target); err != nil {
					t.Fatal(err)
				}
			}
			p := newTestKV(t, PolicyKV, DefaultKVConfig(), KVDeps{Matcher: ix}, nil)
			req := request(seq)
			req.LocalHashes = tc.local
			d, err := p.Pick(context.Background(), req, cands)
			if err != nil {
				t.Fatal(err)
			}
			p.Begin(d, req).Done()
			chosen := d.Chosen.Target
			ix.Reset(chosen)
			// The worker stores blocks 4 and 5; block 3 (its parent) was stored before the reset.
			storeBlocks(t, ix, chosen, indexers.MediumGPU, tokens, 4, 6, func(b int) uint64 { return uint64(500 + b) })
			if rec, _ := ix.ChainRecoveries(chosen); rec != tc.recovered {
				t.Fatalf("%d recoveries, want %d", rec, tc.recovered)
			}
			out := make([]indexers.TierMatch, len(cands))
			ix.MatchTiers(seq, []kvkey.Target{chosen}, out[:1])
			if out[0].G1 != tc.wantG1 {
				t.Fatalf("G1 %d, want %d", out[0].G1, tc.wantG1)
			}
		})
	}
}
