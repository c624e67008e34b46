package discovery

import (
	"log/slog"
	"sort"
	"sync"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/workers"
)

// Endpoint is one worker a source found: its config and whether it may take new requests
// (false: drain it).
type Endpoint struct {
	Worker configs.Worker
	Ready  bool
}

// reconciler makes the registry's discovered members match a source's desired set. It owns
// the workers it added: static workers (workers:) are never drained or removed by it.
type reconciler struct {
	source string
	reg    *workers.Registry
	m      *Metrics
	log    *slog.Logger

	mu        sync.Mutex
	owned     map[string]bool
	staticDup map[string]bool // discovered URLs that are static workers, warned once
}

func newReconciler(source string, reg *workers.Registry, m *Metrics, log *slog.Logger) *reconciler {
	return &reconciler{source: source, reg: reg, m: m, log: log, owned: map[string]bool{}, staticDup: map[string]bool{}}
}

// apply adds what is new, drains what is not ready, undrains what is ready again, re-adds
// what changed ports, and removes what is gone.
func (r *reconciler) apply(desired map[string]Endpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	urls := make([]string, 0, len(desired))
	for u := range desired {
		urls = append(urls, u)
	}
	sort.Strings(urls)
	for _, u := range urls {
		ep := desired[u]
		cur := r.reg.Get(u)
		switch {
		case cur != nil && !r.owned[u]:
			if !r.staticDup[u] {
				r.staticDup[u] = true
				r.log.Warn("discovered worker is also a static worker; the static entry stays as configured", "source", r.source, "worker", u)
			}
			continue
		case cur != nil && sameWorker(cur.Config(), ep.Worker):
			if cur.Draining() == ep.Ready {
				r.reg.SetDraining(u, !ep.Ready)
				if ep.Ready {
					r.m.event(r.source, "worker_ready")
				} else {
					r.m.event(r.source, "worker_draining")
				}
			}
			continue
		case cur != nil:
			// Same address, other ports or DP size: the old subscriptions are wrong.
			r.reg.Remove(u)
			delete(r.owned, u)
			r.m.event(r.source, "worker_removed")
		}
		if _, err := r.reg.Add(ep.Worker, !ep.Ready); err != nil {
			r.m.error(r.source, "endpoint")
			r.log.Warn("discovered worker not added", "source", r.source, "worker", u, "err", err)
			continue
		}
		r.owned[u] = true
		r.m.event(r.source, "worker_added")
		if !ep.Ready {
			r.m.event(r.source, "worker_draining")
		}
	}
	gone := make([]string, 0)
	for u := range r.owned {
		if _, ok := desired[u]; !ok {
			gone = append(gone, u)
		}
	}
	sort.Strings(gone)
	for _, u := range gone {
		r.reg.Remove(u)
		delete(r.owned, u)
		r.m.event(r.source, "worker_removed")
	}
	for u := range r.staticDup {
		if _, ok := desired[u]; !ok {
			delete(r.staticDup, u)
		}
	}
}

// sameWorker compares what discovery sets (the API key comes from auth, not the source).
func sameWorker(a, b configs.Worker) bool {
	return a.URL == b.URL && a.KVEvents == b.KVEvents && a.Replay == b.Replay && max(a.DPSize, 1) == max(b.DPSize, 1) && a.Topic == b.Topic
}
