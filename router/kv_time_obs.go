package router

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router/latency"
)

// timeObs follows one routed attempt for the time model: it holds the attempt's share of the
// target's queue and decode batch, and feeds the measured TTFT to the target's fit. Its
// methods follow Lifecycle (FirstToken, UsageSeen, then end) and are safe for concurrent use.
type timeObs struct {
	tm     *timeModel
	tt     *targetTime
	target kvkey.Target
	worker string
	now    func() time.Time
	start  time.Time
	state  latency.State // the target at routing time
	prompt float64
	u, c   float64 // uncached and cached tokens expected at routing
	// routedCached is the chosen target's G1 overlap at routing, in whole blocks' tokens that
	// vLLM can reuse (the last prompt token is always computed), to tell the worker's count
	// apart from the index's.
	routedCached float64
	pairs        int64 // the attention pairs accounted in the queue
	predMs       float64
	itlMs        float64 // predicted inter-token time: one decode step with this request added
	stream       bool    // only a streamed response's first byte is its first token

	// events counts the response's events relayed after its first token and lastEvent is when
	// the last one was (ns after start); both lock-free (Lifecycle.Chunk, once per event).
	events    atomic.Int64
	lastEvent atomic.Int64

	mu       sync.Mutex
	stage    int32 // stagePrefill → stageDecode → stageDone
	forced   bool  // force-released by LoadTracker.Expire
	ttftMs   float64
	fed      bool
	accountU int64
	// at the first token: the target's decode KV tokens and routed tallies, for the ITL sample
	firstKV, firstRoutedU, firstRoutedPairs int64
}

// minITLEvents is how many relayed events a streamed response needs after its first token
// before its mean inter-event time is taken as a step-time sample: vLLM streams one event per
// engine step that produced a token (vllm/entrypoints/openai/serving_chat.py,
// chat_completion_stream_generator), plus a few without one (the role, the finish reason,
// usage), whose share must stay small.
const minITLEvents = 32

// chunk counts one event relayed to the client.
func (o *timeObs) chunk() {
	o.events.Add(1)
	o.lastEvent.Store(int64(o.now().Sub(o.start)))
}

// beginTime starts the time accounting of an attempt routed by d (nil when the policy does
// not score by time or the target is beyond the model's bound).
func (p *KVPolicy) beginTime(d Decision, req *Request) *timeObs {
	if p.timed == nil {
		return nil
	}
	tt := p.timed.getOrCreate(d.Chosen.Target)
	if tt == nil {
		return nil
	}
	bs := blockSizeOf(req)
	prompt := float64(max(req.PromptTokens, len(req.BlockHashes)*bs))
	c := math.Min(float64(CachedBlocks(d)*bs), math.Max(prompt-1, 0))
	u := math.Max(prompt-c, 0)
	st, th := p.timedState(d.Chosen.Target, p.peerLoad(d.Chosen.Target))
	if m, ok := p.load.Metrics(d.Chosen.Target, p.cfg.MetricsMaxAge.D()); ok {
		st.KVUsage = m.KVUsage
	}
	o := &timeObs{tm: p.timed, tt: tt, target: d.Chosen.Target, worker: d.Chosen.Target.String(), now: p.now, start: p.now(),
		routedCached: math.Min(float64(CachedBlocks(d)), math.Floor(math.Max(prompt-1, 0)/float64(bs))) * float64(bs),
		state:        st, prompt: prompt, u: u, c: c, pairs: int64(latency.Pairs(u, c)), accountU: int64(u), stream: req.Stream,
		predMs: latency.PredictTTFT(th, p.timed.params, st, latency.Req{Uncached: u, Cached: c}).TotalMs,
		itlMs:  latency.StepMs(th, 0, 0, st.DecodeKVTokens+prompt)}
	tt.aheadTokens.Add(o.accountU)
	tt.aheadPairs.Add(o.pairs)
	tt.routedU.Add(o.accountU)
	tt.routedPairs.Add(o.pairs)
	p.timed.publish(o.target, LoadVector{AheadTokens: o.accountU, AheadPairs: o.pairs})
	p.timed.metrics.predicted(o.worker, o.predMs)
	return o
}

// firstToken measures the TTFT and moves the request from the target's queue to its decodes.
func (o *timeObs) firstToken() {
	if d, ok := o.firstTokenLocked(); ok {
		o.tm.publish(o.target, d) // outside o.mu: the publisher takes its own lock
	}
}

func (o *timeObs) firstTokenLocked() (LoadVector, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.stage != stagePrefill {
		return LoadVector{}, false
	}
	o.stage = stageDecode
	o.ttftMs = float64(o.now().Sub(o.start)) / float64(time.Millisecond)
	o.tt.aheadTokens.Add(-o.accountU)
	o.tt.aheadPairs.Add(-o.pairs)
	o.tt.decodes.Add(1)
	o.firstKV = o.tt.decodeKV.Add(int64(o.prompt))
	o.firstRoutedU, o.firstRoutedPairs = o.tt.routedU.Load(), o.tt.routedPairs.Load()
	o.events.Store(0) // events before the first token are not steps
	if o.stream {
		o.tm.metrics.observed(o.worker, o.ttftMs, o.predMs)
		o.tt.mu.Lock() // after o.mu, as feed
		o.tt.ratios.add(o.ttftMs, o.predMs)
		o.tt.mu.Unlock()
	}
	return LoadVector{AheadTokens: -o.accountU, AheadPairs: -o.pairs, Decodes: 1, DecodeKV: int64(o.prompt)}, true
}

// usageSeen corrects the cached and uncached tokens with the worker's own count and feeds the
// fit.
func (o *timeObs) usageSeen(u Usage) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if u.HasCached && u.CachedTokens >= 0 {
		prompt := o.prompt
		if u.PromptTokens > 0 {
			prompt = float64(u.PromptTokens)
		}
		o.c = math.Min(float64(u.CachedTokens), prompt)
		o.u = math.Max(prompt-o.c, 0)
		o.tm.metrics.cacheLost(o.worker, o.routedCached-o.c)
	}
	o.feed()
}

// end releases the attempt's accounting; a completed attempt (done) that measured a TTFT and
// has not fed the fit yet feeds it with the routing-time cache estimate.
func (o *timeObs) end(completed bool) {
	if d := o.endLocked(completed); !d.IsZero() {
		o.tm.publish(o.target, d) // outside o.mu: the publisher takes its own lock
	}
}

func (o *timeObs) endLocked(completed bool) LoadVector {
	o.mu.Lock()
	defer o.mu.Unlock()
	var d LoadVector
	switch o.stage {
	case stageDone:
		return d
	case stagePrefill:
		o.tt.aheadTokens.Add(-o.accountU)
		o.tt.aheadPairs.Add(-o.pairs)
		d = LoadVector{AheadTokens: -o.accountU, AheadPairs: -o.pairs}
		if waited := float64(o.now().Sub(o.start)) / float64(time.Millisecond); o.stream && !o.forced && waited >= o.predMs {
			// Ended without a first token after longer than predicted (the gateway cut it at
			// its deadline, or its client left): its TTFT is at least this, so the model fell
			// short at least this much. Left out, the requests it fell shortest on would be.
			o.tt.mu.Lock()
			o.tt.ratios.add(waited, o.predMs)
			o.tt.mu.Unlock()
		}
	case stageDecode:
		if completed {
			o.feed()
			o.feedITL()
			o.tt.doneN.Add(1)
			o.tt.doneU.Add(int64(o.u))
			o.tt.doneC.Add(int64(o.c))
		}
		o.tt.decodes.Add(-1)
		o.tt.decodeKV.Add(-int64(o.prompt))
		d = LoadVector{Decodes: -1, DecodeKV: -int64(o.prompt)}
	}
	o.stage = stageDone
	return d
}

// expired ends the attempt without feeding the fit when LoadTracker.Expire force-releases its
// load handle (a caller that never ends its Lifecycle must not keep a target looking queued).
func (o *timeObs) expired() {
	o.mu.Lock()
	o.forced = true // how long it was held says nothing of the worker
	o.mu.Unlock()
	o.end(false)
}

// feed gives the fit one sample, once, if a TTFT was measured on a streamed response (a
// non-stream body's first byte comes after the whole generation). Samples taken while the
// worker reported its KV cache past the pressure threshold are skipped: preemption and
// admission stalls there are not what the linear model describes.
func (o *timeObs) feed() {
	if o.fed || o.stage != stageDecode || !o.tm.learn || !o.tm.learnFrom[latency.SourceTTFT] || !o.stream {
		return
	}
	o.fed = true
	if o.tm.params.KVPressureWeight > 0 && o.state.KVUsage > o.tm.params.KVPressureStart {
		return
	}
	x := latency.Features(o.state, latency.Req{Uncached: o.u, Cached: o.c}, o.tm.params)
	o.tt.mu.Lock()
	o.tt.observe(o.tm.metrics, o.worker, latency.SourceTTFT, x, o.ttftMs)
	o.tt.publish()
	o.tt.mu.Unlock()
}

// feedITL gives the fit one step-time sample from a completed streamed response: the mean
// time between the events relayed after its first token, against the prefill routed to the
// target per step meanwhile and the mean of the decode KV tokens there at its first token and
// now. Skipped with fewer than minITLEvents events and, like feed, under KV pressure.
func (o *timeObs) feedITL() {
	n := o.events.Load()
	if !o.tm.learn || !o.tm.learnFrom[latency.SourceGatewayITL] || !o.stream || n < minITLEvents {
		return
	}
	if o.tm.params.KVPressureWeight > 0 && o.state.KVUsage > o.tm.params.KVPressureStart {
		return
	}
	spanMs := float64(o.lastEvent.Load())/float64(time.Millisecond) - o.ttftMs
	steps := float64(n - 1)
	if !(spanMs > 0) {
		return
	}
	tok := float64(o.tt.routedU.Load()-o.firstRoutedU) / steps
	pairs := float64(o.tt.routedPairs.Load()-o.firstRoutedPairs) / steps
	kDec := float64(o.firstKV+o.tt.decodeKV.Load()) / 2
	x := latency.StepFeatures(tok, pairs, kDec)
	o.tt.mu.Lock()
	o.tt.observe(o.tm.metrics, o.worker, latency.SourceGatewayITL, x, spanMs/steps)
	o.tt.publish()
	o.tt.mu.Unlock()
}
