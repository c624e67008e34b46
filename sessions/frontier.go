package sessions

import (
	"slices"

	"github.com/kvgate/kvgate/kvkey"
)

// setFrontier makes slot (a freshly linked, possibly unreferenced node) a frontier of s on target:
// an existing frontier that is an ancestor is replaced; if one is already at or below slot the
// session knows more than this update and only its vouched range grows; otherwise slot is a new
// branch. A claim vouches for slot's whole current lineage: route-time matches are leading runs
// and vLLM stores a block only while its prefix is resident.
func (m *Tracker) setFrontier(s *session, r sessRef, target kvkey.Target, slot uint32) {
	m.tick++
	m.markDirty(r)
	stamp := m.f.nextStamp()
	top := slot
	for x := slot; x != nilSlot; x = m.f.nodes[x].parent {
		m.f.nodes[x].mark = stamp
		top = x
	}
	topRef := m.f.ref(top)
	replace := -1
	for i := range s.frontiers {
		fr := &s.frontiers[i]
		if fr.target != target {
			continue
		}
		fs, ok := m.f.resolve(fr.node)
		if !ok {
			continue
		}
		if m.f.nodes[fs].mark == stamp { // fr is an ancestor-or-self of slot
			if fs == slot {
				fr.tick, fr.top = m.tick, topRef
				return
			}
			replace = i
			break
		}
		if m.f.isAncestorOrSelf(slot, fs) { // the session already knows a deeper block here
			fr.tick = m.tick
			// The claim vouches root..slot; the frontier's range grows to the root only if the two
			// ranges meet (its old top on slot's path or just below slot), else a gap stays unvouched.
			if u, ok := m.f.resolve(fr.top); ok && (m.f.nodes[u].mark == stamp || m.f.nodes[u].parent == slot) {
				fr.top = topRef
			}
			m.f.reclaim(slot)
			return
		}
	}
	if replace >= 0 {
		m.moveFrontier(s, r, replace, slot, topRef)
		return
	}
	m.addFrontier(s, r, target, slot, topRef)
}

// addFrontier appends a frontier, evicting the least recently updated one over the bounds.
func (m *Tracker) addFrontier(s *session, r sessRef, target kvkey.Target, slot uint32, top NodeRef) {
	onTarget, oldestOnTarget, oldest := 0, -1, -1
	for i := range s.frontiers {
		if oldest < 0 || s.frontiers[i].tick < s.frontiers[oldest].tick {
			oldest = i
		}
		if s.frontiers[i].target == target {
			onTarget++
			if oldestOnTarget < 0 || s.frontiers[i].tick < s.frontiers[oldestOnTarget].tick {
				oldestOnTarget = i
			}
		}
	}
	m.markDirty(r)
	m.f.addRef(slot) // before any drop, so evicting a frontier cannot reclaim slot's lineage
	if onTarget >= m.cfg.MaxFrontiersPerTarget {
		m.dropFrontier(s, r, oldestOnTarget)
	} else if len(s.frontiers) >= m.cfg.MaxFrontiersPerSession {
		m.dropFrontier(s, r, oldest)
	}
	ref := m.f.ref(slot)
	s.frontiers = append(s.frontiers, frontier{target: target, node: ref, top: top, tick: m.tick})
	m.revAdd(target, ref, r)
}

// moveFrontier points frontier i at slot (an ancestor or descendant of its node) vouched from top.
func (m *Tracker) moveFrontier(s *session, r sessRef, i int, slot uint32, top NodeRef) {
	m.markDirty(r)
	fr := &s.frontiers[i]
	old := fr.node
	m.f.addRef(slot)
	fr.node, fr.top, fr.tick = m.f.ref(slot), top, m.tick
	m.revAdd(fr.target, fr.node, r)
	m.revDel(fr.target, old, r)
	if os, ok := m.f.resolve(old); ok {
		m.f.dropRef(os)
	}
}

// dropFrontier removes frontier i and releases its node.
func (m *Tracker) dropFrontier(s *session, r sessRef, i int) {
	m.markDirty(r)
	fr := s.frontiers[i]
	s.frontiers = append(s.frontiers[:i], s.frontiers[i+1:]...)
	m.revDel(fr.target, fr.node, r)
	if slot, ok := m.f.resolve(fr.node); ok {
		m.f.dropRef(slot)
	}
}

// revList holds the sessions with a frontier at one node on one target: almost always one, kept
// inline so moving a frontier allocates nothing.
type revList struct {
	first sessRef
	more  []sessRef
	n     int
}

// appendTo appends the list's sessions to dst.
func (l revList) appendTo(dst []sessRef) []sessRef {
	if l.n == 0 {
		return dst
	}
	return append(append(dst, l.first), l.more...)
}

func (m *Tracker) revAdd(t kvkey.Target, n NodeRef, r sessRef) {
	byNode := m.rev[t]
	if byNode == nil {
		byNode = make(map[NodeRef]revList)
		m.rev[t] = byNode
	}
	l := byNode[n]
	if l.n == 0 {
		l.first = r
	} else {
		l.more = append(l.more, r)
	}
	l.n++
	byNode[n] = l
}

// revDel removes r from the list at (t, n). Per-target maps stay allocated: targets are the fleet.
func (m *Tracker) revDel(t kvkey.Target, n NodeRef, r sessRef) {
	byNode := m.rev[t]
	l, ok := byNode[n]
	if !ok {
		return
	}
	switch {
	case l.first == r && len(l.more) == 0:
		delete(byNode, n)
		return
	case l.first == r:
		l.first = l.more[len(l.more)-1]
		l.more = l.more[:len(l.more)-1]
	default:
		i := slices.Index(l.more, r)
		if i < 0 {
			return
		}
		l.more = slices.Delete(l.more, i, i+1)
	}
	l.n--
	byNode[n] = l
}
