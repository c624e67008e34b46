// Package flowcontrol is the state machine of the gateway's queue (the flow_control section):
// requests that found every candidate worker busy wait here, bounded in count and bytes, and
// each slot that frees on a worker goes to one of them: the highest priority first, within it
// the tenant with the least attained service (weighted tokens, decaying), and within that
// tenant the request that gains most on that worker (its cached prefix there, priced by the
// time model, plus a credit for its wait). Late binding: a request is matched to a worker only
// when that worker has room.
//
// The package does no I/O and reads no clock of its own (Queue's now is injected); the
// server's flow gate (server/flow.go) does the waiting, the timers and the metrics. Queue's
// lock is a leaf: nothing is called out while it is held (docs/ARCHITECTURE.md, "Lock order").
package flowcontrol
