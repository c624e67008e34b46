package sim

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"
)

// errEngineRestarted is reported to in-flight requests when the restart fault fires.
var errEngineRestarted = errors.New("engine restarted")

// engineCore is one DP rank, the simulated counterpart of vLLM's EngineCore
// (vllm/v1/engine/core.py): a v1-style scheduler loop with continuous batching over a paged KV
// cache, advancing in steps whose duration comes from the timing model. (Not router.Dispatcher,
// the gateway's decision wrapper around a policy.)
type engineCore struct {
	rank int
	w    *Worker
	o    Options
	kv   *kvManager
	pub  *publisher // nil when events are off

	submit chan *simRequest
	resets chan chan bool
	// restarts asks the engine to restart (Worker.Restart); the reply channel is closed once it has.
	restarts chan chan struct{}

	waiting []*simRequest
	running []*simRequest

	// published for metrics and load balancing (read from other goroutines)
	numRunning, numWaiting atomic.Int64
	usageBits              atomic.Uint64
	inflight               atomic.Int64 // submitted and not yet finished

	next      time.Time // virtual clock: when the current step may end
	rng       *rand.Rand
	lastStall time.Time
	lastReset time.Time
}

// step is what one engine step schedules.
type step struct {
	reqs          []*simRequest
	numNew        []int
	prefillTokens int
	prefillPairs  float64 // Σ n·(c + n/2) over prefill chunks: attention pairs (see PerfModel)
	loadTokens    int
	decodes       int
	decodeKV      int // Σ context length of the decoding requests
}

func newEngineCore(w *Worker, rank int) *engineCore {
	o := w.opts
	return &engineCore{
		rank:     rank,
		w:        w,
		o:        o,
		kv:       newKVManager(o),
		submit:   make(chan *simRequest, o.MaxWaiting+o.MaxNumSeqs),
		resets:   make(chan chan bool),
		restarts: make(chan chan struct{}),
		rng:      rand.New(rand.NewPCG(uint64(o.Faults.Seed)+1, uint64(rank))),
	}
}

// enqueue hands a request to the engine; false when MaxWaiting requests already wait beyond
// a full batch (the bound on everything the engine holds).
func (e *engineCore) enqueue(r *simRequest) bool {
	if e.inflight.Add(1) > int64(e.o.MaxWaiting+e.o.MaxNumSeqs) {
		e.inflight.Add(-1)
		return false
	}
	select {
	case e.submit <- r:
		return true
	default:
		e.inflight.Add(-1)
		return false
	}
}

func (e *engineCore) run(ctx context.Context) {
	now := time.Now()
	e.next, e.lastStall, e.lastReset = now, now, now
	idle := time.NewTimer(time.Hour)
	defer idle.Stop()
	for {
		if len(e.waiting) == 0 && len(e.running) == 0 {
			select {
			case <-ctx.Done():
				e.failAll(context.Cause(ctx))
				return
			case r := <-e.submit:
				e.admit(r)
			case done := <-e.resets:
				done <- e.resetPrefixCache(ctx)
				continue
			case done := <-e.restarts:
				e.restart(ctx)
				close(done)
				continue
			}
			e.next = time.Now() // idle time is not debt to pay back
		}
		select {
		case done := <-e.restarts:
			e.restart(ctx)
			close(done)
		default:
		}
		e.drainInbox(ctx)
		e.dropCancelled()
		if err := e.faults(ctx); err != nil {
			e.failAll(err)
			return
		}
		st := e.schedule()
		e.publishGauges()
		if len(st.reqs) == 0 {
			// Nothing to run this step (a preemption emptied the batch, or the queues hold only
			// requests that wait for seats): wait briefly for arrivals, then try again.
			idle.Reset(time.Millisecond)
			select {
			case <-ctx.Done():
				e.failAll(context.Cause(ctx))
				return
			case r := <-e.submit:
				e.admit(r)
			case <-idle.C:
			}
			e.next = time.Now()
			continue
		}
		d := e.stepTime(st)
		if err := e.sleep(ctx, d); err != nil {
			e.failAll(err)
			return
		}
		e.update(st, d)
		e.flushEvents(ctx)
		e.publishGauges()
	}
}

func (e *engineCore) drainInbox(ctx context.Context) {
	for {
		select {
		case r := <-e.submit:
			e.admit(r)
		case done := <-e.resets:
			done <- e.resetPrefixCache(ctx)
		default:
			return
		}
	}
}

func (e *engineCore) admit(r *simRequest) {
	r.queuedAt = time.Now()
	e.waiting = enqueueWaiting(e.o.SchedulingPolicy, e.waiting, r, false)
}

// dropCancelled aborts requests whose client went away: vLLM frees their blocks (which stay
// cached) and emits nothing.
func (e *engineCore) dropCancelled() {
	keep := func(list []*simRequest) []*simRequest {
		return slices.DeleteFunc(list, func(r *simRequest) bool {
			if !r.cancelled.Load() {
				return false
			}
			e.kv.free(&r.seq)
			e.finishRequest(r, "abort", nil)
			return true
		})
	}
	e.waiting = keep(e.waiting)
	e.running = keep(e.running)
}

// schedule builds one step like vLLM's v1 scheduler: running requests first (decode or the
// next prefill chunk), preempting a running request when KV blocks run out (the newest, or
// under the priority policy the least urgent: preemptionVictim), then waiting requests in the
// queue's order (arrival, or (priority, arrival): enqueueWaiting) while seats, token budget
// and blocks allow.
func (e *engineCore) schedule() step {
	var st step
	budget := e.o.MaxNumBatchedTokens
	preempted := false
	for i := 0; i < len(e.running) && budget > 0; i++ {
		r := e.running[i]
		numNew := min(len(r.seq.tokens)-r.computed, budget)
		if numNew <= 0 {
			continue
		}
		preemptedSelf := false
		for !e.kv.allocate(&r.seq, r.computed, numNew, prefixHit{}, r.sessionID) {
			vi := preemptionVictim(e.o.SchedulingPolicy, e.running)
			victim := e.running[vi]
			e.running = slices.Delete(e.running, vi, vi+1)
			if vi < i {
				// Under the priority policy the victim may already be in this step: it leaves
				// the step, and gives back its tokens, as vLLM drops it from the step's
				// scheduled requests (vllm/v1/core/sched/scheduler.py, Scheduler.schedule).
				budget += st.remove(e, victim)
				i--
			}
			e.kv.free(&victim.seq)
			victim.computed = 0
			e.waiting = enqueueWaiting(e.o.SchedulingPolicy, e.waiting, victim, true)
			preempted = true
			e.w.metrics.preemptions.WithLabelValues(e.w.opts.ServedModelName, e.label()).Inc()
			if victim == r {
				preemptedSelf = true
				break
			}
		}
		if preemptedSelf {
			break
		}
		e.addToStep(&st, r, numNew)
		budget -= numNew
	}
	// Like vLLM, a step that had to preempt admits nobody new.
	for !preempted && len(e.waiting) > 0 && len(e.running) < e.o.MaxNumSeqs && budget > 0 {
		r := e.waiting[0]
		r.seq.extendHashes(e.o.BlockSize)
		hit := e.kv.computedBlocks(&r.seq)
		hitTokens := hit.tokens(e.o.BlockSize)
		numNew := min(len(r.seq.tokens)-hitTokens, budget)
		if !e.kv.canAllocate(&r.seq, 0, numNew, hit) {
			break
		}
		if r.reportFull && !r.scheduled && len(hit.gpu) > 0 {
			e.kv.pool.announceHits(&r.seq, len(hit.gpu), r.sessionID)
		}
		e.kv.allocate(&r.seq, 0, numNew, hit, r.sessionID)
		r.computed = hitTokens
		if !r.scheduled {
			r.scheduled = true
			r.scheduledAt = time.Now() // vLLM keeps the first SCHEDULED, not a re-schedule after preemption
			r.cached = hitTokens
			e.w.metrics.prefixQueries.WithLabelValues(e.o.ServedModelName, e.label()).Add(float64(len(r.seq.tokens)))
			e.w.metrics.prefixHits.WithLabelValues(e.o.ServedModelName, e.label()).Add(float64(len(hit.gpu) * e.o.BlockSize))
		}
		st.loadTokens += hit.host * e.o.BlockSize
		e.waiting = e.waiting[1:]
		e.running = append(e.running, r)
		e.addToStep(&st, r, numNew)
		budget -= numNew
	}
	return st
}

// remove takes r out of the step and returns the tokens it had been given; the step's totals
// are rebuilt from the requests that stay (their computed counts are unchanged until update).
func (st *step) remove(e *engineCore, r *simRequest) int {
	j := slices.Index(st.reqs, r)
	if j < 0 {
		return 0
	}
	given := st.numNew[j]
	reqs, nums := st.reqs, st.numNew
	*st = step{loadTokens: st.loadTokens}
	for k := range reqs {
		if k != j {
			e.addToStep(st, reqs[k], nums[k])
		}
	}
	return given
}

func (e *engineCore) addToStep(st *step, r *simRequest, numNew int) {
	st.reqs = append(st.reqs, r)
	st.numNew = append(st.numNew, numNew)
	if numNew == 1 && r.computed == len(r.seq.tokens)-1 && len(r.seq.tokens) > r.promptLen {
		st.decodes++
		st.decodeKV += len(r.seq.tokens)
	} else {
		st.prefillTokens += numNew
		st.prefillPairs += attentionPairs(numNew, r.computed)
	}
}

// attentionPairs is the number of (query, key) pairs causal attention computes for a chunk of
// n new tokens after c tokens whose KV is already there (a prefix-cache hit or earlier chunks):
// each new token attends to the c earlier ones and, on average, to half of the chunk.
func attentionPairs(n, c int) float64 {
	return float64(n) * (float64(c) + float64(n)/2)
}

// stepTime is the modelled duration of a step, before Speedup.
func (e *engineCore) stepTime(st step) time.Duration {
	return stepDuration(e.o, st, e.kv.pool.usage())
}

// stepDuration applies the timing model (see PerfModel) to one step at KV usage u.
func stepDuration(o Options, st step, u float64) time.Duration {
	if o.TTFT > 0 || o.ITL > 0 {
		switch {
		case st.prefillTokens > 0:
			return o.TTFT
		case st.decodes > 0:
			return o.ITL
		}
		return 0
	}
	return time.Duration(o.Perf.stepMillis(st, u) * float64(time.Millisecond))
}

// stepMillis is the modelled time of one step in ms: a prefill part (fixed launch cost, the
// per-token GEMMs, attention over every pair of new token × context token, and an optional
// quadratic in the step's token count) plus a decode part (a floor that is the weight read,
// the KV read of every decoding sequence, and a per-sequence cost), plus host-tier loads.
// With SharedWeightRead, a mixed step pays the decode floor only where it exceeds the
// prefill GEMMs, as AIConfigurator composes a mixed step (prefill plus the marginal decode).
func (p PerfModel) stepMillis(st step, u float64) float64 {
	ms, gemm := 0.0, 0.0
	if st.prefillTokens > 0 {
		t := float64(st.prefillTokens)
		fixed := p.PrefillC
		gemm = p.PrefillB * t
		attention := p.PrefillAttn * st.prefillPairs
		batchQuadratic := p.PrefillA * t * t
		ms += fixed + gemm + attention + batchQuadratic
	}
	if st.decodes > 0 {
		floor := math.Max(p.DecodeMin, p.DecodeA*u*u+p.DecodeB*u+p.DecodeC)
		if p.SharedWeightRead {
			floor = math.Max(0, floor-gemm) // the prefill GEMMs already read the weights
		}
		kvRead := p.DecodePerKVToken * float64(st.decodeKV)
		perSeq := p.DecodePerSeq * float64(st.decodes)
		ms += floor + kvRead + perSeq
	}
	return ms + p.CPULoadPerToken*float64(st.loadTokens)
}

// maxClockDebt bounds how far the engine may run behind its virtual clock.
const maxClockDebt = 5 * time.Millisecond

// sleep waits d/Speedup on a virtual clock: oversleeping is paid back by later steps, so the
// simulated rate holds even when steps are shorter than the OS timer resolution.
func (e *engineCore) sleep(ctx context.Context, d time.Duration) error {
	now := time.Now()
	e.next = e.next.Add(time.Duration(float64(d) / e.o.Speedup))
	if lag := now.Sub(e.next); lag > maxClockDebt {
		e.next = now.Add(-maxClockDebt) // bounded debt: a slow step is not paid back for long
	}
	wait := e.next.Sub(now)
	if wait <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// update applies a finished step: advance computed tokens, sample one token for every request
// whose prompt is fully computed, finish those that reached their end.
func (e *engineCore) update(st step, d time.Duration) {
	for _, r := range e.running {
		r.simElapsed += d
	}
	for _, r := range e.waiting {
		r.simElapsed += d
	}
	sampled, promptDone := 0, 0
	now := time.Now()
	m, labels := e.w.metrics, []string{e.o.ServedModelName, e.label()}
	for i, r := range st.reqs {
		r.computed += st.numNew[i]
		if r.computed < len(r.seq.tokens) {
			continue // a prefill chunk; no token sampled yet
		}
		n := len(r.seq.tokens) - r.promptLen
		tok := e.w.filler.token(n)
		r.seq.tokens = append(r.seq.tokens, tok)
		r.seq.extendHashes(e.o.BlockSize)
		n++
		if n == 1 {
			r.simTTFT = r.simElapsed
			r.firstTokenAt = now
			promptDone += r.promptLen
		} else {
			m.itl.WithLabelValues(labels...).Observe(now.Sub(r.lastTokenAt).Seconds())
		}
		r.lastTokenAt = now
		finish := ""
		switch {
		case r.stopAt > 0 && n >= r.stopAt:
			finish = "stop"
		case n >= r.maxTokens:
			finish = "length"
		}
		r.mu.Lock()
		r.out = append(r.out, tok)
		if finish != "" {
			// Atomic with the last token, so a streaming reader never sees that token without
			// its finish_reason (it would then have no chunk left to carry it).
			r.finished, r.finish = true, finish
		}
		r.mu.Unlock()
		sampled++
		if finish != "" {
			e.running = slices.DeleteFunc(e.running, func(x *simRequest) bool { return x == r })
			e.kv.free(&r.seq)
			e.finishRequest(r, finish, nil)
			continue
		}
		r.signal()
	}
	m.genTokens.WithLabelValues(labels...).Add(float64(sampled))
	// vLLM's IterationStats: the whole prompt of every request whose prefill completed in this
	// step, plus the tokens sampled (vllm/v1/metrics/stats.py, update_from_output).
	if promptDone+sampled > 0 {
		m.iterationTokens.WithLabelValues(labels...).Observe(float64(promptDone + sampled))
	}
}

func (e *engineCore) finishRequest(r *simRequest, finish string, err error) {
	r.mu.Lock()
	r.finished, r.finish, r.err = true, finish, err
	out := len(r.out)
	r.mu.Unlock()
	// The finished request's metrics are recorded before its handler is woken, so a client
	// that has read its response and then scrapes /metrics sees them (vLLM's output processor
	// likewise updates the stats in the step that emits the final output).
	if finish != "abort" && err == nil {
		e.w.metrics.success.WithLabelValues(e.o.ServedModelName, e.label(), finish).Inc()
		e.observeFinished(r, out)
	}
	r.signal()
	e.inflight.Add(-1)
	if hook := e.o.OnRequestDone; hook != nil {
		reason := finish
		if err != nil {
			reason = "error"
		}
		hook(RequestRecord{ID: r.id, DPRank: e.rank, PromptTokens: r.promptLen, CachedTokens: r.cached,
			OutputTokens: out, FinishReason: reason, SimTTFT: r.simTTFT, SimE2E: r.simElapsed})
	}
}

// observeFinished records the per-request interval histograms when a request finishes, as
// vLLM does (vllm/v1/metrics/stats.py, IterationStats.update_from_finished_request): queue =
// first SCHEDULED − QUEUED, prefill = first token − first SCHEDULED, decode = last − first
// token, inference = last token − first SCHEDULED, time per output token = decode / (n − 1).
func (e *engineCore) observeFinished(r *simRequest, generated int) {
	if r.scheduledAt.IsZero() || r.firstTokenAt.IsZero() {
		return
	}
	m, labels := e.w.metrics, []string{e.o.ServedModelName, e.label()}
	decode := r.lastTokenAt.Sub(r.firstTokenAt).Seconds()
	m.queueTime.WithLabelValues(labels...).Observe(r.scheduledAt.Sub(r.queuedAt).Seconds())
	m.prefillTime.WithLabelValues(labels...).Observe(r.firstTokenAt.Sub(r.scheduledAt).Seconds())
	m.decodeTime.WithLabelValues(labels...).Observe(decode)
	m.inferenceTime.WithLabelValues(labels...).Observe(r.lastTokenAt.Sub(r.scheduledAt).Seconds())
	if generated > 1 {
		m.tpot.WithLabelValues(labels...).Observe(decode / float64(generated-1))
	}
	m.prefillKVComputed.WithLabelValues(labels...).Observe(float64(max(0, r.promptLen-r.cached)))
}

// failAll ends every queued and running request with err (shutdown or restart fault).
func (e *engineCore) failAll(err error) {
	for _, list := range [][]*simRequest{e.running, e.waiting} {
		for _, r := range list {
			e.kv.free(&r.seq)
			e.finishRequest(r, "error", err)
		}
	}
	e.running, e.waiting = nil, nil
	for {
		select {
		case r := <-e.submit:
			e.finishRequest(r, "error", err)
		default:
			e.publishGauges()
			return
		}
	}
}

func (e *engineCore) flushEvents(ctx context.Context) {
	ev := e.kv.takeEvents()
	if len(ev) == 0 || e.pub == nil {
		return
	}
	e.pub.publish(ctx, ev)
}

// resetPrefixCache is POST /reset_prefix_cache: it succeeds only when no request holds blocks.
func (e *engineCore) resetPrefixCache(ctx context.Context) bool {
	ok := e.kv.pool.reset()
	e.flushEvents(ctx)
	return ok
}

func (e *engineCore) publishGauges() {
	e.numRunning.Store(int64(len(e.running)))
	e.numWaiting.Store(int64(len(e.waiting)))
	e.usageBits.Store(math.Float64bits(e.kv.pool.usage()))
}

func (e *engineCore) usage() float64 { return math.Float64frombits(e.usageBits.Load()) }

func (e *engineCore) label() string { return e.w.rankLabels[e.rank] }
