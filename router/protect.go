package router

import (
	"github.com/kvgate/kvgate/kvkey"
)

// Retention is what the gateway's cache protection (flow_control.protect_cache,
// server/flow_protect.go) reads of the routing side: how far LRU eviction on a target has
// come toward a prompt routed there. *Dispatcher implements it under the kv policy with its
// working sets on (router.latency's evict, overflow or queue-loss weight); ok is false
// otherwise.
type Retention interface {
	// PromptMark is the key under which a target's working set ages a prompt of hashes (its
	// deepest sampled key).
	PromptMark(hashes []kvkey.BlockHash) (kvkey.BlockHash, bool)
	// Retained is, on t, how many distinct blocks were routed after the prompt marked m was
	// last routed there (an LRU cache keeps those ahead of it), and t's KV capacity in
	// blocks (its last reported num_gpu_blocks; 0 when unknown). ok is false when m is not in
	// t's working set: routed elsewhere since, or older than router.approximate.ttl.
	Retained(t kvkey.Target, m kvkey.BlockHash) (newer, capacity float64, ok bool)
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
