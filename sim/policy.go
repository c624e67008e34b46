package sim

import (
	"fmt"
	"slices"
)

// The scheduling policies of vLLM's --scheduling-policy (vllm/config/scheduler.py,
// SchedulerConfig.policy; default fcfs).
const (
	PolicyFCFS     = "fcfs"
	PolicyPriority = "priority"
)

// validPolicy reports whether p is a policy the simulator implements.
func validPolicy(p string) error {
	if p != PolicyFCFS && p != PolicyPriority {
		return fmt.Errorf("scheduling-policy must be %q or %q, got %q", PolicyFCFS, PolicyPriority, p)
	}
	return nil
}

// priorityBefore is the priority policy's order of waiting requests, vLLM's Request ordering
// (vllm/v1/request.py, Request.__lt__, as vllm/v1/core/sched/request_queue.py's
// PriorityRequestQueue heap uses it): the smaller priority value first, then the earlier
// arrival.
func priorityBefore(a, b *simRequest) bool {
	if a.priority != b.priority {
		return a.priority < b.priority
	}
	return a.arrival.Before(b.arrival)
}

// enqueueWaiting adds r to the waiting queue. Under fcfs a new request goes to the back and a
// preempted one (front) to the front, as vLLM's FCFSRequestQueue add_request and
// prepend_request do; under priority both take their place in (priority, arrival) order,
// since PriorityRequestQueue has no front (its prepend_request is add_request).
func enqueueWaiting(policy string, waiting []*simRequest, r *simRequest, front bool) []*simRequest {
	if policy != PolicyPriority {
		if front {
			return slices.Insert(waiting, 0, r)
		}
		return append(waiting, r)
	}
	// After every request that goes before r or ties with it: equal keys keep their order.
	i, _ := slices.BinarySearchFunc(waiting, r, func(w, r *simRequest) int {
		if priorityBefore(r, w) {
			return 1
		}
		return -1
	})
	return slices.Insert(waiting, i, r)
}

// preemptionVictim is the index in running of the request to preempt when KV blocks run
// out: under fcfs the last one scheduled (the newest), under priority the one with the
// largest (priority, arrival), as vLLM's Scheduler.schedule picks it
// (vllm/v1/core/sched/scheduler.py).
func preemptionVictim(policy string, running []*simRequest) int {
	if policy != PolicyPriority {
		return len(running) - 1
	}
	v := 0 // the first of equal maxima, as Python's max
	for i := 1; i < len(running); i++ {
		if priorityBefore(running[v], running[i]) {
			v = i
		}
	}
	return v
}
