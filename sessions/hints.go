package sessions

import (
	"sort"

	"github.com/kvgate/kvgate/kvkey"
)

// Hints returns the soft placement preferences for a request of sessionID whose parent session is
// parentID (either may be empty). A session that was routed before prefers the target its last
// turn used (Rule "affinity"). A session without affinity that has a parent, with parent-aware
// placement on, prefers the targets where the parent (or the lineage root) has its frontier and
// the targets where its siblings landed (Rules "parent", "lineage_root", "sibling_group"). The
// router folds each hint into its cost as Blocks of credit and still applies its busy thresholds.
//
// Hints reads only the hint table (under its read lock): it never waits for event application.
func (m *Tracker) Hints(sessionID, parentID string) []Hint {
	m.hints.mu.RLock()
	defer m.hints.mu.RUnlock()
	return m.hintsLocked(sessionID, parentID)
}

// HintsWithPrefix returns Hints plus the lineage-aware extra: for a session's first request, the
// blocks of its prompt that the parent's or a sibling's in-flight request on a target is prefilling
// right now, which that target has not announced by KV events yet (Rule "sibling_prefix", Blocks =
// those blocks). Once the events arrive the index credits them and this credit falls to zero, so
// nothing is counted twice.
//
// The hint table answers the common case alone (a session with affinity, or no parent); only a
// session's first request with a parent takes the state lock, to read the relatives' in-flight
// prompts in the forest.
func (m *Tracker) HintsWithPrefix(sessionID, parentID string, hashes []kvkey.BlockHash) []Hint {
	m.hints.mu.RLock()
	hints := m.hintsLocked(sessionID, parentID)
	needPrefix := m.idx != nil && m.cfg.SiblingPrefix && len(hashes) > 0 && m.wantsPrefixLocked(sessionID, parentID)
	m.hints.mu.RUnlock()
	var cands []prefixCand
	if needPrefix {
		m.mu.Lock()
		cands = m.siblingPrefixLocked(sessionID, parentID, hashes)
		m.publish()
		m.mu.Unlock()
	}
	// The index is read outside the tracker's mutex: it may be applying events concurrently.
	for _, c := range cands {
		if credit := c.blocks - m.idx.DeepestG1(c.target, hashes[:c.blocks]); credit > 0 {
			hints = append(hints, Hint{Target: c.target, Rule: RuleSiblingPrefix, Blocks: float64(credit)})
		}
	}
	return hints
}

// wantsPrefixLocked reports whether sibling-prefix credit can apply: the session has no
// affinity and names (or has) a tracked parent; m.hints.mu must be held.
func (m *Tracker) wantsPrefixLocked(sessionID, parentID string) bool {
	s := m.hints.byID[sessionID]
	if s != nil && s.hasAffinity {
		return false
	}
	if _, ok := m.sharedLookup(sessionID); ok {
		return false // the fleet has routed it before: affinity applies, not a first request
	}
	if parentID == "" && s != nil {
		parentID = s.parent
	}
	return parentID != "" && m.hints.byID[parentID] != nil
}

// hintsLocked computes the hints from the hint table; m.hints.mu must be held (read or write).
func (m *Tracker) hintsLocked(sessionID, parentID string) []Hint {
	var s *hintRec
	if sessionID != "" {
		s = m.hints.byID[sessionID]
	}
	// The fleet's binding wins over this replica's affinity unless this replica routed the
	// session after it learned the binding (e.g. while the store was unreachable).
	if b, ok := m.sharedLookup(sessionID); ok && (s == nil || !s.hasAffinity || b.Seen.After(s.affAt)) {
		if m.cfg.AffinityBlocks > 0 {
			return []Hint{{Target: b.Target, Rule: RuleSharedAffinity, Blocks: m.cfg.AffinityBlocks}}
		}
		return nil
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
	if parentID == "" || parentID == sessionID || !m.cfg.ParentAware || m.cfg.ParentBlocks <= 0 {
		return nil
	}
	parent := m.hints.byID[parentID]
	if parent == nil || !parent.hasAffinity && len(parent.frontiers) == 0 {
		// The parent was routed by another replica: its fleet binding places the child, next to
		// the siblings this replica saw land.
		if b, ok := m.sharedLookup(parentID); ok {
			return m.sharedParentHints(parent, parentID, b.Target)
		}
		if parent == nil {
			return nil
		}
	}
	var hints []Hint
	add := func(t kvkey.Target, rule string) {
		for _, h := range hints {
			if h.Target == t {
				return
			}
		}
		hints = append(hints, Hint{Target: t, Rule: rule, Blocks: m.cfg.ParentBlocks})
	}
	switch m.cfg.ParentMode {
	case PlaceSiblingGroup:
		groupTargets(parent, add)
		m.sharedGroup(parentID, add)
		if len(hints) == 0 { // first sibling: follow the parent
			sessionTargets(parent, RuleParent, add)
		}
	case PlaceLineageRoot:
		sessionTargets(m.hintRoot(parent), RuleLineageRoot, add)
		groupTargets(parent, add)
		m.sharedGroup(parentID, add)
	default:
		sessionTargets(parent, RuleParent, add)
		groupTargets(parent, add)
		m.sharedGroup(parentID, add)
	}
	return hints
}

// sharedParentHints are the parent-aware hints for a child whose parent this replica never
// routed (parent may be nil): the parent's fleet binding pt (Rule "shared_parent") and the
// targets where siblings landed, here and across the fleet; in sibling-group mode the siblings
// alone once there are any, as for a locally routed parent.
func (m *Tracker) sharedParentHints(parent *hintRec, parentID string, pt kvkey.Target) []Hint {
	var hints []Hint
	add := func(t kvkey.Target, rule string) {
		for _, h := range hints {
			if h.Target == t {
				return
			}
		}
		hints = append(hints, Hint{Target: t, Rule: rule, Blocks: m.cfg.ParentBlocks})
	}
	if parent != nil {
		groupTargets(parent, add)
	}
	m.sharedGroup(parentID, add)
	if len(hints) == 0 || m.cfg.ParentMode != PlaceSiblingGroup {
		add(pt, RuleSharedParent)
	}
	return hints
}

// sessionTargets adds the targets where s has frontiers (most recently updated first), or its
// affinity target when it has no frontier.
func sessionTargets(s *hintRec, rule string, add func(kvkey.Target, string)) {
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
func groupTargets(parent *hintRec, add func(kvkey.Target, string)) {
	g := append([]groupTarget(nil), parent.group...)
	sort.SliceStable(g, func(a, b int) bool { return g[a].members > g[b].members })
	for _, t := range g {
		add(t.target, RuleSiblingGroup)
	}
}

// hintRoot follows parent links in the hint table up to the oldest tracked ancestor.
func (m *Tracker) hintRoot(s *hintRec) *hintRec {
	for hop := 0; hop < maxLineageHops && s.parent != ""; hop++ {
		p := m.hints.byID[s.parent]
		if p == nil {
			break
		}
		s = p
	}
	return s
}

// lineageRoot follows parent links up to the oldest tracked ancestor; m.mu must be held.
func (m *Tracker) lineageRoot(s *session) *session {
	for hop := 0; hop < maxLineageHops && s.parent != ""; hop++ {
		p, _, ok := m.lookup(s.parent)
		if !ok {
			break
		}
		s = p
	}
	return s
}
