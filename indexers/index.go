package indexers

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/kvgate/kvgate/kvkey"
)

// MaxTargets is how many worker+rank targets one Index can hold (a fixed-width bitset per block
// keeps Match allocation-free).
const MaxTargets = 128

// numShards splits the global block table so writers of different targets rarely meet.
const numShards = 64

// ErrTooManyTargets is returned when more than MaxTargets targets are registered.
var ErrTooManyTargets = errors.New("indexers: too many targets")

// tset is a bitset over target slots.
type tset [MaxTargets / 64]uint64

func (s *tset) set(i int)         { s[i>>6] |= 1 << (i & 63) }
func (s *tset) clear(i int)       { s[i>>6] &^= 1 << (i & 63) }
func (s tset) has(i int) bool     { return s[i>>6]&(1<<(i&63)) != 0 }
func (s tset) empty() bool        { return s == tset{} }
func (s tset) and(o tset) tset    { return tset{s[0] & o[0], s[1] & o[1]} }
func (s tset) andNot(o tset) tset { return tset{s[0] &^ o[0], s[1] &^ o[1]} }

// each calls fn for every slot in s.
func (s tset) each(fn func(int)) {
	for w, x := range s {
		for x != 0 {
			b := bits.TrailingZeros64(x)
			fn(w*64 + b)
			x &= x - 1
		}
	}
}

// gentry is one block's residency: in[k] holds the targets where the block is in G1..G(k+1),
// i.e. in[0] = GPU, in[1] = GPU or host, in[2] = any tier. Nesting the sets this way makes
// "how far can G2/G3 extend the match" a plain leading-run question per set.
type gentry struct{ in [numTiers]tset }

// Options configure an Index.
type Options struct {
	// BlockSize is the token block size the gateway hashes requests with (vLLM --block-size).
	// Stores whose block_size differs are dropped and counted. Default 16.
	BlockSize int
	// MaxBlocksPerTarget caps the distinct blocks tracked per target; stores beyond it are
	// dropped and counted. Default 1,048,576 (≈190 MiB at BytesPerBlock).
	MaxBlocksPerTarget int
	// RecentlyRemoved is how many removed worker block hashes each target remembers, so that a
	// token-less CPU/disk store arriving after the GPU copy's removal still resolves (docs/ARCHITECTURE.md,
	// "KV-event wire format"). Default DefaultRecentlyRemoved; negative disables.
	RecentlyRemoved int
	// RoutedBlocks is how many blocks of recently routed prompts (NoteRouted) each target
	// remembers, whole prompts least recently routed out first, to recover the chain of a store
	// whose parent is unknown. Default DefaultRoutedBlocks; negative disables.
	RoutedBlocks int
}

// Index is the tiered block index over all targets. Reads (Match, IsResidentG1, DeepestG1)
// are safe from any goroutine; writes for one target are serialised by that target's lock.
type Index struct {
	opt   Options
	table blockTable

	regMu sync.Mutex               // serialises registry changes
	reg   atomic.Pointer[registry] // copy-on-write registry read lock-free by queries

	ovPool  sync.Pool // *[]Overlap: MatchTiers results, reused
	posPool sync.Pool // map[kvkey.Target]int: target → position in MatchTiers' targets, reused
}

type registry struct {
	byTarget map[kvkey.Target]*targetState
	bySlot   [MaxTargets]*targetState
	live     tset
}

// NewIndex returns an empty index.
func NewIndex(opt Options) *Index {
	if opt.BlockSize <= 0 {
		opt.BlockSize = 16
	}
	if opt.MaxBlocksPerTarget <= 0 {
		opt.MaxBlocksPerTarget = 1 << 20
	}
	if opt.RecentlyRemoved == 0 {
		opt.RecentlyRemoved = DefaultRecentlyRemoved
	}
	if opt.RoutedBlocks == 0 {
		opt.RoutedBlocks = DefaultRoutedBlocks
	}
	ix := &Index{opt: opt, table: newRWTable()}
	ix.reg.Store(&registry{byTarget: map[kvkey.Target]*targetState{}})
	ix.ovPool.New = func() any { return new([]Overlap) }
	ix.posPool.New = func() any { return make(map[kvkey.Target]int, 64) }
	return ix
}

// lookup returns a block's residency (zero if unknown).
func (ix *Index) lookup(h kvkey.BlockHash) gentry { return ix.table.get(h) }

// setBits sets (on) or clears slot in every nested set of mask for block h.
func (ix *Index) setBits(h kvkey.BlockHash, slot int, mask uint8, on bool) {
	ix.table.update(h, slot, mask, on)
}

// target returns (registering if needed) the state of t.
func (ix *Index) target(t kvkey.Target) (*targetState, error) {
	if ts := ix.reg.Load().byTarget[t]; ts != nil {
		return ts, nil
	}
	ix.regMu.Lock()
	defer ix.regMu.Unlock()
	old := ix.reg.Load()
	if ts := old.byTarget[t]; ts != nil {
		return ts, nil
	}
	slot := -1
	for i := range MaxTargets {
		if !old.live.has(i) {
			slot = i
			break
		}
	}
	if slot < 0 {
		return nil, fmt.Errorf("%w: %s would exceed %d", ErrTooManyTargets, t, MaxTargets)
	}
	ts := newTargetState(ix, t, slot)
	nr := &registry{byTarget: make(map[kvkey.Target]*targetState, len(old.byTarget)+1), bySlot: old.bySlot, live: old.live}
	for k, v := range old.byTarget {
		nr.byTarget[k] = v
	}
	nr.byTarget[t] = ts
	nr.bySlot[slot] = ts
	nr.live.set(slot)
	ix.reg.Store(nr)
	return ts, nil
}

// AddTarget registers a target ahead of its first event (so it shows up in Snapshot).
func (ix *Index) AddTarget(t kvkey.Target) error {
	_, err := ix.target(t)
	return err
}

// RemoveTarget drops every block of t and frees its slot.
func (ix *Index) RemoveTarget(t kvkey.Target) { ix.RemoveTargetTo(t, nil) }

// RemoveTargetTo is RemoveTarget recording the change (an all-tier clear, if t was known) in cs
// (nil: not recorded).
func (ix *Index) RemoveTargetTo(t kvkey.Target, cs *ChangeSet) {
	if cs != nil {
		cs.reset(t)
	}
	ix.regMu.Lock()
	defer ix.regMu.Unlock()
	old := ix.reg.Load()
	ts := old.byTarget[t]
	if ts == nil {
		return
	}
	ts.mu.Lock()
	ts.cs = cs
	ts.resetLocked()
	ts.cs = nil
	ts.mu.Unlock()
	nr := &registry{byTarget: make(map[kvkey.Target]*targetState, len(old.byTarget)), bySlot: old.bySlot, live: old.live}
	for k, v := range old.byTarget {
		if k != t {
			nr.byTarget[k] = v
		}
	}
	nr.bySlot[ts.slot] = nil
	nr.live.clear(ts.slot)
	ix.reg.Store(nr)
}

// Apply applies one decoded batch to target t's state.
func (ix *Index) Apply(t kvkey.Target, b *EventBatch) error { return ix.ApplyTo(t, b, nil) }

// ApplyTo applies one decoded batch to target t's state and records in cs (reset first; nil:
// not recorded) every residency change it made, in order. The index calls nobody: the caller
// hands cs on once ApplyTo returned (see ChangeConsumer).
func (ix *Index) ApplyTo(t kvkey.Target, b *EventBatch, cs *ChangeSet) error {
	if cs != nil {
		cs.reset(t)
	}
	ts, err := ix.target(t)
	if err != nil {
		return err
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.cs = cs
	defer func() { ts.cs = nil }()
	if cs != nil {
		defer cs.seal()
	}
	for _, ev := range b.Events {
		switch e := ev.(type) {
		case *BlockStored:
			ts.applyStored(e)
		case *BlockRemoved:
			ts.applyRemoved(e)
		case *AllBlocksCleared:
			ts.clearTier(G1)
			ts.stats.events[kindCleared][G1].Add(1)
		}
	}
	return nil
}

// Reset drops everything the index holds for t (all tiers) and bumps its residency version:
// used when the event stream can no longer be trusted (unrecoverable gap, restart).
func (ix *Index) Reset(t kvkey.Target) { ix.ResetTo(t, nil) }

// ResetTo is Reset recording the change (an all-tier clear) in cs (nil: not recorded).
func (ix *Index) ResetTo(t kvkey.Target, cs *ChangeSet) {
	if cs != nil {
		cs.reset(t)
	}
	ts, err := ix.target(t)
	if err != nil {
		return
	}
	ts.mu.Lock()
	ts.cs = cs
	ts.resetLocked()
	ts.cs = nil
	ts.mu.Unlock()
}

// ResidencyVersion returns t's residency version, which increases on every applied removal,
// clear and reset (0 for an unknown target).
func (ix *Index) ResidencyVersion(t kvkey.Target) uint64 {
	if ts := ix.reg.Load().byTarget[t]; ts != nil {
		return ts.version.Load()
	}
	return 0
}
