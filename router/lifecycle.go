package router

import (
	"context"
	"sync/atomic"
)

// Router is the one interface between the HTTP front (package server) and routing. The server
// knows nothing else of the routing side: load accounting, the approximate index, session
// updates and usage feedback all hang off the calls below. *Dispatcher implements it.
//
// Per client request the server calls Start once (before routing; the returned end once the
// request is over, however it ended), then Route once per attempt (each retry on another
// worker is a new attempt with its own Lifecycle). POST /debug/route calls Pick only.
type Router interface {
	Policy
	Debugger
	// Start hears a request before its first attempt (its session identity); end is called
	// exactly once after its last attempt ended (a final request's session is released then).
	Start(req *Request) (end func())
	// Route chooses a target among cands for one attempt and starts accounting it. The caller
	// reports the attempt's steps on the returned Lifecycle.
	Route(ctx context.Context, req *Request, cands []Candidate) (Decision, Lifecycle, error)
}

// Lifecycle is one routed attempt as the proxy sees it. Sent, FirstToken and UsageSeen are
// reported at most once each, in that order when they happen (Chunk any number of times after
// FirstToken); then exactly one of Done or Failed (both are idempotent, and the first call
// wins).
type Lifecycle interface {
	// Sent: the request is about to go to the chosen worker.
	Sent()
	// FirstToken: the worker's first response byte arrived (the prompt's prefill ended).
	FirstToken()
	// Chunk: one more event of a streamed response reached the client (called per SSE event,
	// after FirstToken; it must stay cheap: a counter and a clock read).
	Chunk()
	// UsageSeen: the worker's OpenAI usage object of a successful (200) response.
	UsageSeen(u Usage)
	// Produced: the worker's response carries this Responses API id and the worker stores it
	// (store true): the id is pinned to the attempt's target.
	Produced(responseID string)
	// Done: the response reached the client (or the client left after the request was sent).
	Done()
	// Failed: nothing reached the client; another worker may be tried with a new attempt.
	Failed(err error)
	// Predicted is the chosen target's predicted time to first token and inter-token time at
	// routing, in ms; ok is false when the policy predicts no time (all but kv).
	Predicted() (ttftMs, itlMs float64, ok bool)
}

// attempt is the Dispatcher's Lifecycle: the load handle, the post-selection session update and
// the usage feedback of one routed attempt.
type attempt struct {
	e     *Dispatcher
	req   *Request
	d     Decision
	h     *Handle
	obs   *timeObs // the kv policy's TTFT observation (nil for other policies)
	lead  *prefill // the prefill this attempt leads in the hold table (nil if none)
	sent  atomic.Bool
	ended atomic.Bool
}

// Sent makes the post-selection session update: affinity and the session's frontier on the
// chosen target, from its G1 match, guarded by the target's residency version (see
// docs/ARCHITECTURE.md, "Sessions and frontiers").
func (a *attempt) Sent() {
	if a.e.sessions != nil && a.req.SessionID != "" {
		a.sent.Store(true)
		a.e.sessions.OnRouted(a.req.SessionID, a.d.Chosen.Target, a.req.BlockHashes)
	}
}

// FirstToken ends the prompt's prefill load on the chosen target and measures its TTFT.
func (a *attempt) FirstToken() {
	a.h.FirstToken()
	if a.obs != nil {
		a.obs.firstToken()
	}
	if a.lead != nil {
		a.e.holds.finish(a.lead, true)
	}
}

// Chunk counts a relayed event for the latency fit's inter-token sample.
func (a *attempt) Chunk() {
	if a.obs != nil {
		a.obs.chunk()
	}
}

// UsageSeen compares the worker's usage with the gateway's count and prediction (Observe), and
// feeds the measured TTFT, with the worker's cached tokens, to the target's latency fit.
func (a *attempt) UsageSeen(u Usage) {
	a.e.Observe(a.req.Model, a.req, a.d, u)
	if a.obs != nil {
		a.obs.usageSeen(u)
	}
}

// Produced pins the response id to the attempt's target (bounded: router.responses), and
// shares the pin with the fleet's other replicas when they share pins.
func (a *attempt) Produced(id string) { a.e.pins.produced(id, a.req.Owner, a.d.Chosen.Target) }

// Predicted returns the kv policy's prediction for the attempt (timeObs).
func (a *attempt) Predicted() (ttftMs, itlMs float64, ok bool) {
	if a.obs == nil {
		return 0, 0, false
	}
	return a.obs.predMs, a.obs.itlMs, true
}

// Done releases the attempt's load (feeding the latency fit if UsageSeen did not).
func (a *attempt) Done() { a.end(true) }

// Failed releases the attempt's load; a failed attempt leaves no other trace.
func (a *attempt) Failed(error) { a.end(false) }

func (a *attempt) end(completed bool) {
	if a.ended.CompareAndSwap(false, true) {
		a.h.Done()
		if a.obs != nil {
			a.obs.end(completed)
		}
		if a.lead != nil {
			a.e.holds.finish(a.lead, false) // no-op after FirstToken
		}
		if a.sent.Load() {
			// The lease end: the fleet's binding is refreshed (and no longer kept alive for it).
			a.e.sessions.OnReleased(a.req.SessionID, a.d.Chosen.Target)
		}
	}
}
