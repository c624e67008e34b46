package router

import (
	"math"
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
	// mark is the target's cumulative routed prefill right after the leader's was added: what
	// was routed there since is queued behind the leader (holdCostOf).
	mark routedMark
	// Written before doneCh closes.
	computed bool

	// The followers held on this prefill now, and their uncached suffixes (tokens, attention
	// pairs): released together, they queue on target beside each other. Under holdTable.mu.
	held                  int
	heldTokens, heldPairs float64
}

// routedMark is a reading of a target's cumulative routed prefill tallies (targetTime).
type routedMark struct {
	tokens, pairs int64
	ok            bool // the time model tracks the target
}

// leaderView is what a follower reads of its leader (holdTable.snapshot).
type leaderView struct {
	routed   bool
	target   kvkey.Target
	begun    time.Time
	predMs   float64
	mark     routedMark
	done     bool
	computed bool
	// held, heldTokens and heldPairs are the other followers held now (prefill).
	held                  int
	heldTokens, heldPairs float64
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

// peek returns the prefill in flight that shares at least min blocks with hashes, or nil; it
// registers nothing.
func (h *holdTable) peek(hashes []kvkey.BlockHash) *prefill {
	if len(hashes) < h.min {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.byKey[hashes[h.min-1]]
}

// route records the leader's target, predicted TTFT and the target's routed tallies after it,
// and wakes the followers waiting for it.
func (h *holdTable) route(pf *prefill, t kvkey.Target, predMs float64, mark routedMark) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if pf.routed || isClosed(pf.routedCh) {
		return
	}
	pf.routed, pf.target, pf.predMs, pf.mark = true, t, predMs, mark
	close(pf.routedCh)
}

// join counts a follower held on pf with its uncached suffix; the returned leave undoes it
// (once).
func (h *holdTable) join(pf *prefill, tokens, pairs float64) (leave func()) {
	h.mu.Lock()
	pf.held++
	pf.heldTokens += tokens
	pf.heldPairs += pairs
	h.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			pf.held--
			pf.heldTokens = math.Max(pf.heldTokens-tokens, 0)
			pf.heldPairs = math.Max(pf.heldPairs-pairs, 0)
			h.mu.Unlock()
		})
	}
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

// snapshot returns the leader's routing state (after routedCh closed), whether its prefix is
// computed yet, and the followers held on it.
func (h *holdTable) snapshot(pf *prefill) leaderView {
	h.mu.Lock()
	defer h.mu.Unlock()
	return leaderView{routed: pf.routed, target: pf.target, begun: pf.begun, predMs: pf.predMs, mark: pf.mark,
		done: isClosed(pf.doneCh), computed: pf.computed, held: pf.held, heldTokens: pf.heldTokens, heldPairs: pf.heldPairs}
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
