package router

import (
	"context"
	"math"
	"sync"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router/latency"
)

// Capacity is what the gateway's flow control (server/flow.go) asks of the routing side;
// *Dispatcher implements it. A request waits at the gateway while every candidate is
// saturated (Saturation, judged against flow_control's thresholds) and is dispatched, late,
// to a target that frees: OnLoadChange says when to look again, Gains which waiting request a
// freed target serves best.
type Capacity interface {
	// Saturation is t's load now as flow control judges it, the peer replicas' load included.
	Saturation(t kvkey.Target) Saturation
	// OnLoadChange adds f to the listeners of every change that may free capacity: a first
	// token, a finished request, a fresh metrics scrape. f must return at once.
	OnLoadChange(f func())
	// Gains returns, for each candidate, the time in ms the request saves there by the time
	// model: its cached prefix's prefill (tokens and attention pairs) at that target's
	// coefficients, and own, what the request itself adds to its time to first token there
	// (its uncached suffix's prefill after the cached prefix, with the running decodes' share
	// of its steps and the KV-pressure term: the time model's TTFT of the request less that of
	// an empty one, Saturation.WaitMs). Both nil when the policy does not see the cache (every
	// target then gains 0, and nothing is predicted).
	Gains(ctx context.Context, req *Request, cands []Candidate) (saved, own map[kvkey.Target]float64)
	// Program names the agent program req belongs to: the root session of its session's
	// lineage (a subagent's parent's root), "" for a request without a session.
	Program(req *Request) string
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

// Saturation is one target's load as flow control reads it.
type Saturation struct {
	// Busy: over one of the router's busy thresholds (router.busy_waiting_requests,
	// busy_kv_usage, busy_prefill_tokens): the policies avoid it too.
	Busy bool
	// PrefillTokens are the uncached prompt tokens in flight there before their first token.
	PrefillTokens int
	// Waiting is the worker's reported waiting requests moved forward to now (the requests
	// sent since the scrape added, those past their first token since taken off); set only
	// with a fresh scrape (HasWaiting).
	Waiting    float64
	HasWaiting bool
	// WaitMs is the kv time model's prediction of how long a request sent now waits there
	// before its own prefill starts: the prefill queued ahead, the running decodes' share of
	// those steps and the KV-pressure term (latency.PredictTTFT of an empty request, less the
	// frontend constant); set only under the kv policy (HasWait).
	WaitMs  float64
	HasWait bool
	// TTFTRatio is how far the time model's predictions fall short there: the 90th
	// percentile of the recent ratios of measured to predicted TTFT of the streamed
	// responses predicted at least half a second (the last 64; 0 before 8; one that ended
	// without a first token after longer than predicted counts its time so far). Kv only.
	TTFTRatio float64
	// Requests are the requests in flight there (sent and not ended), by the gateway's
	// accounting and its peers' on the cluster bus: 0 means nothing runs there.
	Requests int
}

// Saturation implements Capacity with the busy thresholds of the KV policy's config, or of
// DispatcherOptions.Busy for the other policies.
func (e *Dispatcher) Saturation(t kvkey.Target) Saturation {
	cfg := e.busy
	tl := e.load.get(t)
	var snap TargetLoad
	var pv LoadVector
	if tl != nil {
		snap = tl.snapshot()
	}
	if f := e.fleet.Load(); f != nil && f.Peers != nil {
		pv = f.Peers.Sum(t)
		snap = snap.withPeers(pv)
	}
	var m WorkerMetrics
	fresh := false
	if tl != nil {
		m, fresh = tl.freshMetrics(e.load.now(), cfg.MetricsMaxAge.D())
	}
	out := Saturation{PrefillTokens: snap.PrefillTokens, Requests: snap.Requests}
	if fresh {
		out.Waiting, out.HasWaiting = tl.waitingNow(m), true
	}
	switch {
	case cfg.BusyPrefillTokens > 0 && snap.PrefillTokens >= cfg.BusyPrefillTokens,
		fresh && cfg.BusyKVUsage > 0 && m.KVUsage >= cfg.BusyKVUsage,
		fresh && cfg.BusyWaitingRequests > 0 && out.Waiting >= float64(cfg.BusyWaitingRequests):
		out.Busy = true
	}
	if e.kv != nil && e.kv.timed != nil {
		out.WaitMs, out.HasWait = e.kv.predictedWaitMs(t, pv, snap, m, fresh), true
		out.TTFTRatio = e.kv.timed.ttftRatio(t)
	}
	return out
}

// predictedWaitMs is the time model's wait before a new request's own prefill on t: the
// state timeOf scores with (the gateway's and the peers' accounting, raised to the fresh
// report's decodes and unseen waiting requests) and an empty request.
func (p *KVPolicy) predictedWaitMs(t kvkey.Target, pv LoadVector, snap TargetLoad, m WorkerMetrics, fresh bool) float64 {
	st, th := p.timedState(t, pv)
	if fresh {
		bs := float64(defaultBlockSize)
		st.KVUsage = m.KVUsage
		st.DecodeRequests = math.Max(st.DecodeRequests, m.Running-float64(snap.PrefillRequests))
		if unseen := math.Max(m.Waiting-float64(snap.PrefillRequests), 0); unseen > 0 {
			each := p.cfg.WaitingWeight * bs
			st.AheadTokens += unseen * each
			st.AheadPairs += unseen * latency.Pairs(each, 0)
		}
	}
	pred := latency.PredictTTFT(th, p.timed.params, st, latency.Req{})
	return pred.TotalMs - pred.FrontendMs
}

// Gains implements Capacity for the KV-aware policies: the policy's own read-only scoring
// gives each candidate's cached blocks (G1, and G2/G3 at their credits).
func (e *Dispatcher) Gains(ctx context.Context, req *Request, cands []Candidate) (saved, own map[kvkey.Target]float64) {
	if e.kv == nil || len(cands) == 0 {
		return nil, nil
	}
	d, err := e.kv.Pick(ctx, req, cands)
	if err != nil {
		return nil, nil
	}
	cfg := e.kv.Config()
	bs := float64(blockSizeOf(req))
	prompt := float64(req.PromptTokens)
	saved = make(map[kvkey.Target]float64, len(d.Candidates))
	own = make(map[kvkey.Target]float64, len(d.Candidates))
	for _, c := range d.Candidates {
		cached := (float64(c.G1Blocks) + cfg.G2Credit*float64(c.G2Blocks) + cfg.G3Credit*float64(c.G3Blocks)) * bs
		cached = min(cached, prompt)
		th := e.thetaOf(c.Target)
		saved[c.Target] = latency.PrefillMs(th, cached, 0)
		own[c.Target] = e.ownMs(c.Target, th, prompt-cached, cached)
	}
	return saved, own
}

// ownMs is what a request of u uncached tokens after c cached ones adds to the time model's
// TTFT on t now (its prefill, and the decode steps and KV pressure it adds), or its bare
// prefill at th without a time model.
func (e *Dispatcher) ownMs(t kvkey.Target, th latency.Theta, u, c float64) float64 {
	if e.kv.timed == nil {
		return latency.PrefillMs(th, u, c)
	}
	var pv LoadVector
	if f := e.fleet.Load(); f != nil && f.Peers != nil {
		pv = f.Peers.Sum(t)
	}
	st, th := e.kv.timedState(t, pv)
	with := latency.PredictTTFT(th, e.kv.timed.params, st, latency.Req{Uncached: u, Cached: c})
	without := latency.PredictTTFT(th, e.kv.timed.params, st, latency.Req{})
	return math.Max(with.TotalMs-without.TotalMs, latency.PrefillMs(th, u, c))
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

// Program implements Capacity from the session tracker's lineage (Start has observed the
// request's session and parent), else from the request's own parent and session ids.
func (e *Dispatcher) Program(req *Request) string {
	if req.SessionID == "" {
		return ""
	}
	if e.sessions != nil {
		if root := e.sessions.Root(req.SessionID); root != "" {
			return root
		}
	}
	if req.ParentSessionID != "" {
		return req.ParentSessionID
	}
	return req.SessionID
}
