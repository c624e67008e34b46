package router

import (
	"sync"
	"time"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
)

// The approximate index is read only for targets whose KV events are not healthy. Recording
// every routed prompt into it (about 0.4 µs per block, so ~1 ms for a 2,048-block prompt)
// would be wasted work for the others, so the kv policy records a prompt there only when the
// chosen target is scored approximately already. For a healthy target it keeps the prompt in
// a small per-target ring instead (a slice reference and a time, no per-block work); when that
// target's events stop being healthy, the first decision that scores it approximately moves
// the ring's prompts that are still within the approximate TTL into the index, oldest first,
// so the target's recent prefixes still count as cached.

// recentPrompts is how many routed prompts the ring keeps per target, and recentBlocks how
// many of their blocks at most (older prompts leave first).
const (
	recentPrompts = 32
	recentBlocks  = 1 << 16
)

// recentRing is one target's recently routed prompts (oldest first from head).
type recentRing struct {
	mu     sync.Mutex
	hashes [recentPrompts][]kvkey.BlockHash
	at     [recentPrompts]time.Time
	head   int
	n      int
	blocks int
}

// recentRoutes keeps a ring per target; targets beyond maxTimedTargets are not kept (their
// prompts are recorded into the approximate index directly, as before).
type recentRoutes struct {
	rings *perTarget[recentRing]
}

func newRecentRoutes() *recentRoutes {
	return &recentRoutes{rings: newPerTarget[recentRing]()}
}

// add keeps hashes (not copied: like LoadTracker.Begin, the caller must not modify them) as
// routed to t at now; false when t has no ring (the caller records it directly).
func (rr *recentRoutes) add(t kvkey.Target, hashes []kvkey.BlockHash, now time.Time) bool {
	r := rr.rings.getOrCreate(t, func() *recentRing { return &recentRing{} })
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == recentPrompts {
		r.drop()
	}
	i := (r.head + r.n) % recentPrompts
	r.hashes[i], r.at[i] = hashes, now
	r.n++
	r.blocks += len(hashes)
	for r.blocks > recentBlocks && r.n > 1 {
		r.drop()
	}
	return true
}

// drop removes the oldest prompt; the caller holds r.mu and r.n > 0.
func (r *recentRing) drop() {
	r.blocks -= len(r.hashes[r.head])
	r.hashes[r.head] = nil
	r.head = (r.head + 1) % recentPrompts
	r.n--
}

// pending reports whether t's ring holds prompts (a cheap check for the scoring path).
func (rr *recentRoutes) pending(t kvkey.Target) bool {
	r := rr.rings.get(t)
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n > 0
}

// flush moves t's ring into the approximate index: the prompts routed since cutoff, oldest
// first (so the newest ends up most recent), and empties it.
func (rr *recentRoutes) flush(t kvkey.Target, approx *indexers.ApproxIndex, cutoff time.Time) {
	r := rr.rings.get(t)
	if r == nil {
		return
	}
	var take [recentPrompts][]kvkey.BlockHash
	k := 0
	r.mu.Lock()
	for r.n > 0 {
		if !r.at[r.head].Before(cutoff) {
			take[k] = r.hashes[r.head]
			k++
		}
		r.drop()
	}
	r.mu.Unlock()
	for _, h := range take[:k] {
		approx.Record(t, h)
	}
}

// forget drops t's ring (its worker may have restarted with an empty cache).
func (rr *recentRoutes) forget(t kvkey.Target) { rr.rings.forget(t) }
