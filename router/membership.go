package router

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/kvkey"
)

// RemoveTarget drops everything the dispatcher keeps about t, whose worker left the fleet
// (discovery removed it): its load (requests still in flight release into the dropped state),
// approximate-mode blocks (freeing its slot), recent prompts, working set, latency fit and
// its per-worker metric series. A worker that comes back at the same address starts afresh.
func (e *Dispatcher) RemoveTarget(t kvkey.Target) {
	e.load.remove(t)
	if e.approx != nil {
		e.approx.RemoveTarget(t)
	}
	if e.kv == nil {
		return
	}
	if e.kv.recent != nil {
		e.kv.recent.forget(t)
	}
	if tm := e.kv.timed; tm != nil {
		if tm.workset != nil {
			tm.workset.forget(t)
		}
		tm.targets.forget(t)
		tm.metrics.forget(t.String())
	}
}

// remove forgets t's load.
func (lt *LoadTracker) remove(t kvkey.Target) {
	lt.mu.Lock()
	delete(lt.targets, t)
	lt.mu.Unlock()
}

// forget deletes every series labelled with worker (a target's "url#rank").
func (m *timeMetrics) forget(worker string) {
	if m == nil {
		return
	}
	l := prometheus.Labels{"worker": worker}
	m.pred.DeletePartialMatch(l)
	m.obs.DeletePartialMatch(l)
	m.errs.DeletePartialMatch(l)
	m.samples.DeletePartialMatch(l)
	m.lost.DeletePartialMatch(l)
}
