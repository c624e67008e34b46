package sessions

import (
	"fmt"
	"slices"

	"github.com/kvgate/kvgate/kvkey"
)

// ApplyStored applies a BlockStored on target (G1 only: the caller passes GPU events), with our
// hashes of the stored blocks in chain order. parentOurHash is our hash of the parent block, 0
// when the first block is block 0 of a prompt. When sessionID names a tracked session its frontier
// on target advances to the last block; otherwise only the forest learns the parentage (grafting
// temporary roots). Conflicting or cyclic parentage is rejected with an error and nothing changes.
func (m *Tracker) ApplyStored(target kvkey.Target, ourHashes []kvkey.BlockHash, parentOurHash kvkey.BlockHash, sessionID string) error {
	if len(ourHashes) == 0 {
		return nil
	}
	kind := ParentNone
	if parentOurHash != 0 {
		kind = ParentHash
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	defer m.publish()
	var s *session
	var r sessRef
	if sessionID != "" {
		s, r, _ = m.lookup(sessionID)
	}
	if s == nil {
		// Unattributed: only grafting matters, and only if some block is already tracked.
		tracked := false
		for _, h := range ourHashes {
			if _, ok := m.f.byHash[h]; ok {
				tracked = true
				break
			}
		}
		if !tracked {
			return nil
		}
		slot, err := m.f.link(ourHashes, kind, parentOurHash)
		if err != nil {
			m.reject("stored", sessionID, err)
			return fmt.Errorf("stored on %s: %w", target, err)
		}
		m.f.reclaim(slot)
		return nil
	}
	// Fast path: the blocks extend the session's frontier on target (the usual decode/prefill
	// stream), so the frontier moves down without walking its lineage.
	extend := -1
	if kind == ParentHash {
		if ps, ok := m.f.byHash[parentOurHash]; ok {
			pref := m.f.ref(ps)
			for i := range s.frontiers {
				if s.frontiers[i].target == target && s.frontiers[i].node == pref {
					extend = i
					break
				}
			}
		}
	}
	slot, err := m.linkEvicting(ourHashes, kind, parentOurHash, r)
	if err != nil {
		m.reject("stored", sessionID, err)
		return fmt.Errorf("stored on %s for session %q: %w", target, sessionID, err)
	}
	s, _ = m.resolveSess(r)
	if extend >= 0 {
		m.tick++
		m.moveFrontier(s, r, extend, slot, s.frontiers[extend].top)
		return nil
	}
	m.setFrontier(s, r, target, slot)
	return nil
}

// ApplyRemoved recedes every frontier on target whose vouched prefix lost a block: it moves to
// the parent of the topmost removed block on its path, the nearest ancestor not removed (dropped
// when no vouched block is left above the gap).
func (m *Tracker) ApplyRemoved(target kvkey.Target, ourHashes []kvkey.BlockHash) {
	m.mu.Lock()
	defer m.mu.Unlock()
	defer m.publish()
	byNode := m.rev[target]
	if len(byNode) == 0 {
		return
	}
	// Mark the removed blocks the forest knows, and find the shallowest: a frontier of known depth
	// only needs to be walked up to that depth, so evicting a tail block costs a few steps per
	// frontier instead of its whole lineage.
	stamp := m.f.nextStamp()
	marked, minDepth := false, uint32(0)
	for _, h := range ourHashes {
		if slot, ok := m.f.byHash[h]; ok {
			n := &m.f.nodes[slot]
			n.mark = stamp
			if !marked || n.depth < minDepth {
				minDepth = n.depth // 0 (unknown) forces full walks
			}
			marked = true
		}
	}
	if !marked {
		return
	}
	m.rmHits, m.rmBelow = m.rmHits[:0], m.rmBelow[:0]
	// Fast path: removed blocks that are leaves of the forest (the usual tail-first eviction) can
	// only be frontiers themselves, so each is one lookup.
	allLeaves := true
	for _, h := range ourHashes {
		if slot, ok := m.f.byHash[h]; ok && m.f.nodes[slot].children > 0 {
			allLeaves = false
			break
		}
	}
	if allLeaves {
		for _, h := range ourHashes {
			slot, ok := m.f.byHash[h]
			if !ok {
				continue
			}
			ref := m.f.ref(slot)
			if _, ok := byNode[ref]; ok {
				lo := len(m.rmBelow)
				m.rmBelow = append(m.rmBelow, slot)
				m.rmHits = append(m.rmHits, removalHit{node: ref, lo: lo, hi: lo + 1, to: m.f.nodes[slot].parent})
			}
		}
	}
	for ref := range byNode {
		if allLeaves {
			break
		}
		slot, ok := m.f.resolve(ref)
		if !ok {
			continue
		}
		d := m.f.nodes[slot].depth
		if minDepth > 0 && d > 0 && d < minDepth {
			continue // every removed block is deeper than this frontier
		}
		topIdx, topSlot, steps := -1, nilSlot, 0
		for x := slot; x != nilSlot; x = m.f.nodes[x].parent {
			if m.f.nodes[x].mark == stamp {
				topIdx, topSlot = steps, x
			}
			steps++
			if minDepth > 0 && m.f.nodes[x].depth == minDepth {
				break // known depths: nothing removed lies above this
			}
		}
		if topIdx < 0 {
			continue
		}
		lo := len(m.rmBelow)
		for x, k := slot, 0; k <= topIdx; x, k = m.f.nodes[x].parent, k+1 {
			m.rmBelow = append(m.rmBelow, x)
		}
		m.rmHits = append(m.rmHits, removalHit{node: ref, lo: lo, hi: len(m.rmBelow), to: m.f.nodes[topSlot].parent})
	}
	for _, h := range m.rmHits {
		m.rmSess = byNode[h.node].appendTo(m.rmSess[:0]) // recede edits the list
		for _, r := range m.rmSess {
			if s, ok := m.resolveSess(r); ok {
				m.recede(s, r, target, h.node, m.rmBelow[h.lo:h.hi], h.to)
			}
		}
	}
	// Scratch stays for the next event unless one hostile batch made it large.
	if cap(m.rmBelow) > 1<<16 {
		m.rmBelow, m.rmHits = nil, nil
	}
}

// removalHit is a frontier node whose path lost a block: rmBelow[lo:hi] is the path from it up to
// the topmost removed block, to that block's parent.
type removalHit struct {
	node   NodeRef
	lo, hi int
	to     uint32
}

// recede moves the session's frontier at from (on target) up to slot to, or drops it when its
// vouched top is among the blocks below (and including) the gap.
func (m *Tracker) recede(s *session, r sessRef, target kvkey.Target, from NodeRef, below []uint32, to uint32) {
	for i := range s.frontiers {
		fr := s.frontiers[i]
		if fr.target != target || fr.node != from {
			continue
		}
		m.stats.receded.Add(1)
		topSlot, _ := m.f.resolve(fr.top)
		if to == nilSlot || slices.Contains(below, topSlot) { // nothing vouched survives
			m.dropFrontier(s, r, i)
			return
		}
		// If another frontier of the session on target already covers to, just drop this one.
		for j := range s.frontiers {
			if j == i || s.frontiers[j].target != target {
				continue
			}
			if js, ok := m.f.resolve(s.frontiers[j].node); ok && m.f.isAncestorOrSelf(to, js) {
				m.dropFrontier(s, r, i)
				return
			}
		}
		m.moveFrontier(s, r, i, to, fr.top)
		return
	}
}

// ApplyCleared drops every frontier (and in-flight prompt credit) on target: AllBlocksCleared,
// or the index reset that worker+rank.
func (m *Tracker) ApplyCleared(target kvkey.Target) {
	m.mu.Lock()
	defer m.mu.Unlock()
	defer m.publish()
	for ref, list := range m.rev[target] {
		for _, r := range list.appendTo(nil) {
			s, ok := m.resolveSess(r)
			if !ok {
				continue
			}
			for i := len(s.frontiers) - 1; i >= 0; i-- {
				if s.frontiers[i].target == target && s.frontiers[i].node == ref {
					m.dropFrontier(s, r, i)
					m.stats.cleared.Add(1)
				}
			}
		}
	}
	delete(m.rev, target)
	for i := range m.sess {
		s := &m.sess[i]
		if s.live && s.hasPending && s.pending.target == target {
			m.clearPending(s)
		}
	}
}
