package sessions

import (
	"sort"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// pendEntry queues a pending chain for expiry; at tells it from a later chain of the same session.
type pendEntry struct {
	ref sessRef
	at  time.Time
}

type prefixCand struct {
	target kvkey.Target
	blocks int
}

// siblingPrefixLocked finds, per target, how many leading blocks of hashes the in-flight prompts of
// the parent and the siblings on that target share.
func (m *Tracker) siblingPrefixLocked(sessionID, parentID string, hashes []kvkey.BlockHash) []prefixCand {
	var s *session
	if sessionID != "" {
		s, _, _ = m.lookup(sessionID)
	}
	if s != nil && s.hasAffinity {
		return nil
	}
	if parentID == "" && s != nil {
		parentID = s.parent
	}
	parent, _, ok := m.lookup(parentID)
	if parentID == "" || !ok {
		return nil
	}
	m.expirePending()
	byTarget := map[kvkey.Target][]uint32{}
	consider := func(x *session) {
		if x == nil || !x.hasPending || x.id == sessionID {
			return
		}
		if slot, ok := m.f.resolve(x.pending.node); ok {
			byTarget[x.pending.target] = append(byTarget[x.pending.target], slot)
		}
	}
	consider(parent)
	for _, c := range parent.children {
		if x, ok := m.resolveSess(c); ok {
			consider(x)
		}
	}
	var out []prefixCand
	for t, slots := range byTarget {
		// Mark the union of the relatives' prompt paths; walks stop where paths merge.
		stamp := m.f.nextStamp()
		for _, slot := range slots {
			for x := slot; x != nilSlot && m.f.nodes[x].mark != stamp; x = m.f.nodes[x].parent {
				m.f.nodes[x].mark = stamp
			}
		}
		// Chained hashes make "block i is on a marked path" prefix-closed in i: binary search.
		on := func(i int) bool {
			x, ok := m.f.byHash[hashes[i]]
			return ok && m.f.nodes[x].mark == stamp
		}
		n := sort.Search(len(hashes), func(i int) bool { return !on(i) })
		if n > 0 {
			out = append(out, prefixCand{target: t, blocks: n})
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].target.String() < out[b].target.String() })
	return out
}

// setPending records the routed prompt of session r as in flight on target.
func (m *Tracker) setPending(r sessRef, target kvkey.Target, hashes []kvkey.BlockHash) {
	slot, err := m.linkEvicting(hashes, ParentNone, 0, r)
	if err != nil {
		m.reject("pending", "", err)
		return
	}
	s, ok := m.resolveSess(r)
	if !ok {
		m.f.reclaim(slot)
		return
	}
	m.f.addRef(slot)
	m.clearPending(s)
	s.pending = pendingChain{target: target, node: m.f.ref(slot), at: m.now()}
	s.hasPending = true
	m.pendQ = append(m.pendQ, pendEntry{ref: r, at: s.pending.at})
}

// clearPending releases a session's in-flight prompt.
func (m *Tracker) clearPending(s *session) {
	if !s.hasPending {
		return
	}
	s.hasPending = false
	if slot, ok := m.f.resolve(s.pending.node); ok {
		m.f.dropRef(slot)
	}
	s.pending = pendingChain{}
}

// expirePending releases in-flight prompts older than PendingTTL (oldest first).
func (m *Tracker) expirePending() {
	now := m.now()
	i := 0
	for ; i < len(m.pendQ); i++ {
		e := m.pendQ[i]
		s, ok := m.resolveSess(e.ref)
		if !ok || !s.hasPending || !s.pending.at.Equal(e.at) {
			continue // the session ended or re-routed: a newer entry follows
		}
		if now.Sub(e.at) < m.cfg.PendingTTL {
			break
		}
		m.clearPending(s)
	}
	if i > 0 {
		m.pendQ = append(m.pendQ[:0], m.pendQ[i:]...)
	}
	// Re-routed sessions leave stale entries behind; compact so the queue stays within a small
	// multiple of the session cap whatever the request rate.
	if len(m.pendQ) > 4*m.cfg.MaxSessions {
		live := m.pendQ[:0]
		for _, e := range m.pendQ {
			if s, ok := m.resolveSess(e.ref); ok && s.hasPending && s.pending.at.Equal(e.at) {
				live = append(live, e)
			}
		}
		m.pendQ = live
	}
}
