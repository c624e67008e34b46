package indexers

import "github.com/kvgate/kvgate/kvkey"

// ChangeKind says what one Change reports.
type ChangeKind uint8

const (
	// ChangeStored: Hashes became resident in Tier.
	ChangeStored ChangeKind = iota
	// ChangeRemoved: Hashes stopped being resident in Tier.
	ChangeRemoved
	// ChangeCleared: the target's tiers were dropped (G1 only for AllBlocksCleared; all tiers,
	// AllTiers set, for a reset or a removed target). Hashes is empty.
	ChangeCleared
	// ChangeStoredRun: one token-carrying store as a whole run, reported right after its
	// ChangeStored (if any block became resident): all of its blocks in chain order, whether or
	// not they were already resident, with our hash of the run's parent (HasParent false when
	// the run starts a prompt) and the session the worker attributed it to (vLLM's
	// BlockStored.session_id, "" when absent).
	ChangeStoredRun
)

// Change is one residency change of a target, in our block hashes.
type Change struct {
	Kind ChangeKind
	Tier Tier
	// Hashes aliases the ChangeSet's memory: valid until the set is reused.
	Hashes    []kvkey.BlockHash
	Parent    kvkey.BlockHash
	HasParent bool
	SessionID string
	AllTiers  bool

	lo, hi int // Hashes as a range of ChangeSet.hashes while the set is being built
}

// ChangeSet is what one Index.ApplyTo, ResetTo or RemoveTargetTo changed on one target, in the
// order the index applied it. The index fills it while holding the target's lock; the caller
// owns it and hands it on after the call returned, so that nobody is called back under the
// index's lock. Reusing one ChangeSet per goroutine keeps recording allocation-free once its
// buffers have grown.
type ChangeSet struct {
	Target  kvkey.Target
	Changes []Change
	hashes  []kvkey.BlockHash
}

// ChangeConsumer hears change sets after the index applied them and released its lock, on the
// goroutine that applied them (one per target, so a target's changes arrive in order). The set
// is valid only during the call.
type ChangeConsumer interface {
	IndexChanged(cs *ChangeSet)
}

// maxRetainedHashes bounds the hash buffer a ChangeSet keeps between uses: one hostile batch
// must not pin a large buffer for good.
const maxRetainedHashes = 1 << 16

// reset empties the set for target t, keeping its buffers.
func (cs *ChangeSet) reset(t kvkey.Target) {
	cs.Target = t
	clear(cs.Changes) // drop session id strings
	cs.Changes = cs.Changes[:0]
	if cap(cs.hashes) > maxRetainedHashes {
		cs.hashes = nil
	}
	cs.hashes = cs.hashes[:0]
}

// Empty reports whether the set holds no change.
func (cs *ChangeSet) Empty() bool { return len(cs.Changes) == 0 }

// add records a change with a copy of hs.
func (cs *ChangeSet) add(c Change, hs []kvkey.BlockHash) {
	c.lo = len(cs.hashes)
	cs.hashes = append(cs.hashes, hs...)
	c.hi = len(cs.hashes)
	cs.Changes = append(cs.Changes, c)
}

// seal points every change's Hashes into the final hash buffer.
func (cs *ChangeSet) seal() {
	for i := range cs.Changes {
		c := &cs.Changes[i]
		c.Hashes = cs.hashes[c.lo:c.hi:c.hi]
	}
}
