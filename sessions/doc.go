// Package sessions owns session identity (session, parent, end of session), affinity, the
// session prefix index of lineages and per-worker frontiers, and parent-aware placement.
package sessions
