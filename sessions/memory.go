package sessions

// BytesPerNode is the approximate memory of one node of the session prefix forest: the slab
// entry (doubled: the slab grows by doubling), the hash map slot and the reverse index's share,
// estimated from the structs' sizes with Go's map overhead.
const BytesPerNode = 128

// BytesPerSession is the approximate memory of one tracked session: the slab entry, its id and
// parent id, a few frontiers and children, the hint record and the map slots.
const BytesPerSession = 1024

// MemoryUse reports the forest's and the sessions' estimated bytes in use (at BytesPerNode and
// BytesPerSession) and their budgets (max_nodes and max_sessions at the same rates).
func (m *Tracker) MemoryUse() (forestUsed, forestBudget, sessionsUsed, sessionsBudget int64) {
	st := m.Stats()
	return int64(st.Nodes) * BytesPerNode, int64(m.cfg.MaxNodes) * BytesPerNode,
		int64(st.Sessions) * BytesPerSession, int64(m.cfg.MaxSessions) * BytesPerSession
}
