package router

import (
	"context"
	"sync"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router/latency"
)

// Capacity is what the gateway's flow control (server/flow.go) asks of the routing side;
// *Dispatcher implements it. A request waits at the gateway while every candidate is Busy and
// is dispatched, late, to a target that frees: OnLoadChange says when to look again, Gains
// which waiting request a freed target serves best.
type Capacity interface {
	// Busy reports whether t is over one of the router's busy thresholds now
	// (router.busy_waiting_requests, busy_kv_usage, busy_prefill_tokens), the peer replicas'
	// load included.
	Busy(t kvkey.Target) bool
	// OnLoadChange adds f to the listeners of every change that may free capacity: a first
	// token, a finished request, a fresh metrics scrape. f must return at once.
	OnLoadChange(f func())
	// Gains returns, for each candidate, the time in ms the request saves there by the time
	// model: its cached prefix's prefill (tokens and attention pairs) at that target's
	// coefficients. Nil when the policy does not see the cache (every target then gains 0).
	Gains(ctx context.Context, req *Request, cands []Candidate) map[kvkey.Target]float64
}

var _ Capacity = (*Dispatcher)(nil)

// listeners are the OnLoadChange functions of one dispatcher.
type listeners struct {
	mu sync.Mutex
	fs []func()
}

// OnLoadChange implements Capacity.
func (e *Dispatcher) OnLoadChange(f func()) {
	e.changes.mu.Lock()
	e.changes.fs = append(e.changes.fs, f)
	fs := append([]func(){}, e.changes.fs...)
	e.changes.mu.Unlock()
	e.load.OnChange(func(kvkey.Target) {
		for _, f := range fs {
			f()
		}
	})
}

// Busy implements Capacity with the busy thresholds of the KV policy's config, or of
// DispatcherOptions.Busy for the other policies.
func (e *Dispatcher) Busy(t kvkey.Target) bool {
	cfg := e.busy
	tl := e.load.get(t)
	var snap TargetLoad
	if tl != nil {
		snap = tl.snapshot()
	}
	if f := e.fleet.Load(); f != nil && f.Peers != nil {
		snap = snap.withPeers(f.Peers.Sum(t))
	}
	if cfg.BusyPrefillTokens > 0 && snap.PrefillTokens >= cfg.BusyPrefillTokens {
		return true
	}
	if tl == nil {
		return false
	}
	m, fresh := tl.freshMetrics(e.load.now(), cfg.MetricsMaxAge.D())
	switch {
	case !fresh:
		return false
	case cfg.BusyKVUsage > 0 && m.KVUsage >= cfg.BusyKVUsage:
		return true
	case cfg.BusyWaitingRequests > 0 && tl.waitingNow(m) >= float64(cfg.BusyWaitingRequests):
		return true
	}
	return false
}

// Gains implements Capacity for the KV-aware policies: the policy's own read-only scoring
// gives each candidate's cached blocks (G1, and G2/G3 at their credits).
func (e *Dispatcher) Gains(ctx context.Context, req *Request, cands []Candidate) map[kvkey.Target]float64 {
	if e.kv == nil || len(cands) == 0 {
		return nil
	}
	d, err := e.kv.Pick(ctx, req, cands)
	if err != nil {
		return nil
	}
	cfg := e.kv.Config()
	bs := float64(blockSizeOf(req))
	out := make(map[kvkey.Target]float64, len(d.Candidates))
	for _, c := range d.Candidates {
		cached := (float64(c.G1Blocks) + cfg.G2Credit*float64(c.G2Blocks) + cfg.G3Credit*float64(c.G3Blocks)) * bs
		cached = min(cached, float64(req.PromptTokens))
		th := e.thetaOf(c.Target)
		out[c.Target] = th[latency.FTokens]*cached + th[latency.FPairs]*cached*cached/2
	}
	return out
}

// thetaOf is the time model's coefficients for t (its fit once ready, else the prior).
func (e *Dispatcher) thetaOf(t kvkey.Target) latency.Theta {
	if tm := e.kv.timed; tm != nil {
		_, th := tm.state(t)
		return th
	}
	c := e.kv.Config().Latency
	return latency.Theta{c.FrontendMs, c.PrefillMsPerToken, c.AttentionMsPerPair, c.StepMs, c.StepMsPerKVToken}
}
