package router

import (
	"context"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router/latency"
)

// Retention is what the gateway's cache protection (flow_control.protect_cache, server/flow.go)
// reads of the routing side: how far LRU eviction on a target has come toward a prompt routed
// there, and what a request's prefill adds on each target. *Dispatcher implements it under
// the kv policy with its working sets on (router.latency's evict, overflow or queue-loss
// weight); ok is false otherwise.
type Retention interface {
	// PromptMark is the key under which a target's working set ages a prompt of hashes (its
	// deepest sampled key).
	PromptMark(hashes []kvkey.BlockHash) (kvkey.BlockHash, bool)
	// Retained is, on t, how many distinct blocks were routed after the prompt marked m was
	// last routed there (an LRU cache keeps those ahead of it), and t's KV capacity in
	// blocks (its last reported num_gpu_blocks; 0 when unknown). ok is false when m is not in
	// t's working set: routed elsewhere since, or older than router.approximate.ttl.
	Retained(t kvkey.Target, m kvkey.BlockHash) (newer, capacity float64, ok bool)
	// Need is Gains and, for each candidate, the KV blocks the request moves ahead of the
	// prompts routed there before it in LRU order: every block of its prompt (a cached block
	// it reuses is touched, so it is no longer evicted before them; an uncached one is
	// allocated). nil maps when the policy does not see the cache.
	Need(ctx context.Context, req *Request, cands []Candidate) (gain, newBlocks map[kvkey.Target]float64)
}

var _ Retention = (*Dispatcher)(nil)

// worksetOf is the dispatcher's working sets, nil when it keeps none.
func (e *Dispatcher) worksetOf() *workingSets {
	if e.kv == nil || e.kv.timed == nil {
		return nil
	}
	return e.kv.timed.workset
}

// markPos is the position of the working-set key newerThanPrefix ages a prefix of n blocks by.
func markPos(n int) int {
	p := n - 1
	if p >= heldExact {
		p = heldExact - 1 + (p-heldExact+1)/heldStride*heldStride
	}
	return p
}

// PromptMark implements Retention.
func (e *Dispatcher) PromptMark(hashes []kvkey.BlockHash) (kvkey.BlockHash, bool) {
	if e.worksetOf() == nil || len(hashes) == 0 {
		return 0, false
	}
	return hashes[markPos(len(hashes))], true
}

// Retained implements Retention.
func (e *Dispatcher) Retained(t kvkey.Target, m kvkey.BlockHash) (newer, capacity float64, ok bool) {
	ws := e.worksetOf()
	if ws == nil {
		return 0, 0, false
	}
	s := ws.targets.get(t)
	if s == nil {
		return 0, 0, false
	}
	s.mu.Lock()
	k, in := s.seen[m]
	if in {
		newer = float64(s.ages.after(k.at / ws.width))
	}
	s.mu.Unlock()
	if !in {
		return 0, 0, false
	}
	if tl := e.load.get(t); tl != nil {
		if wm := tl.metrics.Load(); wm != nil {
			capacity = float64(wm.NumGPUBlocks)
		}
	}
	return newer, capacity, true
}

// Need implements Retention: one read-only scoring gives both the gains (as Gains) and the
// cached blocks.
func (e *Dispatcher) Need(ctx context.Context, req *Request, cands []Candidate) (gain, newBlocks map[kvkey.Target]float64) {
	if e.kv == nil || len(cands) == 0 {
		return nil, nil
	}
	d, err := e.kv.Pick(ctx, req, cands)
	if err != nil {
		return nil, nil
	}
	cfg := e.kv.Config()
	bs := float64(blockSizeOf(req))
	blocks := float64(len(req.BlockHashes))
	gain = make(map[kvkey.Target]float64, len(d.Candidates))
	newBlocks = make(map[kvkey.Target]float64, len(d.Candidates))
	for _, c := range d.Candidates {
		cached := (float64(c.G1Blocks) + cfg.G2Credit*float64(c.G2Blocks) + cfg.G3Credit*float64(c.G3Blocks)) * bs
		cached = min(cached, float64(req.PromptTokens))
		th := e.thetaOf(c.Target)
		gain[c.Target] = th[latency.FTokens]*cached + th[latency.FPairs]*cached*cached/2
		newBlocks[c.Target] = blocks
	}
	return gain, newBlocks
}
