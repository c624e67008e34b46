package sessions

import "sync/atomic"

// Stats counts what the tracker did; Tracker.Stats returns a snapshot.
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

// counters are the tracker's event counters, atomics so that Stats takes no lock; sessions
// and nodes are the sizes publish saw last.
type counters struct {
	created, evicted, closed, rejected        atomic.Uint64
	staleRetries, staleVerified, staleDropped atomic.Uint64
	receded, cleared                          atomic.Uint64
	sessions, nodes                           atomic.Int64
}

// Stats returns a snapshot of the counters (as of the last completed state change).
func (m *Tracker) Stats() Stats {
	c := &m.stats
	return Stats{
		Sessions: int(c.sessions.Load()), Nodes: int(c.nodes.Load()),
		SessionsCreated: c.created.Load(), SessionsEvicted: c.evicted.Load(), SessionsClosed: c.closed.Load(),
		Rejected: c.rejected.Load(), StaleRetries: c.staleRetries.Load(), StaleVerified: c.staleVerified.Load(),
		StaleDropped: c.staleDropped.Load(), FrontiersReceded: c.receded.Load(), FrontiersCleared: c.cleared.Load(),
	}
}
