package sessions

import (
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/kvkey"
)

// nilSlot marks "no node" in parent links and references.
const nilSlot = ^uint32(0)

// Errors returned when an update is rejected before anything was mutated.
var (
	// ErrConflictingParent means a block hash already in the forest was claimed under a different parent.
	ErrConflictingParent = errors.New("sessions: conflicting parent for block")
	// ErrCyclicParent means applying the update would make a block its own ancestor.
	ErrCyclicParent = errors.New("sessions: cyclic parentage")
	// ErrForestFull means the update needs more nodes than the forest may ever hold.
	ErrForestFull = errors.New("sessions: prefix forest at capacity")
)

// ParentKind says what an update knows about the parent of its first block.
type ParentKind uint8

const (
	// ParentNone: the first block is block 0 of a prompt (a true root).
	ParentNone ParentKind = iota
	// ParentHash: the first block hangs under a given block hash.
	ParentHash
	// ParentUnknown: nothing is known; a new first block becomes a temporary root that a later
	// update naming its parent grafts.
	ParentUnknown
)

const (
	flagLive uint8 = 1 << iota
	flagTemp       // parent not known yet (temporary root)
)

// node is one block of the shared logical forest. 40 bytes; the slab holds them by value.
type node struct {
	hash     kvkey.BlockHash
	parent   uint32 // slot of the parent, nilSlot for roots
	gen      uint32 // bumped every time the slot is freed, so stale NodeRefs never alias
	children uint32 // live child nodes
	refs     uint32 // frontier references (across sessions and targets)
	mark     uint32 // scratch stamp for a single operation (cycle and removal checks)
	// depth counts blocks from a true root (1 for block 0); 0 when unknown, i.e. the node was
	// created below a temporary root (a later graft does not renumber the subtree).
	depth uint32
	flags uint8
}

// NodeRef names a node by slot and generation; it stays valid exactly as long as the node lives.
type NodeRef struct {
	Slot uint32
	Gen  uint32
}

// forest is the shared logical forest of block hashes. Nodes live in a slab with a free list;
// a node is reclaimed as soon as it has neither children nor frontier references. Not safe for
// concurrent use: the Tracker serialises access.
type forest struct {
	nodes  []node
	free   []uint32
	byHash map[kvkey.BlockHash]uint32
	max    int
	stamp  uint32
	seen   scratchSet // duplicate detection within one chain, reused
}

func newForest(maxNodes int) *forest {
	return &forest{byHash: make(map[kvkey.BlockHash]uint32), max: maxNodes}
}

// live returns the number of live nodes.
func (f *forest) live() int { return len(f.nodes) - len(f.free) }

// freeCapacity is how many more nodes may be allocated.
func (f *forest) freeCapacity() int { return f.max - f.live() }

// resolve returns the slot of ref if it is still the node it named.
func (f *forest) resolve(r NodeRef) (uint32, bool) {
	if int(r.Slot) >= len(f.nodes) {
		return 0, false
	}
	n := &f.nodes[r.Slot]
	if n.flags&flagLive == 0 || n.gen != r.Gen {
		return 0, false
	}
	return r.Slot, true
}

func (f *forest) ref(slot uint32) NodeRef { return NodeRef{Slot: slot, Gen: f.nodes[slot].gen} }

// nextStamp returns a fresh scratch stamp; on wrap-around every mark is cleared.
func (f *forest) nextStamp() uint32 {
	f.stamp++
	if f.stamp == 0 {
		for i := range f.nodes {
			f.nodes[i].mark = 0
		}
		f.stamp = 1
	}
	return f.stamp
}

// plan is the outcome of validating a chain: how many nodes it creates and whether it adds links.
type plan struct {
	newNodes int
	newLinks bool
	existing int // chain blocks already in the forest
}

// validate checks that linking chain (under the parent described by kind/parentHash) is
// consistent with the forest, without mutating it.
func (f *forest) validate(chain []kvkey.BlockHash, kind ParentKind, parentHash kvkey.BlockHash) (plan, error) {
	var p plan
	prevSlot, prevKnown := nilSlot, kind != ParentUnknown
	if kind == ParentHash {
		if s, ok := f.byHash[parentHash]; ok {
			prevSlot = s
		} else {
			p.newNodes++ // the parent becomes a temporary root
			p.newLinks = true
		}
	}
	for i, h := range chain {
		s, ok := f.byHash[h]
		if !ok {
			p.newNodes++
			p.newLinks = true
			prevSlot, prevKnown = nilSlot, true
			continue
		}
		p.existing++
		n := &f.nodes[s]
		switch {
		case !prevKnown:
			// nothing claimed about this block's parent
		case n.flags&flagTemp != 0:
			p.newLinks = true // graft (or, at a true-root claim, the temporary root learns it is one)
		case i == 0 && kind == ParentHash && prevSlot == nilSlot:
			// the parent is new, so this existing node cannot already hang under it
			return p, fmt.Errorf("%w: block %016x already has a parent, claimed under new block %016x", ErrConflictingParent, h, parentHash)
		case i > 0 && prevSlot == nilSlot:
			return p, fmt.Errorf("%w: block %016x already has a parent, claimed under new block %016x", ErrConflictingParent, h, chain[i-1])
		case n.parent != prevSlot:
			return p, fmt.Errorf("%w: block %016x", ErrConflictingParent, h)
		}
		prevSlot, prevKnown = s, true
	}
	if !p.newLinks {
		return p, nil
	}
	// Duplicates inside the chain (or the parent repeated in it) would make a block its own ancestor.
	f.seen.reset(len(chain) + 1)
	if kind == ParentHash {
		f.seen.add(parentHash)
	}
	for _, h := range chain {
		if !f.seen.add(h) {
			return p, fmt.Errorf("%w: block %016x repeats in its own chain", ErrCyclicParent, h)
		}
	}
	// A new link is cyclic only if a chain block is already an ancestor of the block the chain
	// hangs from: the named parent, or (parent unknown) the existing first block's current parent.
	// A chain of brand-new blocks cannot be anyone's ancestor yet, so appends skip the walk.
	top := nilSlot
	if p.existing == 0 {
		return p, nil
	}
	switch kind {
	case ParentHash:
		if s, ok := f.byHash[parentHash]; ok {
			top = f.nodes[s].parent
		}
	case ParentUnknown:
		if s, ok := f.byHash[chain[0]]; ok {
			top = f.nodes[s].parent
		}
	}
	for s := top; s != nilSlot; s = f.nodes[s].parent {
		if f.seen.has(f.nodes[s].hash) {
			return p, fmt.Errorf("%w: block %016x would become its own ancestor", ErrCyclicParent, f.nodes[s].hash)
		}
	}
	return p, nil
}

// alloc takes a slot for hash; the caller has checked capacity.
func (f *forest) alloc(h kvkey.BlockHash) uint32 {
	var s uint32
	if k := len(f.free); k > 0 {
		s = f.free[k-1]
		f.free = f.free[:k-1]
	} else {
		f.nodes = append(f.nodes, node{})
		s = uint32(len(f.nodes) - 1)
	}
	n := &f.nodes[s]
	gen := n.gen
	*n = node{hash: h, parent: nilSlot, gen: gen, flags: flagLive}
	f.byHash[h] = s
	return s
}

// setParent links child under parent (nilSlot for a true root) and clears its temporary flag.
func (f *forest) setParent(child, parent uint32) {
	n := &f.nodes[child]
	n.flags &^= flagTemp
	n.parent = parent
	n.depth = 1
	if parent != nilSlot {
		p := &f.nodes[parent]
		p.children++
		n.depth = 0
		if p.depth > 0 {
			n.depth = p.depth + 1
		}
	}
}

// link validates then applies chain and returns the slot of its deepest block. The deepest block
// is unreferenced on return: the caller either takes a reference or calls reclaim.
func (f *forest) link(chain []kvkey.BlockHash, kind ParentKind, parentHash kvkey.BlockHash) (uint32, error) {
	if len(chain) == 0 {
		return nilSlot, nil
	}
	if kind == ParentNone && len(chain) > 16 {
		// A rooted chain usually repeats a long prefix the forest already holds: find where it
		// ends and link only the rest under it.
		if k := f.knownRootedPrefix(chain); k > 0 {
			if k == len(chain) {
				return f.byHash[chain[k-1]], nil
			}
			chain, kind, parentHash = chain[k:], ParentHash, chain[k-1]
		}
	}
	p, err := f.validate(chain, kind, parentHash)
	if err != nil {
		return nilSlot, err
	}
	if !p.newLinks { // already in the forest exactly like this
		return f.byHash[chain[len(chain)-1]], nil
	}
	if p.newNodes > f.freeCapacity() {
		return nilSlot, fmt.Errorf("%w: need %d nodes, %d free", ErrForestFull, p.newNodes, f.freeCapacity())
	}
	prev, prevKnown := nilSlot, kind != ParentUnknown
	if kind == ParentHash {
		s, ok := f.byHash[parentHash]
		if !ok {
			s = f.alloc(parentHash)
			f.nodes[s].flags |= flagTemp
		}
		prev = s
	}
	for _, h := range chain {
		s, ok := f.byHash[h]
		if !ok {
			s = f.alloc(h)
			if prevKnown {
				f.setParent(s, prev)
			} else {
				f.nodes[s].flags |= flagTemp
			}
		} else if prevKnown && f.nodes[s].flags&flagTemp != 0 {
			f.setParent(s, prev) // graft
		}
		prev, prevKnown = s, true
	}
	// A parent created as a temporary root only for this link keeps a child, so it is retained.
	return prev, nil
}

// knownRootedPrefix returns k such that chain[:k] is, verifiably, a rooted path of the forest
// (chain[0] a true root, each block the parent of the next), or 0. Chained block hashes make
// "chain[i] is in the forest" hold for a leading run, so a binary search finds the candidate with
// O(log n) lookups; the walk up from it (pointer chasing, no lookups) confirms it. Anything
// unexpected returns 0 and the caller validates block by block.
func (f *forest) knownRootedPrefix(chain []kvkey.BlockHash) int {
	lo, hi := 0, len(chain) // invariant: chain[:lo] present as far as probed, chain[hi] absent
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if _, ok := f.byHash[chain[mid]]; ok {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	k := lo
	if k == 0 {
		return 0
	}
	x := f.byHash[chain[k-1]]
	for i := k - 1; i >= 0; i-- {
		if x == nilSlot || f.nodes[x].hash != chain[i] {
			return 0
		}
		x = f.nodes[x].parent
	}
	if x != nilSlot || f.nodes[f.byHash[chain[0]]].flags&flagTemp != 0 {
		return 0
	}
	return k
}

// addRef takes a frontier reference on slot.
func (f *forest) addRef(slot uint32) { f.nodes[slot].refs++ }

// dropRef releases a frontier reference and reclaims what became unreferenced.
func (f *forest) dropRef(slot uint32) {
	f.nodes[slot].refs--
	f.reclaim(slot)
}

// reclaim frees slot and then its ancestors for as long as each is an unreferenced leaf.
func (f *forest) reclaim(slot uint32) {
	for slot != nilSlot {
		n := &f.nodes[slot]
		if n.flags&flagLive == 0 || n.children > 0 || n.refs > 0 {
			return
		}
		parent := n.parent
		delete(f.byHash, n.hash)
		n.flags = 0
		n.gen++
		n.parent = nilSlot
		f.free = append(f.free, slot)
		if parent != nilSlot {
			f.nodes[parent].children--
		}
		slot = parent
	}
}

// depth counts blocks from slot up to its root (inclusive); rooted is false when the topmost
// block is a temporary root, i.e. the lineage is known only from there.
func (f *forest) depth(slot uint32) (d int, rooted bool) {
	top := slot
	for s := slot; s != nilSlot; s = f.nodes[s].parent {
		d++
		top = s
	}
	return d, f.nodes[top].flags&flagTemp == 0
}

// lineage returns the hashes from the root (or from anchor, when anchor is on the path) down to
// slot. ok is false when an anchor was given and is not an ancestor-or-self of slot.
func (f *forest) lineage(slot uint32, anchor kvkey.BlockHash, useAnchor bool) (hs []kvkey.BlockHash, ok bool) {
	for s := slot; s != nilSlot; s = f.nodes[s].parent {
		hs = append(hs, f.nodes[s].hash)
		if useAnchor && f.nodes[s].hash == anchor {
			ok = true
			break
		}
	}
	if useAnchor && !ok {
		return nil, false
	}
	for i, j := 0, len(hs)-1; i < j; i, j = i+1, j-1 {
		hs[i], hs[j] = hs[j], hs[i]
	}
	return hs, true
}

// isAncestorOrSelf reports whether a lies on the path from d up to its root.
func (f *forest) isAncestorOrSelf(a, d uint32) bool {
	for s := d; s != nilSlot; s = f.nodes[s].parent {
		if s == a {
			return true
		}
	}
	return false
}

// scratchSet is an open-addressing set of block hashes reused across operations: clearing is a generation
// bump, so checking a chain for repeats costs no allocation and no per-entry map overhead.
type scratchSet struct {
	keys []kvkey.BlockHash
	gens []uint32
	gen  uint32
	mask uint64
}

// reset prepares the set for up to n keys.
func (s *scratchSet) reset(n int) {
	size := 16
	for size < 2*n {
		size <<= 1
	}
	if size > len(s.keys) {
		s.keys = make([]kvkey.BlockHash, size)
		s.gens = make([]uint32, size)
		s.gen = 0
	}
	s.mask = uint64(len(s.keys) - 1)
	s.gen++
	if s.gen == 0 { // wrapped: forget every stale entry
		clear(s.gens)
		s.gen = 1
	}
}

func (s *scratchSet) slot(k kvkey.BlockHash) uint64 {
	return (uint64(k) * 0x9E3779B97F4A7C15) >> 32 & s.mask
}

// add inserts k and reports whether it was absent.
func (s *scratchSet) add(k kvkey.BlockHash) bool {
	for i := s.slot(k); ; i = (i + 1) & s.mask {
		if s.gens[i] != s.gen {
			s.gens[i], s.keys[i] = s.gen, k
			return true
		}
		if s.keys[i] == k {
			return false
		}
	}
}

// has reports whether k was added since the last reset.
func (s *scratchSet) has(k kvkey.BlockHash) bool {
	for i := s.slot(k); ; i = (i + 1) & s.mask {
		if s.gens[i] != s.gen {
			return false
		}
		if s.keys[i] == k {
			return true
		}
	}
}
