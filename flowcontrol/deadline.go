package flowcontrol

import (
	"cmp"
	"slices"
	"time"
)

// The deadline (flow_control.queue_timeout, counted from the request's arrival): the queue
// bounds a request's time to its first token, not only its wait at the gateway. A request
// whose first token, by the time model (the predicted wait on a target plus its own prefill
// there, Entry.Prefill, both scaled by the model's recent shortfall there,
// TargetState.TTFTRatio), can no longer come before its deadline on any target is taken out
// of the queue at once (Late) and answered like a timeout, instead of waiting out the
// timeout or being sent where it would still prefill past it. While it can make it, a target
// where it would be late is neither taken nor priced as the alternative worth waiting for.
// Cache protection does not yield to the deadline: letting a flood's request onto the light
// tenant's worker when only that worker could still serve it in time put the flood's largest
// prefills ahead of the light tenant's next turns and evicted its context
// (docs/benchmarks/2026-12-05-cache-protection.md); such a request is shed instead. A
// dispatched request carries its deadline (Dispatch.Due) for the caller to hold the worker
// to: the prediction, even with the margin, is not a promise.

// firstTokenAt is when e's first token is predicted if e went to t (state s) at now; ok is
// false without a prediction (no time model, or no prefill predicted there). The predicted
// wait and own prefill are scaled by how far the time model has fallen short there lately
// (TargetState.TTFTRatio, a high quantile of measured over predicted; never below 1): on a
// loaded worker it underestimated prefills by 30-50%, and a request dispatched with its first
// token predicted just in time got it past its deadline. Its own prefill counts at most half
// of its time budget (from entering the queue to its deadline): a prompt whose prefill alone
// takes longer than queue_timeout has its first token after the deadline on every worker,
// even an idle one, and must not be refused for its length; its wait is then bounded by the
// rest of the budget instead.
func (e *Entry[T]) firstTokenAt(t T, s TargetState, now time.Time) (at time.Time, ok bool) {
	own, ok, _ := e.ownMs(t, s)
	if !ok || !s.HasWait {
		return time.Time{}, false
	}
	return now.Add(time.Duration((s.WaitMs*s.margin() + own) * float64(time.Millisecond))), true
}

// ownMs is e's own prefill on t (state s) scaled by the margin and capped at half its time
// budget; capped reports that the cap applied (its prefill alone passes half the budget: no
// worker could keep its deadline, firstTokenAt and due); ok is false without a prediction.
func (e *Entry[T]) ownMs(t T, s TargetState) (ms float64, ok, capped bool) {
	own, ok := e.Prefill[t]
	if !ok {
		return 0, false, false
	}
	own *= s.margin()
	half := e.budgetMs() / 2
	return min(own, half), true, own > half
}

// margin is the factor the deadline check scales t's predictions by: TTFTRatio, at least 1.
func (s TargetState) margin() float64 {
	return max(s.TTFTRatio, 1)
}

// budgetMs is e's time budget in ms, from entering the queue to its deadline.
func (e *Entry[T]) budgetMs() float64 {
	return float64(e.Deadline.Sub(e.enqueued)) / float64(time.Millisecond)
}

// due is when e, sent to t (state s), must have its first token: its deadline, or zero
// when it has none or its own prefill there (with the margin) alone passes half its budget
// (firstTokenAt's cap: no worker could keep the promise).
func (e *Entry[T]) due(t T, s TargetState) time.Time {
	if e.Deadline.IsZero() {
		return time.Time{}
	}
	if _, _, capped := e.ownMs(t, s); capped {
		return time.Time{}
	}
	return e.Deadline
}

// lateOn reports whether e, sent to t now, is predicted to have its first token after its
// deadline (false without a deadline or a prediction).
func (e *Entry[T]) lateOn(t T, s TargetState, now time.Time) bool {
	if e.Deadline.IsZero() {
		return false
	}
	at, ok := e.firstTokenAt(t, s, now)
	return ok && at.After(e.Deadline)
}

// lateTargets is the eligible targets of states where e is predicted late (nil when none).
func (e *Entry[T]) lateTargets(states map[T]TargetState, now time.Time) map[T]bool {
	if e.Deadline.IsZero() || e.Prefill == nil {
		return nil
	}
	var late map[T]bool
	for t, s := range states {
		if _, ok := gainOn(e.Gain, t); ok && e.lateOn(t, s, now) {
			if late == nil {
				late = map[T]bool{}
			}
			late[t] = true
		}
	}
	return late
}

// hopeless reports whether e can no longer have its first token by its deadline on any
// eligible target of states (at least one): on a target that admits it now (full, the
// uncontended bound) its predicted wait plus its own prefill ends past the deadline; on one
// that does not, its own prefill alone does. A busy target's predicted wait counts the
// prefill in flight there whole, however far along it is, so it would shed too early; once
// such a target admits someone, its wait is under the bound.
func (e *Entry[T]) hopeless(states map[T]TargetState, now time.Time, full float64) bool {
	if e.Deadline.IsZero() || e.Prefill == nil {
		return false
	}
	n := 0
	for t, s := range states {
		if _, ok := gainOn(e.Gain, t); !ok {
			continue
		}
		if !admits(s, full) {
			s.WaitMs = 0
		}
		if !e.lateOn(t, s, now) {
			return false
		}
		n++
	}
	return n > 0
}

// Late removes and returns, oldest first, the waiting entries that can no longer have their
// first token by their deadline (Entry.Deadline) on any eligible target of states, by the
// time model (hopeless: its own prefill, Entry.Prefill, after the predicted wait of a target
// that takes requests now), and whose deadline is more than margin away (the caller's timer
// answers the others). An entry with an eligible target without a prediction stays (its
// deadline still bounds it). The caller answers them as shed.
func (q *Queue[T]) Late(states map[T]TargetState, margin time.Duration) []*Entry[T] {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	var out []*Entry[T]
	for _, p := range q.prios {
		for _, es := range q.bands[p].tenants {
			for _, e := range es {
				if e.Deadline.Sub(now) > margin && e.hopeless(states, now, q.lim.MaxWaitMs) {
					out = append(out, e)
				}
			}
		}
	}
	slices.SortFunc(out, func(x, y *Entry[T]) int { return cmp.Compare(x.seq, y.seq) })
	for _, e := range out {
		q.unlink(e, stateRemoved)
	}
	return out
}

// union is a's and b's keys (a itself when b is empty).
func union[T comparable](a, b map[T]bool) map[T]bool {
	if len(b) == 0 {
		return a
	}
	out := make(map[T]bool, len(a)+len(b))
	for t := range a {
		out[t] = true
	}
	for t := range b {
		out[t] = true
	}
	return out
}
