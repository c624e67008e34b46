package sessions

import (
	"errors"

	"github.com/kvgate/kvgate/kvkey"
)

// OnRouted is the post-selection update: the session's later turns prefer target, and its
// frontier on target advances to the deepest block of hashes resident there in G1. The update is
// applied only if the target's residency version did not change while the match was taken
// (retried once; then the matched prefix must still be resident), so a frontier is never
// restored for blocks the index has removed.
func (m *Tracker) OnRouted(sessionID string, target kvkey.Target, hashes []kvkey.BlockHash) {
	if sessionID == "" {
		return
	}
	if m.shared != nil {
		defer m.reportRouted(sessionID, target) // after mu is released: it must never wait on it
	}
	if m.idx == nil || len(hashes) == 0 {
		m.mu.Lock()
		m.routedLocked(sessionID, target, hashes, 0)
		m.publish()
		m.mu.Unlock()
		return
	}
	for attempt := 0; ; attempt++ {
		v := m.idx.ResidencyVersion(target)
		n := m.idx.DeepestG1(target, hashes)
		m.mu.Lock()
		switch {
		case m.idx.ResidencyVersion(target) == v:
			m.routedLocked(sessionID, target, hashes, n)
		case attempt == 0:
			m.stats.staleRetries.Add(1)
			m.mu.Unlock()
			continue
		case n > 0 && m.idx.DeepestG1(target, hashes[:n]) == n:
			m.stats.staleVerified.Add(1)
			m.routedLocked(sessionID, target, hashes, n)
		default:
			m.stats.staleDropped.Add(1)
			m.routedLocked(sessionID, target, hashes, 0)
		}
		m.publish()
		m.mu.Unlock()
		return
	}
}

// reportRouted tells the shared bindings where sessionID (and its parent, if any) went.
func (m *Tracker) reportRouted(sessionID string, target kvkey.Target) {
	m.hints.mu.RLock()
	parent := ""
	if r := m.hints.byID[sessionID]; r != nil {
		parent = r.parent
	}
	m.hints.mu.RUnlock()
	m.shared.Routed(sessionID, parent, target)
}

// routedLocked applies a routing result with n verified G1 blocks.
func (m *Tracker) routedLocked(sessionID string, target kvkey.Target, hashes []kvkey.BlockHash, n int) {
	matched := hashes[:n]
	s, r := m.getOrCreate(sessionID, false, sessRef{slot: nilSlot})
	first := !s.hasAffinity
	s.hasAffinity, s.affinity, s.affAt = true, target, m.now()
	m.markDirty(r)
	s.routed++
	if first && s.parent != "" {
		m.joinGroup(s.parent, r, target) // may grow the slab: s is re-resolved below
	}
	m.expirePending()
	if n > 0 && m.advance(r, target, hashes[:n]) {
		n = -1 // handled; skip the general path below
	}
	if n > 0 {
		chain, kind := hashes[:n], ParentNone
		if w := m.cfg.MaxLineageBlocks; w > 0 && n > w {
			chain, kind = hashes[n-w:n], ParentUnknown
		}
		if slot, err := m.linkEvicting(chain, kind, 0, r); err != nil {
			m.reject("route", sessionID, err)
		} else {
			s, _ = m.resolveSess(r)
			m.setFrontier(s, r, target, slot)
		}
	}
	if n < 0 {
		n = len(matched)
	}
	if m.cfg.SiblingPrefix {
		if len(hashes) > n {
			m.setPending(r, target, hashes)
		} else if s, ok := m.resolveSess(r); ok {
			m.clearPending(s) // everything routed is already resident
		}
	}
}

// advance is the multi-turn fast path: when a frontier of the session on target sits at known
// depth d (rooted) and matched repeats its block at d, the forest path above it is matched's
// own prefix (chained hashes), so only matched[d:] is linked and the frontier moves down without
// walking the shared prefix. It reports false when it does not apply.
func (m *Tracker) advance(r sessRef, target kvkey.Target, matched []kvkey.BlockHash) bool {
	s, _ := m.resolveSess(r)
	for i := range s.frontiers {
		fr := &s.frontiers[i]
		if fr.target != target {
			continue
		}
		fs, ok := m.f.resolve(fr.node)
		if !ok {
			continue
		}
		d := int(m.f.nodes[fs].depth)
		if d == 0 || d > len(matched) || m.f.nodes[fs].hash != matched[d-1] {
			continue
		}
		m.tick++
		m.markDirty(r)
		if d == len(matched) {
			fr.tick = m.tick
			return true
		}
		slot, err := m.linkEvicting(matched[d:], ParentHash, matched[d-1], r)
		if err != nil {
			m.reject("route", s.id, err)
			return true
		}
		s, _ = m.resolveSess(r)
		m.moveFrontier(s, r, i, slot, s.frontiers[i].top)
		return true
	}
	return false
}

// joinGroup records that a child of parentID landed on target for its first request.
func (m *Tracker) joinGroup(parentID string, child sessRef, target kvkey.Target) {
	p, pr := m.getOrCreate(parentID, true, child)
	m.markDirty(pr)
	m.tick++
	found := false
	for i := range p.group {
		if p.group[i].target == target {
			p.group[i].members++
			p.group[i].tick = m.tick
			found = true
			break
		}
	}
	if !found {
		if len(p.group) >= m.cfg.GroupTargets {
			oldest := 0
			for i := range p.group {
				if p.group[i].tick < p.group[oldest].tick {
					oldest = i
				}
			}
			p.group = append(p.group[:oldest], p.group[oldest+1:]...)
		}
		p.group = append(p.group, groupTarget{target: target, members: 1, tick: m.tick})
	}
	if len(p.children) >= maxChildren {
		p.children = append(p.children[:0], p.children[1:]...)
	}
	p.children = append(p.children, child)
}

// linkEvicting links a chain, evicting least recently used sessions (never protect) while the
// forest is full.
func (m *Tracker) linkEvicting(chain []kvkey.BlockHash, kind ParentKind, parent kvkey.BlockHash, protect sessRef) (uint32, error) {
	for {
		slot, err := m.f.link(chain, kind, parent)
		if !errors.Is(err, ErrForestFull) {
			return slot, err
		}
		if !m.evictLRU(protect) {
			return nilSlot, err
		}
	}
}

func (m *Tracker) reject(op, sessionID string, err error) {
	n := m.stats.rejected.Add(1)
	if n <= 16 || n%1024 == 0 {
		m.log.Warn("session prefix update rejected", "op", op, "session", sessionID, "err", err, "rejected_total", n)
	}
}
