package router

import (
	"sort"
	"sync"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// maxPrefills bounds the in-flight prefills the hold table tracks; a request that finds the
// table full is routed as if no prefix were in flight (the table empties as first tokens come).
const maxPrefills = 4096

// holdTable is the pure core of the sibling hold: the prefills in flight (routed, before their
// first token) whose prompt has at least min blocks, keyed by the chained hash of block min−1.
// Chained hashes make "shares the first min blocks" an equality of that one hash, so a lookup
// is one map probe; how far two such prompts agree beyond that is a binary search (equality at
// block i is prefix-closed in i). The table never waits: the waiting edge is Dispatcher.follow.
// Its mutex is a leaf: nothing else is locked while it is held.
type holdTable struct {
	min int

	mu    sync.Mutex
	byKey map[kvkey.BlockHash]*prefill
}

// prefill is one request being prefilled, as its followers see it. The channels are closed
// once each, under holdTable.mu; the fields they announce are written before the close.
type prefill struct {
	key    kvkey.BlockHash
	hashes []kvkey.BlockHash
	begun  time.Time // when the leader claimed the prefix

	routedCh chan struct{} // closed once the leader's target is known, or it gave up
	doneCh   chan struct{} // closed at the leader's first token, or when it ended without one

	// Written before routedCh closes.
	routed bool
	target kvkey.Target
	predMs float64 // the leader's predicted TTFT at routing
	// Written before doneCh closes.
	computed bool
}

func newHoldTable(minBlocks int) *holdTable {
	return &holdTable{min: max(minBlocks, 1), byKey: make(map[kvkey.BlockHash]*prefill)}
}

// claim returns the prefill in flight that shares at least min blocks with hashes (leader
// false), or registers hashes as a new one and returns it with leader true. It returns nil when
// the prompt is shorter than min blocks or the table is full.
func (h *holdTable) claim(hashes []kvkey.BlockHash, now time.Time) (pf *prefill, leader bool) {
	if len(hashes) < h.min {
		return nil, false
	}
	key := hashes[h.min-1]
	h.mu.Lock()
	defer h.mu.Unlock()
	if pf := h.byKey[key]; pf != nil {
		return pf, false
	}
	if len(h.byKey) >= maxPrefills {
		return nil, false
	}
	pf = &prefill{key: key, hashes: hashes, begun: now, routedCh: make(chan struct{}), doneCh: make(chan struct{})}
	h.byKey[key] = pf
	return pf, true
}

// route records the leader's target and predicted TTFT and wakes the followers waiting for it.
func (h *holdTable) route(pf *prefill, t kvkey.Target, predMs float64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if pf.routed || isClosed(pf.routedCh) {
		return
	}
	pf.routed, pf.target, pf.predMs = true, t, predMs
	close(pf.routedCh)
}

// finish ends the leader's prefill: computed when its first token came, false when it ended
// (failed, cancelled, never routed) without one. It is idempotent; the first call wins.
func (h *holdTable) finish(pf *prefill, computed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if isClosed(pf.doneCh) {
		return
	}
	if h.byKey[pf.key] == pf {
		delete(h.byKey, pf.key)
	}
	if !isClosed(pf.routedCh) {
		close(pf.routedCh)
	}
	pf.computed = computed
	close(pf.doneCh)
}

// expire finishes, as not computed, every prefill claimed before cutoff (a safety net against a
// leader whose Lifecycle never ends); it returns how many.
func (h *holdTable) expire(cutoff time.Time) int {
	h.mu.Lock()
	var stale []*prefill
	for _, pf := range h.byKey {
		if pf.begun.Before(cutoff) {
			stale = append(stale, pf)
		}
	}
	h.mu.Unlock()
	for _, pf := range stale {
		h.finish(pf, false)
	}
	return len(stale)
}

// len returns how many prefills are tracked.
func (h *holdTable) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.byKey)
}

// snapshot returns the leader's routing state (after routedCh closed) and whether its prefix
// is computed yet.
func (h *holdTable) snapshot(pf *prefill) (routed bool, t kvkey.Target, begun time.Time, predMs float64, done, computed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return pf.routed, pf.target, pf.begun, pf.predMs, isClosed(pf.doneCh), pf.computed
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// sharedBlocks returns how many leading blocks a and b share (chained hashes: equal at i means
// equal up to i).
func sharedBlocks(a, b []kvkey.BlockHash) int {
	n := min(len(a), len(b))
	return sort.Search(n, func(i int) bool { return a[i] != b[i] })
}

// holdDeadline is how long a follower may still wait: the leader's predicted TTFT left since it
// was routed, plus margin (never negative).
func holdDeadline(begun time.Time, predMs float64, margin time.Duration, now time.Time) time.Duration {
	left := begun.Add(time.Duration(predMs * float64(time.Millisecond))).Sub(now)
	return max(left, 0) + margin
}
