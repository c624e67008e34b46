package sessions

import (
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// sessRef names a session slot by generation, like NodeRef for nodes.
type sessRef struct {
	slot uint32
	gen  uint32
}

// frontier is one of a session's deepest blocks known resident on a target.
type frontier struct {
	target kvkey.Target
	node   NodeRef
	// top is the highest block the claim vouches for: the top of node's lineage when the claim
	// was made. A later graft can attach ancestors above it whose removals on this target may
	// have been missed while they were not connected, so only top..node is known resident.
	top  NodeRef
	tick uint64 // logical time of the last update, for per-target eviction
}

// groupTarget is a target where children of a session landed, with how many did.
type groupTarget struct {
	target  kvkey.Target
	members int
	tick    uint64
}

// pendingChain is a routed prompt whose blocks beyond the G1 match are being prefilled and not
// yet announced by KV events (the lineage-aware extra credits them to relatives).
type pendingChain struct {
	target kvkey.Target
	node   NodeRef // deepest prompt block; holds a forest reference while set
	at     time.Time
}

// maxChildren bounds the recent children remembered per session (for sibling-prefix credit).
const maxChildren = 8

// maxLineageHops bounds walks up the session parent chain (lineage-root mode, debug).
const maxLineageHops = 64

// session is one tracked session, kept in a slab with an intrusive LRU list.
type session struct {
	id         string
	parent     string
	gen        uint32
	live       bool
	implicit   bool // created only because a child named it as parent
	prev, next uint32

	hasAffinity bool
	affinity    kvkey.Target
	affAt       time.Time // when affinity was last set (weighed against a shared binding's Seen)
	frontiers   []frontier
	group       []groupTarget
	children    []sessRef
	pending     pendingChain
	hasPending  bool

	created  time.Time
	lastSeen time.Time
	routed   uint64
}

// lookup returns the live session named id.
func (m *Tracker) lookup(id string) (*session, sessRef, bool) {
	slot, ok := m.byID[id]
	if !ok {
		return nil, sessRef{}, false
	}
	s := &m.sess[slot]
	return s, sessRef{slot: slot, gen: s.gen}, true
}

// resolveSess returns the session r names if it still lives.
func (m *Tracker) resolveSess(r sessRef) (*session, bool) {
	if int(r.slot) >= len(m.sess) {
		return nil, false
	}
	s := &m.sess[r.slot]
	if !s.live || s.gen != r.gen {
		return nil, false
	}
	return s, true
}

// getOrCreate returns the session id, creating it (and evicting the least recently used session
// at the cap, never protect) when absent. It moves the session to the front of the LRU.
func (m *Tracker) getOrCreate(id string, implicit bool, protect sessRef) (*session, sessRef) {
	if s, r, ok := m.lookup(id); ok {
		if !implicit {
			s.implicit = false
			m.touch(r.slot)
		}
		return s, r
	}
	for len(m.byID) >= m.cfg.MaxSessions {
		if !m.evictLRU(protect) {
			break
		}
	}
	var slot uint32
	if k := len(m.freeSess); k > 0 {
		slot = m.freeSess[k-1]
		m.freeSess = m.freeSess[:k-1]
	} else {
		m.sess = append(m.sess, session{})
		slot = uint32(len(m.sess) - 1)
	}
	s := &m.sess[slot]
	gen := s.gen
	now := m.now()
	*s = session{id: id, gen: gen, live: true, implicit: implicit, prev: nilSlot, next: nilSlot,
		created: now, lastSeen: now}
	m.byID[id] = slot
	m.pushFront(slot)
	m.markDirty(sessRef{slot: slot, gen: gen})
	m.stats.created.Add(1)
	return s, sessRef{slot: slot, gen: gen}
}

func (m *Tracker) touch(slot uint32) {
	m.sess[slot].lastSeen = m.now()
	if m.head == slot {
		return
	}
	m.unlink(slot)
	m.pushFront(slot)
}

func (m *Tracker) pushFront(slot uint32) {
	s := &m.sess[slot]
	s.prev, s.next = nilSlot, m.head
	if m.head != nilSlot {
		m.sess[m.head].prev = slot
	}
	m.head = slot
	if m.tail == nilSlot {
		m.tail = slot
	}
}

func (m *Tracker) unlink(slot uint32) {
	s := &m.sess[slot]
	if s.prev != nilSlot {
		m.sess[s.prev].next = s.next
	} else {
		m.head = s.next
	}
	if s.next != nilSlot {
		m.sess[s.next].prev = s.prev
	} else {
		m.tail = s.prev
	}
	s.prev, s.next = nilSlot, nilSlot
}

// evictLRU releases the least recently used session other than protect; false if none.
func (m *Tracker) evictLRU(protect sessRef) bool {
	slot := m.tail
	for slot != nilSlot && slot == protect.slot && m.sess[slot].gen == protect.gen {
		slot = m.sess[slot].prev
	}
	if slot == nilSlot {
		return false
	}
	m.release(slot)
	m.stats.evicted.Add(1)
	return true
}

// release drops every piece of a session's state and frees its slot.
func (m *Tracker) release(slot uint32) {
	s := &m.sess[slot]
	r := sessRef{slot: slot, gen: s.gen}
	for len(s.frontiers) > 0 {
		m.dropFrontier(s, r, len(s.frontiers)-1)
	}
	m.clearPending(s)
	m.unlink(slot)
	delete(m.byID, s.id)
	m.gone = append(m.gone, s.id)
	gen := s.gen + 1
	*s = session{gen: gen, prev: nilSlot, next: nilSlot}
	m.freeSess = append(m.freeSess, slot)
}
