package main

import (
	"context"
	"log/slog"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/workers"
)

// followMembership keeps routing in step with the fleet as discovery changes it. A worker
// that joins has its KV events followed (each rank joins from the worker's replay ring). A
// draining worker needs nothing here: it is no longer a candidate, so its sessions' next
// requests are placed (and rebound) elsewhere, while its subscription and index stay for the
// requests still running on it. A worker that leaves loses its subscriptions and index
// entries (the session frontiers on it go with them, through the index's change feed), its
// load, approximate blocks, latency fit and per-worker metric series.
func followMembership(ctx context.Context, reg *workers.Registry, disp *router.Dispatcher, k *kvParts, log *slog.Logger) {
	reg.OnMembership(func(ev workers.MemberEvent) {
		w := ev.Worker
		switch ev.Kind {
		case workers.MemberAdded:
			if k == nil {
				return
			}
			if _, err := k.subscribe(ctx, w.Config()); err != nil {
				log.Warn("discovered worker's KV events not followed; it is routed in approximate mode", "worker", w.URL(), "err", err)
			}
		case workers.MemberRemoved:
			for rank := range w.DPSize() {
				t := kvkey.Target{Worker: w.URL(), DPRank: rank}
				if k != nil {
					k.events.Stop(t, true)
					k.sessions.ApplyCleared(t) // also when the index never knew t (approximate mode)
				}
				disp.RemoveTarget(t)
			}
		}
	})
}
