package sessions

import (
	"context"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// SharedBindings is the fleet's view of session bindings when several gateway replicas act as
// one (cluster.Bindings implements it over a NATS JetStream key-value bucket). A replica that
// never saw a session, or a subagent's parent, gets the same affinity and parent hints from it
// as the replica that routed it. Every method but Sync must return at once: Lookup reads a local
// cache and Routed, Released and Ended write behind, so the request path waits on the network
// only in Sync, and only while the cache is known to be behind; an unreachable store degrades
// to this replica's own state.
type SharedBindings interface {
	// Lookup returns the fleet's binding of sessionID, if this replica knows one.
	Lookup(sessionID string) (SharedBinding, bool)
	// Routed reports that this replica sent a turn of sessionID (a child of parentID, or "")
	// to t.
	Routed(sessionID, parentID string, t kvkey.Target)
	// Group returns where the children of parentID landed across the fleet (the shared
	// sibling group), most members first.
	Group(parentID string) []GroupMember
	// Sync is called before a request of sessionID (a child of parentID, or "") is routed,
	// outside every lock: while the replica's view is known to lag the store (after a
	// reconnect, until it caught up) it reads those two bindings from the store, bounded by
	// ctx and the store's own deadline; otherwise it returns at once.
	Sync(ctx context.Context, sessionID, parentID string)
	// Ended reports that sessionID ended (its binding is dropped fleet-wide).
	Ended(sessionID string)
	// Released reports that a request of sessionID this replica sent to t is over (its lease
	// ended). Each Routed of a request is paired with one Released: while a session has
	// requests in flight its binding is kept alive, and the lease end refreshes it.
	Released(sessionID string, t kvkey.Target)
}

// SharedBinding is one session's fleet-wide binding as this replica knows it.
type SharedBinding struct {
	// Target is the worker+rank the session's turns go to.
	Target kvkey.Target `json:"target"`
	// Writer is the replica that wrote the binding last.
	Writer string `json:"writer,omitempty"`
	// Seen is when this replica learned the binding (its own clock): a turn this replica
	// routed later, while the store could not hear it, takes precedence.
	Seen time.Time `json:"seen"`
}

// Hint rules for preferences that come from the fleet's shared bindings rather than this
// replica's own state.
const (
	// RuleSharedAffinity is affinity to the target the fleet's binding of the session names.
	RuleSharedAffinity = "shared_affinity"
	// RuleSharedParent is parent-aware placement from the parent's fleet binding (the parent
	// was routed by another replica).
	RuleSharedParent = "shared_parent"
	// RuleSharedSiblingGroup prefers where the parent's children landed across the fleet.
	RuleSharedSiblingGroup = "shared_sibling_group"
)

// SetShared connects the tracker to the fleet's bindings. Call it before the tracker is used.
func (m *Tracker) SetShared(s SharedBindings) { m.shared = s }

// SyncShared brings the fleet's bindings of sessionID and parentID up to date before the
// request is routed, when the shared bindings' view is known to lag (SharedBindings.Sync).
// Call it outside every lock, with the request's context.
func (m *Tracker) SyncShared(ctx context.Context, sessionID, parentID string) {
	if m.shared == nil || (sessionID == "" && parentID == "") {
		return
	}
	m.shared.Sync(ctx, sessionID, parentID)
}

// OnReleased reports the end of a request of sessionID that was sent to target (after its
// OnRouted) to the shared bindings, if any.
func (m *Tracker) OnReleased(sessionID string, target kvkey.Target) {
	if m.shared == nil || sessionID == "" {
		return
	}
	m.shared.Released(sessionID, target)
}

// sharedGroup adds the fleet's sibling group of parentID, if any, to add.
func (m *Tracker) sharedGroup(parentID string, add func(kvkey.Target, string)) {
	if m.shared == nil || parentID == "" {
		return
	}
	for _, g := range m.shared.Group(parentID) {
		add(g.Target, RuleSharedSiblingGroup)
	}
}

// sharedLookup is Lookup on the shared bindings, if any.
func (m *Tracker) sharedLookup(sessionID string) (SharedBinding, bool) {
	if m.shared == nil || sessionID == "" {
		return SharedBinding{}, false
	}
	return m.shared.Lookup(sessionID)
}
