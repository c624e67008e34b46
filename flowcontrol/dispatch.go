package flowcontrol

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// TargetState is one target's load as the queue's dispatch reads it.
type TargetState struct {
	// Saturated: over a threshold that binds every request (router.busy_*,
	// max_prefill_tokens, max_waiting_requests), or handed to a request not yet routed.
	Saturated bool
	// WaitMs is the time model's predicted wait before a new request's prefill starts there
	// (HasWait; kv only). A request is not sent there while it is at or over the request's
	// bound (max_predicted_wait, or contended_predicted_wait), and it prices the choice
	// between a target free now and one that holds more of the request's prefix.
	WaitMs  float64
	HasWait bool
	// Running are the requests in flight there; a target with any is never idle
	// (backlogShare).
	Running int
	// TTFTRatio is how far the time model's predictions there fall short of the measured
	// times to first token: a high quantile of their recent ratio (router.Saturation). The
	// deadline check scales the predicted wait and own prefill by it (deadline.go); 1 or
	// less (0: not measured) leaves them as predicted.
	TTFTRatio float64
	// Guards are the footprints there that cache protection keeps (flow_control.protect_cache;
	// protect.go).
	Guards []Guard
}

// Binding choices: why a waiting request took the target it was dispatched to
// (Dispatch.Choice).
const (
	// ChoiceHolder: the target is its best by the time model (its predicted wait there less
	// what its cache saves there is the lowest of its eligible targets) and holds the most of
	// its prefix (or no target holds any).
	ChoiceHolder = "holder"
	// ChoiceFaster: the target is its best by the time model, though another holds more of
	// its prefix (that one's queue is longer than recomputing the difference).
	ChoiceFaster = "faster"
	// ChoiceLateHolder: the target is its best by the time model among those where its first
	// token is predicted by its deadline, and the target holding most of its prefix is not
	// one of them (its queue would make the request late, Entry.lateTargets).
	ChoiceLateHolder = "late_holder"
	// ChoiceAged: another target was predicted sooner, but the request's wait credit
	// (age_weight) outweighed the difference.
	ChoiceAged = "aged"
	// ChoiceUnpriced: no other target could be priced (no time model, or none eligible).
	ChoiceUnpriced = "unpriced"
)

// Dispatch is the priced choice Next made for a request.
type Dispatch[T comparable] struct {
	Target T
	// Choice is ChoiceHolder, ChoiceFaster, ChoiceLateHolder, ChoiceAged or ChoiceUnpriced.
	Choice string
	// HereMs is the request's price on Target (predicted wait less the weighed cache gain),
	// ElseMs its best price on any other target (+Inf: none); both 0 when unpriced.
	HereMs, ElseMs float64
	// Weigh is the recompute weight the prices counted (Limits.RecomputeWeight times the
	// backlog's share of it), GainMs the request's cache gain on Target and TopGainMs its
	// highest on any target: a move away from its prefix holder recomputes the difference.
	Weigh, GainMs, TopGainMs float64
	// Contended: the request was held to the contended bound (ContendedWaitMs).
	Contended bool
	// Protected names the rule (ProtectedByPriority, ProtectedByTenant) that kept the request
	// off a target where it would have evicted an outranking footprint; "" when none did.
	Protected string
	// Due is when the request's first token must have come (its Entry.Deadline), for the
	// caller to hold it to; zero when it has no deadline or its own prefill on Target alone
	// is predicted past half its budget (firstTokenAt's cap: no worker could keep that
	// promise, and the request is not refused for its length).
	Due time.Time
}

// Arrive notes that a request of prio and tenant asking for cost (Entry.Cost) arrived: both
// count as active for Limits.Window (contention), and cost adds to the service the tenant
// asked for, which cache protection compares between tenants (protect.go). Call it for every
// request, queued or not.
func (q *Queue[T]) Arrive(prio int, tenant string, cost float64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	q.seen[prio] = now
	a := q.tenant(tenant)
	a.seen = now
	a.decay(now, q.lim.HalfLife)
	a.asked += cost
	q.prune()
}

// contention is who is active now: the highest priority seen within the window and the
// mean attained service of the active tenants.
type contention struct {
	top     int
	hasTop  bool
	mean    float64
	tenants int
}

func (q *Queue[T]) contentionAt(now time.Time) contention {
	var c contention
	if q.lim.Window <= 0 || q.lim.ContendedWaitMs <= 0 {
		return c
	}
	for p, at := range q.seen {
		if now.Sub(at) > q.lim.Window {
			delete(q.seen, p) // bounded by the priority range anyway; keep it tidy
			continue
		}
		if !c.hasTop || p > c.top {
			c.top, c.hasTop = p, true
		}
	}
	if q.lim.ContendedShare > 0 {
		sum := 0.0
		for _, a := range q.service {
			if a.waiting > 0 || now.Sub(a.seen) <= q.lim.Window {
				a.decay(now, q.lim.HalfLife)
				sum += a.v
				c.tenants++
			}
		}
		if c.tenants > 0 {
			c.mean = sum / float64(c.tenants)
		}
	}
	return c
}

// bound is what a request may take: targets whose predicted wait is under limit (0: any),
// and, when reserve, only while another target keeps headroom (admits at full, the
// uncontended bound) for the higher priority that contends with it.
type bound struct {
	limit, full float64
	contended   bool
	reserve     bool
}

// boundOf is the bound of a request of prio and tenant. It is contended when a higher
// priority is active (then it also leaves the last target with headroom to that priority)
// or its tenant has attained more than ContendedShare times the active tenants' mean service.
func (q *Queue[T]) boundOf(c contention, prio int, tenant string, now time.Time) bound {
	b := bound{limit: q.lim.MaxWaitMs, full: q.lim.MaxWaitMs}
	byPriority := c.hasTop && prio < c.top
	contended := byPriority
	if !contended && c.tenants >= 2 && c.mean > 0 {
		v, _ := q.serviceOf(tenant, now)
		contended = v > q.lim.ContendedShare*c.mean
	}
	if contended && q.lim.ContendedWaitMs > 0 && (q.lim.MaxWaitMs == 0 || q.lim.ContendedWaitMs < q.lim.MaxWaitMs) {
		b.limit, b.contended, b.reserve = q.lim.ContendedWaitMs, true, byPriority
	}
	return b
}

// admits reports whether a target in state s takes a request bounded by limit now.
func admits(s TargetState, limit float64) bool {
	return !s.Saturated && (limit <= 0 || !s.HasWait || s.WaitMs < limit)
}

// takes reports whether a request with bound b may go to f now: f admits it, and under
// reserve another target still admits the higher priority (with a single target there is
// nothing to reserve).
func takes[T comparable](b bound, states map[T]TargetState, f T) bool {
	if !admits(states[f], b.limit) {
		return false
	}
	if !b.reserve || len(states) < 2 {
		return true
	}
	for o, s := range states {
		if o != f && admits(s, b.full) {
			return true
		}
	}
	return false
}

// gainOn is e's gain on t and whether t is eligible for e.
func gainOn[T comparable](gain map[T]float64, t T) (float64, bool) {
	if gain == nil {
		return 0, true
	}
	g, ok := gain[t]
	return g, ok
}

// price is the request's cost of going to f now against its best other eligible target,
// by the time model: the predicted wait before its prefill starts, less what its cached
// prefix saves there, that saving counted (1+weigh) times, weigh being the recompute weight
// (Limits.RecomputeWeight; Place scales it by the fleet's loaded share, loadedShare, Next by
// the queue's backlog, backlogShare). Against its best-cached target a target holding less
// costs the request the difference in prefill once, and the fleet weigh times that: the
// recomputed prefill delays every request queued behind it there and pushes other prompts'
// cached blocks out of that worker, as router.latency.recompute_weight prices a move away
// from the cache for routing (the price of each target differs from that sum by the same
// constant).
// A saturated alternative is priced at its predicted wait now, which is when its queue will
// have drained to take the request. priced is false when f or every alternative has no
// prediction.
func price[T comparable](gain map[T]float64, f T, states map[T]TargetState, weigh float64) (here, elsewhere float64, priced bool) {
	sf := states[f]
	if !sf.HasWait {
		return 0, 0, false
	}
	g, _ := gainOn(gain, f)
	here = sf.WaitMs - (1+weigh)*g
	_, elsewhere, priced = bestOther(gain, f, states, weigh)
	return here, elsewhere, priced
}

// bestOther is the eligible target other than f with a prediction whose price (predicted
// wait less the cache gain counted 1+weigh times) is lowest, and that price; found is false
// when there is none (price +Inf).
func bestOther[T comparable](gain map[T]float64, f T, states map[T]TargetState, weigh float64) (alt T, best float64, found bool) {
	best = math.Inf(1)
	for o, so := range states {
		if o == f || !so.HasWait {
			continue
		}
		g, ok := gainOn(gain, o)
		if !ok {
			continue
		}
		if p := so.WaitMs - (1+weigh)*g; p < best {
			alt, best, found = o, p, true
		}
	}
	return alt, best, found
}

// loadedShare is how much of the recompute weight a request pays for going to f instead of
// its best other target (the one price compares f with): the share of the remaining
// targets that are loaded, 1 when there are none. A target is loaded when it takes no
// request now: saturated, or its predicted wait at or over full (max_predicted_wait, 0:
// none), which is how an overloaded fleet with the queue on looks (the workers' own queues
// stay short of the busy thresholds). The GPU time a recompute takes is what
// the next requests wait behind only when the fleet is loaded; beside idle workers it delays
// nobody (as the router prices its sibling hold), and the request should not wait for its
// prefix holder for the fleet's sake.
func loadedShare[T comparable](gain map[T]float64, f T, states map[T]TargetState, weigh, full float64) float64 {
	alt, _, found := bestOther(gain, f, states, weigh)
	others, loaded := 0, 0
	for o, so := range states {
		if o == f || (found && o == alt) {
			continue
		}
		if _, ok := gainOn(gain, o); !ok {
			continue
		}
		others++
		if !admits(so, full) {
			loaded++
		}
	}
	if others == 0 {
		return 1
	}
	return float64(loaded) / float64(others)
}

// idleWaitMs is the predicted wait up to which a target counts as idle (backlogShare): the
// time model predicts 0 where no prefill is queued; the millisecond absorbs rounding.
const idleWaitMs = 1.0

// idle reports whether a target in state s is idle: not saturated (a target handed to a
// request not yet routed is), nothing in flight there, and no prefill queued there (its
// predicted wait, when known, at most idleWaitMs). A worker that only runs decodes is not
// idle: at 2x capacity a worker that has just finished its queued prefills still runs a full
// batch, and counting it idle let waiting requests leave their holders (single weka 2x runs
// moved 16 of 109 and 33 of 99 dispatched waiting requests away from their prefix,
// against 8-9 of 146-173 with the whole weight).
func idle(s TargetState) bool {
	return !s.Saturated && s.Running == 0 && (!s.HasWait || s.WaitMs <= idleWaitMs)
}

// minBacklogShare is the least share of the recompute weight a waiting request pays
// (backlogShare), however many idle targets could take the waiting requests. The idle worker
// a move fills is often wanted by the next arrival soon after, and the session's later turns
// follow its context there, so a move beside idle workers is not free: paying none let
// trace_0291's long-context requests leave their holders for a recompute as long as the
// holder's queue (at 1x: captured 0.966-0.980 and 108-116 good requests of 128, against 0.995
// and 114-116 with half; docs/benchmarks/2026-12-06-queue-floor.md). Half keeps a subagent
// fan-out spreading over idle workers: its shared prefix is short next to the parent
// worker's queue.
const minBacklogShare = 0.5

// backlogShare is how much of the recompute weight a waiting request pays (Next): the share
// of the waiting requests (waiting, itself included) that the idle targets eligible for it
// cannot take at once, max(0, waiting − idle) / waiting, and at least minBacklogShare. A
// request waits only because the fleet was loaded, and at 2x capacity every worker keeps a
// queue under max_predicted_wait while many requests wait: the whole weight, as the GPU time
// a recompute takes is what the backlog waits behind (loadedShare would count those workers
// as unloaded and let waiting requests leave their holders). When the idle targets are
// enough for every waiting request (a subagent fan-out beside idle workers), a recompute
// delays nobody now: it pays minBacklogShare, and does not wait long for a busy holder for
// the fleet's sake.
func backlogShare[T comparable](gain map[T]float64, states map[T]TargetState, waiting int) float64 {
	if waiting <= 0 {
		return 1
	}
	n := 0
	for t, s := range states {
		if _, ok := gainOn(gain, t); ok && idle(s) {
			n++
		}
	}
	return max(minBacklogShare, float64(max(0, waiting-n))/float64(waiting))
}

// Placement is Place's answer.
type Placement[T comparable] struct {
	// Allowed are the targets the request may be routed to now (the router's policy chooses
	// among them); none: it waits in the queue.
	Allowed []T
	// All: the route need not be narrowed (every target qualifies, or the request is neither
	// contended nor shielded: the router's own pricing, which sees more than the cache gain,
	// e.g. a sibling's prefix in flight, then chooses among every target).
	All bool
	// Reason says why none qualified: "saturated" (none admits it), "prefix_holder" (one
	// does, but waiting for a better-cached one is predicted sooner), "protected" (only
	// targets holding an outranking footprint admit it).
	Reason string
	// Protected names the rule that kept it off a target (Dispatch.Protected).
	Protected string
}

// Place decides for a request of class c that finds nobody waiting: the targets it may be
// routed to now, or none, and then it waits in the queue. A target qualifies when cache
// protection does not keep the request off it (shield), it admits the request's class (its
// predicted wait under the request's bound, see boundOf) and, by the time model, the
// request's prefill there would end no later than by waiting for its best other target
// (usually the holder of its prefix) to admit it. gains (Entry.Gain) is called only when some
// target does not admit the request or some target has a guard.
func (q *Queue[T]) Place(c Class, states map[T]TargetState, gains func() map[T]float64) Placement[T] {
	var gain map[T]float64
	asked := false
	gainOf := func() map[T]float64 {
		if !asked {
			gain, asked = gains(), true
		}
		return gain
	}
	guarded := q.lim.Protect && hasGuards(states)
	if guarded {
		gainOf() // before the lock: gains calls out (the router's scoring)
	}
	q.mu.Lock()
	now := q.now()
	b := q.boundOf(q.contentionAt(now), c.Priority, c.Tenant, now)
	var avoid map[T]bool
	var by string
	if guarded {
		avoid, by = q.shield(c, eligibleOf(gain, states), states, newShares(), now)
	}
	q.mu.Unlock()
	var free []T
	for t := range states {
		if !avoid[t] && takes(b, states, t) {
			free = append(free, t)
		}
	}
	if len(free) == 0 {
		reason := "saturated"
		for t := range avoid {
			if takes(b, states, t) {
				reason = "protected"
			}
		}
		return Placement[T]{Reason: reason, Protected: by}
	}
	if len(free) == len(states) {
		return Placement[T]{Allowed: free, All: true}
	}
	gain = gainOf()
	priceOn := withoutTargets(states, avoid)
	var allowed []T
	for _, f := range free {
		if _, ok := gainOn(gain, f); !ok {
			continue
		}
		if here, elsewhere, priced := price(gain, f, priceOn, q.lim.RecomputeWeight*loadedShare(gain, f, priceOn, q.lim.RecomputeWeight, q.lim.MaxWaitMs)); !priced || here <= elsewhere {
			allowed = append(allowed, f)
		}
	}
	if len(allowed) == 0 {
		return Placement[T]{Reason: "prefix_holder", Protected: by}
	}
	return Placement[T]{Allowed: allowed, All: !b.contended && len(avoid) == 0, Protected: by}
}

// hasGuards reports whether any target has a guard.
func hasGuards[T comparable](states map[T]TargetState) bool {
	for _, s := range states {
		if len(s.Guards) > 0 {
			return true
		}
	}
	return false
}

// evictFor returns the waiting entries to shed so that e fits: those of a lower priority than
// e's, the lowest priority first and within it the youngest first; ok is false when e cannot
// fit even so.
func (q *Queue[T]) evictFor(e *Entry[T]) (out []*Entry[T], ok bool) {
	var lower []*Entry[T]
	for p, b := range q.bands {
		if p >= e.Priority {
			continue
		}
		for _, es := range b.tenants {
			lower = append(lower, es...)
		}
	}
	slices.SortFunc(lower, func(x, y *Entry[T]) int {
		if x.Priority != y.Priority {
			return x.Priority - y.Priority
		}
		return int(y.seq) - int(x.seq)
	})
	n, bytes := q.n, q.bytes
	for i, x := range lower {
		if n+1 <= q.lim.MaxRequests && bytes+e.Bytes <= q.lim.MaxBytes {
			return lower[:i], true
		}
		n--
		bytes -= x.Bytes
	}
	if n+1 <= q.lim.MaxRequests && bytes+e.Bytes <= q.lim.MaxBytes {
		return lower, true
	}
	return nil, false
}

func fmtKey[T comparable](t T) string { return fmt.Sprint(t) }
