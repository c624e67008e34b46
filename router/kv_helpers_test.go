package router

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/sessions"
)

// fixedMatcher answers every match with a fixed tier match per target (cost-function tests).
type fixedMatcher map[kvkey.Target]indexers.TierMatch

func (m fixedMatcher) MatchTiers(_ []kvkey.BlockHash, targets []kvkey.Target, out []indexers.TierMatch) {
	for i, t := range targets {
		out[i] = m[t]
	}
}

// fixedHints returns the same hints for every session.
type fixedHints []sessions.Hint

func (h fixedHints) Hints(string, string) []sessions.Hint { return h }

// fakeClock is a settable clock for TTL and staleness tests.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func tgt(i int) kvkey.Target {
	return kvkey.Target{Worker: "http://127.0.0.1:81" + string(rune('0'+i/10)) + string(rune('0'+i%10)), DPRank: 0}
}

func kvCands(n int) []Candidate {
	out := make([]Candidate, n)
	for i := range out {
		out[i] = Candidate{Target: tgt(i)}
	}
	return out
}

// chain returns n distinct block hashes standing for one prompt's chain; base separates prompts.
func chain(base uint64, n int) []kvkey.BlockHash {
	h := make([]kvkey.BlockHash, n)
	for i := range h {
		h[i] = kvkey.BlockHash(base<<32 | uint64(i+1))
	}
	return h
}

func request(hashes []kvkey.BlockHash) *Request {
	return &Request{Model: "m", PromptTokens: len(hashes) * 16, BlockHashes: hashes, BlockSize: 16}
}

// newTestKV builds a kv policy with a deterministic random source and a fake clock.
func newTestKV(t testing.TB, name string, cfg KVConfig, deps KVDeps, clk *fakeClock) *KVPolicy {
	t.Helper()
	var p *KVPolicy
	var err error
	switch name {
	case PolicyKVNoLoad:
		p, err = NewKVNoLoad(cfg, deps)
	case PolicyKVBlocks:
		p, err = NewKVBlocks(cfg, deps)
	default:
		p, err = NewKV(cfg, deps)
	}
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	p.float = r.Float64
	if clk != nil {
		p.now = clk.now
		p.load.now = clk.now
	}
	return p
}

// js renders a decision or row as JSON for failure messages (%+v would print only the embedded
// Target's String()).
func js(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// pickAndBegin is Pick followed by Begin, the two steps the server takes for a proxied request.
func pickAndBegin(ctx context.Context, e *Dispatcher, req *Request, candidates []Candidate) (Decision, *Handle, error) {
	d, err := e.Pick(ctx, req, candidates)
	if err != nil {
		return Decision{}, nil, err
	}
	return d, e.begin(d, req), nil
}
