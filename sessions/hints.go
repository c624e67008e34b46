package sessions

import (
	"sort"
	"time"

	"github.com/kvgate/kvgate/workers"
)

// Hints returns the soft placement preferences for a request of sessionID whose parent session is
// parentID (either may be empty). A session that was routed before prefers the target its last
// turn used (Rule "affinity"). A session without affinity that has a parent, with parent-aware
// placement on, prefers the targets where the parent (or the lineage root) has its frontier and
// the targets where its siblings landed (Rules "parent", "lineage_root", "sibling_group"). The
// router folds each hint into its cost as Blocks of credit and still applies its busy thresholds.
func (m *Manager) Hints(sessionID, parentID string) []Hint {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hintsLocked(sessionID, parentID)
}

// HintsWithPrefix returns Hints plus the lineage-aware extra: for a session's first request, the
// blocks of its prompt that the parent's or a sibling's in-flight request on a target is prefilling
// right now, which that target has not announced by KV events yet (Rule "sibling_prefix", Blocks =
// those blocks). Once the events arrive the index credits them and this credit falls to zero, so
// nothing is counted twice.
func (m *Manager) HintsWithPrefix(sessionID, parentID string, hashes []uint64) []Hint {
	m.mu.Lock()
	hints := m.hintsLocked(sessionID, parentID)
	var cands []prefixCand
	if m.idx != nil && *m.cfg.SiblingPrefix && len(hashes) > 0 {
		cands = m.siblingPrefixLocked(sessionID, parentID, hashes)
	}
	m.mu.Unlock()
	// The index is read outside the manager's mutex: it may be applying events concurrently.
	for _, c := range cands {
		if credit := c.blocks - m.idx.DeepestG1(c.target, hashes[:c.blocks]); credit > 0 {
			hints = append(hints, Hint{Target: c.target, Rule: RuleSiblingPrefix, Blocks: float64(credit)})
		}
	}
	return hints
}

func (m *Manager) hintsLocked(sessionID, parentID string) []Hint {
	var s *session
	if sessionID != "" {
		s, _, _ = m.lookup(sessionID)
	}
	if s != nil && s.hasAffinity {
		if m.cfg.AffinityBlocks > 0 {
			return []Hint{{Target: s.affinity, Rule: RuleAffinity, Blocks: m.cfg.AffinityBlocks}}
		}
		return nil
	}
	if parentID == "" && s != nil {
		parentID = s.parent
	}
	if parentID == "" || parentID == sessionID || !*m.cfg.ParentAware || m.cfg.ParentBlocks <= 0 {
		return nil
	}
	parent, _, ok := m.lookup(parentID)
	if !ok {
		return nil
	}
	var hints []Hint
	add := func(t workers.Target, rule string) {
		for _, h := range hints {
			if h.Target == t {
				return
			}
		}
		hints = append(hints, Hint{Target: t, Rule: rule, Blocks: m.cfg.ParentBlocks})
	}
	switch m.cfg.ParentMode {
	case PlaceSiblingGroup:
		m.groupTargets(parent, add)
		if len(hints) == 0 { // first sibling: follow the parent
			m.sessionTargets(parent, RuleParent, add)
		}
	case PlaceLineageRoot:
		m.sessionTargets(m.lineageRoot(parent), RuleLineageRoot, add)
		m.groupTargets(parent, add)
	default:
		m.sessionTargets(parent, RuleParent, add)
		m.groupTargets(parent, add)
	}
	return hints
}

// sessionTargets adds the targets where s has frontiers (most recently updated first), or its
// affinity target when it has no frontier.
func (m *Manager) sessionTargets(s *session, rule string, add func(workers.Target, string)) {
	idx := make([]int, len(s.frontiers))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return s.frontiers[idx[a]].tick > s.frontiers[idx[b]].tick })
	for _, i := range idx {
		add(s.frontiers[i].target, rule)
	}
	if len(s.frontiers) == 0 && s.hasAffinity {
		add(s.affinity, rule)
	}
}

// groupTargets adds the targets where children of parent landed, most members first. When the
// first target got busy and a sibling spilled, both stay preferred (the lineage-aware "warm second
// worker"): later siblings then choose by load between warmed workers instead of a cold one.
func (m *Manager) groupTargets(parent *session, add func(workers.Target, string)) {
	g := append([]groupTarget(nil), parent.group...)
	sort.SliceStable(g, func(a, b int) bool { return g[a].members > g[b].members })
	for _, t := range g {
		add(t.target, RuleSiblingGroup)
	}
}

// lineageRoot follows parent links up to the oldest tracked ancestor.
func (m *Manager) lineageRoot(s *session) *session {
	for hop := 0; hop < maxLineageHops && s.parent != ""; hop++ {
		p, _, ok := m.lookup(s.parent)
		if !ok {
			break
		}
		s = p
	}
	return s
}

// pendEntry queues a pending chain for expiry; at tells it from a later chain of the same session.
type pendEntry struct {
	ref sessRef
	at  time.Time
}

type prefixCand struct {
	target workers.Target
	blocks int
}

// siblingPrefixLocked finds, per target, how many leading blocks of hashes the in-flight prompts of
// the parent and the siblings on that target share.
func (m *Manager) siblingPrefixLocked(sessionID, parentID string, hashes []uint64) []prefixCand {
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
	byTarget := map[workers.Target][]uint32{}
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
func (m *Manager) setPending(r sessRef, target workers.Target, hashes []uint64) {
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
func (m *Manager) clearPending(s *session) {
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
func (m *Manager) expirePending() {
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
