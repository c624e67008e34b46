package sessions

import (
	"sync"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// hintTable is the hint side of the tracker: per session, the few fields Hints reads, kept
// under their own read-write lock. The state side (forest, frontiers, reverse index, pending
// chains, identity slab and LRU, all under Tracker.mu) republishes a session's record whenever
// it changed something the record holds, at the end of the operation and while still holding
// Tracker.mu, so records change in the same order as the state. Hint lookups take only the read
// lock: they wait at most for a publish, never for an event batch or a forest walk.
type hintTable struct {
	mu   sync.RWMutex
	byID map[string]*hintRec
}

// hintRec is what placement hints need of one session.
type hintRec struct {
	parent      string
	hasAffinity bool
	affinity    kvkey.Target
	affAt       time.Time
	frontiers   []targetTick // the session's frontiers' targets with their last update
	group       []groupTarget
}

// targetTick is one frontier as hints see it.
type targetTick struct {
	target kvkey.Target
	tick   uint64
}

// markDirty queues session r's hint record for the next publish; m.mu must be held.
func (m *Tracker) markDirty(r sessRef) {
	if n := len(m.dirty); n > 0 && m.dirty[n-1] == r {
		return
	}
	m.dirty = append(m.dirty, r)
}

// publish writes the queued hint records (deleting those of released sessions) and the size
// counters; m.mu must be held. Every state change calls it before releasing m.mu.
func (m *Tracker) publish() {
	m.stats.sessions.Store(int64(len(m.byID)))
	m.stats.nodes.Store(int64(m.f.live()))
	if len(m.dirty) == 0 && len(m.gone) == 0 {
		return
	}
	t := &m.hints
	t.mu.Lock()
	for _, id := range m.gone {
		delete(t.byID, id)
	}
	for _, r := range m.dirty {
		s, ok := m.resolveSess(r)
		if !ok {
			continue // released since: its id is in gone (or its slot was reused, dirty too)
		}
		rec := t.byID[s.id]
		if rec == nil {
			rec = &hintRec{}
			t.byID[s.id] = rec
		}
		rec.parent, rec.hasAffinity, rec.affinity, rec.affAt = s.parent, s.hasAffinity, s.affinity, s.affAt
		rec.frontiers = rec.frontiers[:0]
		for _, fr := range s.frontiers {
			rec.frontiers = append(rec.frontiers, targetTick{target: fr.target, tick: fr.tick})
		}
		rec.group = append(rec.group[:0], s.group...)
	}
	t.mu.Unlock()
	clear(m.gone)
	m.gone, m.dirty = m.gone[:0], m.dirty[:0]
	if cap(m.dirty) > 4096 { // one huge removal batch must not pin its scratch
		m.dirty = nil
	}
}
