package sessions

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kvgate/kvgate/workers"
)

// Residency is what the session index needs from the physical (tiered) index.
type Residency interface {
	// ResidencyVersion increases on every removal or clear on the target.
	ResidencyVersion(t workers.Target) uint64
	// IsResidentG1 reports whether the block is resident on the target's GPU.
	IsResidentG1(t workers.Target, hash uint64) bool
	// DeepestG1 returns how many leading hashes are resident on the target's GPU.
	DeepestG1(t workers.Target, hashes []uint64) int
}

// Stats counts what the manager did; Manager.Stats returns a snapshot.
type Stats struct {
	Sessions         int    `json:"sessions"`
	Nodes            int    `json:"nodes"`
	SessionsCreated  uint64 `json:"sessions_created"`
	SessionsEvicted  uint64 `json:"sessions_evicted"`
	SessionsClosed   uint64 `json:"sessions_closed"`
	Rejected         uint64 `json:"rejected_updates"`
	StaleRetries     uint64 `json:"stale_retries"`
	StaleVerified    uint64 `json:"stale_verified"`
	StaleDropped     uint64 `json:"stale_dropped"`
	FrontiersReceded uint64 `json:"frontiers_receded"`
	FrontiersCleared uint64 `json:"frontiers_cleared"`
}

// Manager owns session state: identity records, affinity, the shared prefix forest with per-session
// per-target frontiers, and the hints derived from them. It is safe for concurrent use; every
// method holds one mutex briefly. Event methods (ApplyStored, ApplyRemoved, ApplyCleared) must be
// called after the physical index applied the same event (that order is what makes the residency
// version guard of OnRouted sound), and the caller must not hold a lock that the index's read
// methods need: OnRouted calls ResidencyVersion and, on its rare verify path, DeepestG1 while
// holding the manager's mutex. (indexers.Index reads are lock-free of its per-target writer
// lock, so calling from its Listener is fine.)
type Manager struct {
	cfg Config
	idx Residency
	log *slog.Logger
	now func() time.Time

	mu       sync.Mutex
	f        *forest
	sess     []session
	freeSess []uint32
	byID     map[string]uint32
	head     uint32
	tail     uint32
	tick     uint64
	rev      map[workers.Target]map[NodeRef]revList
	rmHits   []removalHit // ApplyRemoved scratch
	rmBelow  []uint32
	rmSess   []sessRef
	pendQ    []pendEntry // pending chains in routing order, for expiry (stale entries skipped)
	stats    Stats
}

// New returns a Manager. idx may be nil (no KV events): then only affinity and parent placement
// from affinity work, and frontiers come only from stored events.
func New(cfg Config, idx Residency, log *slog.Logger) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	cfg = cfg.withDefaults()
	return &Manager{
		cfg: cfg, idx: idx, log: log.With("component", "sessions"), now: time.Now,
		f:    newForest(cfg.MaxNodes),
		byID: make(map[string]uint32),
		head: nilSlot, tail: nilSlot,
		rev: make(map[workers.Target]map[NodeRef]revList),
	}, nil
}

// Config returns the effective configuration (defaults applied).
func (m *Manager) Config() Config { return m.cfg }

// Stats returns a snapshot of the counters.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.stats
	st.Sessions = len(m.byID)
	st.Nodes = m.f.live()
	return st
}

// Observe records a request's identity: it creates or refreshes the session and remembers its
// parent (the first parent named wins). Call it when the request is parsed, before routing.
func (m *Manager) Observe(id Identity) {
	if id.SessionID == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s, _ := m.getOrCreate(id.SessionID, false, sessRef{slot: nilSlot})
	if s.parent == "" && id.ParentID != "" && id.ParentID != id.SessionID {
		s.parent = id.ParentID
	}
}

// End releases a session's state (end of session). Unknown ids are ignored.
func (m *Manager) End(sessionID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if slot, ok := m.byID[sessionID]; ok {
		m.release(slot)
		m.stats.SessionsClosed++
	}
}

// OnRouted is the post-selection update: the session's later turns prefer target, and its
// frontier on target advances to the deepest block of hashes resident there in G1. The update is
// applied only if the target's residency version did not change while the match was taken
// (retried once; then the matched prefix must still be resident), so a frontier is never
// restored for blocks the index has removed.
func (m *Manager) OnRouted(sessionID string, target workers.Target, hashes []uint64) {
	if sessionID == "" {
		return
	}
	if m.idx == nil || len(hashes) == 0 {
		m.mu.Lock()
		m.routedLocked(sessionID, target, hashes, 0)
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
			m.stats.StaleRetries++
			m.mu.Unlock()
			continue
		case n > 0 && m.idx.DeepestG1(target, hashes[:n]) == n:
			m.stats.StaleVerified++
			m.routedLocked(sessionID, target, hashes, n)
		default:
			m.stats.StaleDropped++
			m.routedLocked(sessionID, target, hashes, 0)
		}
		m.mu.Unlock()
		return
	}
}

// routedLocked applies a routing result with n verified G1 blocks.
func (m *Manager) routedLocked(sessionID string, target workers.Target, hashes []uint64, n int) {
	matched := hashes[:n]
	s, r := m.getOrCreate(sessionID, false, sessRef{slot: nilSlot})
	first := !s.hasAffinity
	s.hasAffinity, s.affinity = true, target
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
	if *m.cfg.SiblingPrefix {
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
func (m *Manager) advance(r sessRef, target workers.Target, matched []uint64) bool {
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
func (m *Manager) joinGroup(parentID string, child sessRef, target workers.Target) {
	p, _ := m.getOrCreate(parentID, true, child)
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
func (m *Manager) linkEvicting(chain []uint64, kind ParentKind, parent uint64, protect sessRef) (uint32, error) {
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

func (m *Manager) reject(op, sessionID string, err error) {
	m.stats.Rejected++
	if m.stats.Rejected <= 16 || m.stats.Rejected%1024 == 0 {
		m.log.Warn("session prefix update rejected", "op", op, "session", sessionID, "err", err, "rejected_total", m.stats.Rejected)
	}
}

// setFrontier makes slot (a freshly linked, possibly unreferenced node) a frontier of s on target:
// an existing frontier that is an ancestor is replaced; if one is already at or below slot the
// session knows more than this update and only its vouched range grows; otherwise slot is a new
// branch. A claim vouches for slot's whole current lineage: route-time matches are leading runs
// and vLLM stores a block only while its prefix is resident.
func (m *Manager) setFrontier(s *session, r sessRef, target workers.Target, slot uint32) {
	m.tick++
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
func (m *Manager) addFrontier(s *session, r sessRef, target workers.Target, slot uint32, top NodeRef) {
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
func (m *Manager) moveFrontier(s *session, r sessRef, i int, slot uint32, top NodeRef) {
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
func (m *Manager) dropFrontier(s *session, r sessRef, i int) {
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

func (m *Manager) revAdd(t workers.Target, n NodeRef, r sessRef) {
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
func (m *Manager) revDel(t workers.Target, n NodeRef, r sessRef) {
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

// ApplyStored applies a BlockStored on target (G1 only: the caller passes GPU events), with our
// hashes of the stored blocks in chain order. parentOurHash is our hash of the parent block, 0
// when the first block is block 0 of a prompt. When sessionID names a tracked session its frontier
// on target advances to the last block; otherwise only the forest learns the parentage (grafting
// temporary roots). Conflicting or cyclic parentage is rejected with an error and nothing changes.
func (m *Manager) ApplyStored(target workers.Target, ourHashes []uint64, parentOurHash uint64, sessionID string) error {
	if len(ourHashes) == 0 {
		return nil
	}
	kind := ParentNone
	if parentOurHash != 0 {
		kind = ParentHash
	}
	m.mu.Lock()
	defer m.mu.Unlock()
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
func (m *Manager) ApplyRemoved(target workers.Target, ourHashes []uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
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
func (m *Manager) recede(s *session, r sessRef, target workers.Target, from NodeRef, below []uint32, to uint32) {
	for i := range s.frontiers {
		fr := s.frontiers[i]
		if fr.target != target || fr.node != from {
			continue
		}
		m.stats.FrontiersReceded++
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
func (m *Manager) ApplyCleared(target workers.Target) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for ref, list := range m.rev[target] {
		for _, r := range list.appendTo(nil) {
			s, ok := m.resolveSess(r)
			if !ok {
				continue
			}
			for i := len(s.frontiers) - 1; i >= 0; i-- {
				if s.frontiers[i].target == target && s.frontiers[i].node == ref {
					m.dropFrontier(s, r, i)
					m.stats.FrontiersCleared++
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
