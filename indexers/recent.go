package indexers

import "github.com/kvgate/kvgate/kvkey"

// DefaultRecentlyRemoved is how many removed worker block hashes each target remembers by
// default (Options.RecentlyRemoved): 128 KiB per target that has seen removals.
const DefaultRecentlyRemoved = 4096

// removedBlock is what the index remembers of a worker hash whose last reference went away: our
// hash and its parent's, enough to re-create the node (with its chain position, which keeps the
// orphan accounting exact) without token ids.
type removedBlock struct {
	our, parentOur kvkey.BlockHash
	hasParent      bool
}

// recentRemoved is a bounded memory of recently removed worker hashes. vLLM's CPU offload announces
// a block's host copy with a token-less BlockStored (vLLM's offloading connector) that can arrive
// after the GPU copy was evicted and its BlockRemoved applied; without this memory such a store
// could not be resolved to our hash and was dropped as unresolved_hash.
//
// It is a two-way set-associative cache rather than a map with an LRU list: recording is on the
// removal hot path, and an array slot write costs far less than map inserts and deletes. Each
// hash maps to one pair of slots (one cache line) and evicts the older of the two, so it keeps
// the most recent removals, approximately: a hash can be evicted early by two newer ones that
// share its pair. With a single pair (capacity ≤ 2) it is an exact LRU.
type recentRemoved struct {
	slots []removedSlot // 2 per pair; pairs is a power of two
	shift uint          // 64 − log2(pairs)
	gen   uint64
}

type removedSlot struct {
	ext            kvkey.EngineHash
	our, parentOur kvkey.BlockHash
	tag            uint64 // generation<<1 | hasParent; 0 = empty
}

// record remembers ext (capacity > 0), evicting the older entry of its pair when both are used.
func (r *recentRemoved) record(capacity int, ext kvkey.EngineHash, b removedBlock) {
	if capacity <= 0 {
		return
	}
	if r.slots == nil {
		pairs := 1
		for 2*pairs < capacity {
			pairs *= 2
		}
		r.slots = make([]removedSlot, 2*pairs)
		r.shift = 64
		for p := pairs; p > 1; p /= 2 {
			r.shift--
		}
	}
	r.gen++
	tag := r.gen << 1
	if b.hasParent {
		tag |= 1
	}
	i := r.pair(ext)
	w := &r.slots[i]
	switch o := &r.slots[i+1]; {
	case w.tag != 0 && w.ext == ext:
	case o.tag != 0 && o.ext == ext:
		w = o
	case w.tag == 0:
	case o.tag == 0 || o.tag < w.tag:
		w = o
	}
	*w = removedSlot{ext: ext, our: b.our, parentOur: b.parentOur, tag: tag}
}

// pair returns the index of ext's first slot (Fibonacci hashing: vLLM's hashes are random, but
// tests and other producers use small integers).
func (r *recentRemoved) pair(ext kvkey.EngineHash) int {
	if r.shift == 64 {
		return 0
	}
	return int((ext*0x9e3779b97f4a7c15)>>r.shift) * 2
}

// take returns and forgets ext's entry.
func (r *recentRemoved) take(ext kvkey.EngineHash) (removedBlock, bool) {
	if r.slots == nil {
		return removedBlock{}, false
	}
	i := r.pair(ext)
	for j := i; j < i+2; j++ {
		if s := &r.slots[j]; s.tag != 0 && s.ext == ext {
			b := removedBlock{our: s.our, parentOur: s.parentOur, hasParent: s.tag&1 != 0}
			s.tag = 0
			return b, true
		}
	}
	return removedBlock{}, false
}

// len returns the number of remembered hashes.
func (r *recentRemoved) len() int {
	n := 0
	for i := range r.slots {
		if r.slots[i].tag != 0 {
			n++
		}
	}
	return n
}

// reset forgets everything.
func (r *recentRemoved) reset() { clear(r.slots) }
