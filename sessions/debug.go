package sessions

import (
	"fmt"
	"sort"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// Frontier is one of a session's deepest blocks known resident on a target.
type Frontier struct {
	Target  kvkey.Target    `json:"target"`
	Hash    kvkey.BlockHash `json:"-"`
	HashHex string          `json:"hash"`
	// Depth counts blocks from the lineage's top down to the frontier, inclusive.
	Depth int `json:"depth"`
	// Rooted is false when the top is a temporary root (the blocks above it are not known yet).
	Rooted bool `json:"rooted"`
	// Lineage lists the blocks from the top (or the anchor) down to the frontier, when requested.
	Lineage []string `json:"lineage,omitempty"`
}

// GroupMember is a target where children of a session landed.
type GroupMember struct {
	Target  kvkey.Target `json:"target"`
	Members int          `json:"members"`
}

// SessionView is the JSON body of GET /debug/sessions/{id}.
type SessionView struct {
	ID        string        `json:"id"`
	ParentID  string        `json:"parent_session_id,omitempty"`
	RootID    string        `json:"root_session_id,omitempty"`
	Implicit  bool          `json:"implicit,omitempty"`
	Affinity  *kvkey.Target `json:"affinity,omitempty"`
	Routed    uint64        `json:"routed_requests"`
	Created   time.Time     `json:"created"`
	LastSeen  time.Time     `json:"last_seen"`
	Frontiers []Frontier    `json:"frontiers"`
	Children  []string      `json:"children,omitempty"`
	Group     []GroupMember `json:"sibling_group,omitempty"`
	Pending   *Frontier     `json:"in_flight_prompt,omitempty"`
	// Hints is what the router would be told for this session's next request.
	Hints []HintView `json:"hints"`
	// Shared is the fleet's binding of the session (several replicas, cluster section).
	Shared *SharedBinding `json:"shared,omitempty"`
}

// HintView is a Hint as the debug view shows it (snake_case keys like the rest of the API).
type HintView struct {
	Target kvkey.Target `json:"target"`
	Rule   string       `json:"rule"`
	Blocks float64      `json:"blocks"`
}

// Frontiers returns the session's frontiers on every target (nil for an unknown session).
func (m *Tracker) Frontiers(sessionID string) []Frontier {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, _, ok := m.lookup(sessionID)
	if !ok {
		return nil
	}
	return m.frontierViews(s, false)
}

// Lineage returns, for each of the session's frontiers on target, the block hashes from the root
// down to the frontier; with anchor non-nil, from that block down, skipping frontiers whose path
// does not contain it.
func (m *Tracker) Lineage(sessionID string, target kvkey.Target, anchor *kvkey.BlockHash) [][]kvkey.BlockHash {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, _, ok := m.lookup(sessionID)
	if !ok {
		return nil
	}
	var out [][]kvkey.BlockHash
	for _, fr := range s.frontiers {
		if fr.target != target {
			continue
		}
		slot, ok := m.f.resolve(fr.node)
		if !ok {
			continue
		}
		var a kvkey.BlockHash
		if anchor != nil {
			a = *anchor
		}
		if hs, ok := m.f.lineage(slot, a, anchor != nil); ok {
			out = append(out, hs)
		}
	}
	return out
}

// Root returns the id of the root of sessionID's lineage: its top-most tracked ancestor, its
// parent when that is not tracked, the session itself without a parent, "" when the session
// is unknown. An agent's program (a session and all its subagents) shares one root.
func (m *Tracker) Root(sessionID string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, _, ok := m.lookup(sessionID)
	switch {
	case !ok:
		return ""
	case s.parent == "":
		return s.id
	}
	if root := m.lineageRoot(s); root != s {
		return root.id
	}
	return s.parent
}

// Debug returns the debug view of a session; withLineage adds every frontier's block lineage.
func (m *Tracker) Debug(sessionID string, withLineage bool) (SessionView, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, _, ok := m.lookup(sessionID)
	if !ok {
		return SessionView{}, false
	}
	v := SessionView{ID: s.id, ParentID: s.parent, Implicit: s.implicit, Routed: s.routed,
		Created: s.created, LastSeen: s.lastSeen, Frontiers: m.frontierViews(s, withLineage)}
	if s.parent != "" {
		if root := m.lineageRoot(s); root != s {
			v.RootID = root.id
		} else {
			v.RootID = s.parent // the parent is not tracked: the root is at least that far up
		}
	}
	if s.hasAffinity {
		t := s.affinity
		v.Affinity = &t
	}
	if b, ok := m.sharedLookup(s.id); ok {
		v.Shared = &b
	}
	for _, c := range s.children {
		if cs, ok := m.resolveSess(c); ok {
			v.Children = append(v.Children, cs.id)
		}
	}
	for _, g := range s.group {
		v.Group = append(v.Group, GroupMember{Target: g.target, Members: g.members})
	}
	if s.hasPending {
		if slot, ok := m.f.resolve(s.pending.node); ok {
			d, rooted := m.f.depth(slot)
			v.Pending = &Frontier{Target: s.pending.target, Hash: m.f.nodes[slot].hash,
				HashHex: fmt.Sprintf("%016x", m.f.nodes[slot].hash), Depth: d, Rooted: rooted}
		}
	}
	v.Hints = []HintView{}
	m.hints.mu.RLock() // the lock order allows it: m.mu, then the hint table's
	hs := m.hintsLocked(s.id, s.parent)
	m.hints.mu.RUnlock()
	for _, h := range hs {
		v.Hints = append(v.Hints, HintView(h))
	}
	return v, true
}

func (m *Tracker) frontierViews(s *session, withLineage bool) []Frontier {
	out := make([]Frontier, 0, len(s.frontiers))
	for _, fr := range s.frontiers {
		slot, ok := m.f.resolve(fr.node)
		if !ok {
			continue
		}
		d, rooted := m.f.depth(slot)
		h := m.f.nodes[slot].hash
		v := Frontier{Target: fr.target, Hash: h, HashHex: fmt.Sprintf("%016x", h), Depth: d, Rooted: rooted}
		if withLineage {
			hs, _ := m.f.lineage(slot, 0, false)
			for _, x := range hs {
				v.Lineage = append(v.Lineage, fmt.Sprintf("%016x", x))
			}
		}
		out = append(out, v)
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].Target != out[b].Target {
			return out[a].Target.String() < out[b].Target.String()
		}
		return out[a].Depth > out[b].Depth
	})
	return out
}
