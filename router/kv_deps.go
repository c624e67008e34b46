package router

import (
	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/sessions"
)

// RoutedRecorder is a Matcher that also learns which prompt was routed where: the KV
// policy calls NoteRouted with the request's local and chained block hashes when a request is
// begun on a target. It must be quick and safe for concurrent use, and may keep both slices.
type RoutedRecorder interface {
	NoteRouted(t kvkey.Target, local []uint64, seq []kvkey.BlockHash)
}

// EventHealth says whether a target's KV event stream is healthy, i.e. whether the event index
// can be trusted for it. Targets for which it returns false are scored in approximate mode.
// The indexers' subscriber state is meant to satisfy it.
type EventHealth interface {
	EventsHealthy(t kvkey.Target) bool
}

// EventHealthFunc adapts a function to EventHealth.
type EventHealthFunc func(t kvkey.Target) bool

// EventsHealthy calls f.
func (f EventHealthFunc) EventsHealthy(t kvkey.Target) bool { return f(t) }

// HintSource yields soft placement preferences for a request from session state (the sessions
// package). Hints are credited as extra cached blocks; they never override busy thresholds.
type HintSource interface {
	Hints(sessionID, parentID string) []sessions.Hint
}

// PrefixHintSource is a HintSource that can also credit blocks it knows a target is computing
// for a related session right now (sessions.Tracker.HintsWithPrefix). When the KV policy's hint
// source implements it, the policy calls it with the request's block hashes instead of Hints.
type PrefixHintSource interface {
	HintSource
	HintsWithPrefix(sessionID, parentID string, hashes []kvkey.BlockHash) []sessions.Hint
}

// Modes a target is scored in, as reported in CandidateScore.Mode.
const (
	ModeEvents      = "events"
	ModeApproximate = "approximate"
)

// KVDeps are the collaborators of the KV-aware policies. Every field may be nil: without a
// Matcher every target is approximate; without Events every target is trusted to the Matcher;
// without Approx approximate targets get no overlap; without Load a private tracker is made;
// without Hints no session preference applies.
type KVDeps struct {
	Matcher indexers.Matcher // the exact, KV-event index (*indexers.Index)
	Events  EventHealth
	Approx  *indexers.ApproxIndex
	Load    *LoadTracker
	Hints   HintSource
}
