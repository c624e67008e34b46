package router

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/sessions"
)

// Debugger serves the routing side's part of the admin listener's debug endpoints as JSON-able
// views; the server adds what it owns (worker health) and never looks behind the interface.
type Debugger interface {
	// DebugTargets returns, in order, what routing knows about each target for
	// GET /debug/workers.
	DebugTargets(ts []kvkey.Target) []TargetView
	// DebugFleet returns the fleet-wide part of GET /debug/workers.
	DebugFleet() FleetView
	// DebugSession returns the body of GET /debug/sessions/{id}; an error wrapping
	// ErrNoSession says why there is none (not tracked, or unknown).
	DebugSession(id string, lineage bool) (any, error)
	// DebugPins lists the Responses API pins (response id → target), most recently used
	// first, at most limit.
	DebugPins(limit int) []PinView
}

// DebugPins implements Debugger.
func (e *Dispatcher) DebugPins(limit int) []PinView { return e.pins.view(limit) }

// ErrNoSession is wrapped by DebugSession's errors: the session has no view (the server
// answers 404 with the error's message).
var ErrNoSession = errors.New("no such session")

// noSession is a DebugSession error: its message is the whole client-facing answer.
type noSession string

func (e noSession) Error() string      { return string(e) }
func (noSession) Is(target error) bool { return target == ErrNoSession }

// TargetView is routing's part of one worker+rank in GET /debug/workers.
type TargetView struct {
	// Mode is how the KV-aware policy scores the target: "events" (the KV-event index) or
	// "approximate" (predicted from the gateway's own routing). Empty for other policies.
	Mode string `json:"mode,omitempty"`
	// Subscription is the KV-event stream and index state of this target (nil without events).
	Subscription *indexers.TargetDebug `json:"subscription,omitempty"`
	// IndexBlocks is how many blocks the event index holds for the target.
	IndexBlocks int `json:"index_blocks"`
	// ApproximateBlocks is how many blocks approximate mode assumes cached there.
	ApproximateBlocks *int         `json:"approximate_blocks,omitempty"`
	Load              *LoadView    `json:"load,omitempty"`
	Metrics           *MetricsView `json:"metrics,omitempty"`
	// Latency is the kv policy's TTFT model of the target: fitted θ, samples, readiness,
	// prediction error (nil for other policies).
	Latency *LatencyView `json:"latency,omitempty"`
	// Peers is the other replicas' share of the target's load, which scoring adds to Load
	// (nil when not clustered).
	Peers *PeerShare `json:"peers,omitempty"`
}

// LoadView is a target's load as the gateway accounts it (TargetLoad with JSON keys).
type LoadView struct {
	PrefillTokens   int `json:"prefill_tokens"`
	PrefillRequests int `json:"prefill_requests"`
	Requests        int `json:"requests"`
	ActiveBlocks    int `json:"active_blocks"`
}

// MetricsView is the last /metrics reading of a target, however old, with its age.
type MetricsView struct {
	Running      float64 `json:"running"`
	Waiting      float64 `json:"waiting"`
	KVUsage      float64 `json:"kv_usage"`
	NumGPUBlocks int     `json:"num_gpu_blocks,omitempty"`
	AgeSeconds   float64 `json:"age_seconds"`
}

// FleetView is routing's fleet-wide part of GET /debug/workers.
type FleetView struct {
	Sessions *sessions.Stats `json:"sessions,omitempty"`
	// Collectors are the KV-event collectors (kv_events.listen), with the messages they could
	// not attribute to a configured worker+rank.
	Collectors []indexers.CollectorDebug `json:"kv_collectors,omitempty"`
	// Peers are the replicas whose load this one adds (nil when not clustered), and
	// PeerMessages what was done with their load messages.
	Peers        []PeerView `json:"peers,omitempty"`
	PeerMessages *PeerStats `json:"peer_messages,omitempty"`
}

// DebugTargets implements Debugger: subscription state, scoring mode, approximate blocks,
// accounted load and the last metrics reading of each target.
func (e *Dispatcher) DebugTargets(ts []kvkey.Target) []TargetView {
	subs := map[kvkey.Target]*indexers.TargetDebug{}
	if e.events != nil {
		snap := e.events.Snapshot()
		for i := range snap {
			subs[kvkey.Target{Worker: snap[i].Worker, DPRank: snap[i].DPRank}] = &snap[i]
		}
	}
	now := time.Now()
	out := make([]TargetView, len(ts))
	for i, t := range ts {
		v := &out[i]
		if sub := subs[t]; sub != nil {
			v.Subscription, v.IndexBlocks = sub, sub.IndexBlocks
		}
		if e.kv != nil {
			v.Mode = e.kv.Mode(t)
			v.Latency = e.kv.latencyView(t)
			if a := e.kv.Approx(); a != nil {
				n := a.Resident(t)
				v.ApproximateBlocks = &n
			}
		}
		if f := e.fleet.Load(); f != nil && f.Peers != nil {
			sh := f.Peers.Share(t)
			v.Peers = &sh
		}
		l := e.load.Load(t)
		v.Load = &LoadView{PrefillTokens: l.PrefillTokens, PrefillRequests: l.PrefillRequests,
			Requests: l.Requests, ActiveBlocks: l.ActiveBlocks}
		// The last reading, however old; its age tells whether scoring still uses it.
		if m, ok := e.load.Metrics(t, 365*24*time.Hour); ok {
			v.Metrics = &MetricsView{Running: m.Running, Waiting: m.Waiting, KVUsage: m.KVUsage,
				NumGPUBlocks: m.NumGPUBlocks, AgeSeconds: now.Sub(m.At).Seconds()}
		}
	}
	return out
}

// DebugFleet implements Debugger: session counters and the KV-event collectors.
func (e *Dispatcher) DebugFleet() FleetView {
	var out FleetView
	if e.sessions != nil {
		st := e.sessions.Stats()
		out.Sessions = &st
	}
	if e.events != nil {
		out.Collectors = e.events.Collectors()
	}
	if f := e.fleet.Load(); f != nil && f.Peers != nil {
		out.Peers = f.Peers.Peers(time.Now())
		if out.Peers == nil {
			out.Peers = []PeerView{}
		}
		st := f.Peers.Stats()
		out.PeerMessages = &st
	}
	return out
}

// DebugSession implements Debugger: the session's parent, affinity, frontiers per
// worker+rank, sibling group and next hints (sessions.SessionView); with lineage every
// frontier lists its block lineage.
func (e *Dispatcher) DebugSession(id string, lineage bool) (any, error) {
	if e.sessions == nil {
		return nil, noSession(fmt.Sprintf("session %q is not tracked: sessions are tracked only with the kv, kv_blocks and kv_no_load policies (policy is %s)",
			id, e.Name()))
	}
	view, ok := e.sessions.Debug(id, lineage)
	if !ok {
		return nil, noSession(fmt.Sprintf("unknown session %q (never seen, closed, or evicted)", id))
	}
	return view, nil
}
