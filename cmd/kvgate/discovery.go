package main

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/server"
	"github.com/kvgate/kvgate/workers"
	"github.com/kvgate/kvgate/workers/discovery"
)

// newDiscovery registers the fleet's gauge (kvgate_workers) and builds the configured
// discovery source (nil: the static workers only). The caller starts it once every
// membership listener is registered.
func newDiscovery(cfg configs.Config, reg *workers.Registry, prom prometheus.Registerer, log *slog.Logger) (discovery.Source, error) {
	if err := prom.Register(reg.Collector()); err != nil {
		return nil, fmt.Errorf("workers metrics: %w", err)
	}
	if !cfg.Discovery.Enabled() {
		return nil, nil
	}
	m, err := discovery.NewMetrics(prom)
	if err != nil {
		return nil, err
	}
	return discovery.New(cfg.Discovery, reg, discovery.Options{Metrics: m, Log: log})
}

// forgetRemovedWorkers drops a removed worker's series from the server's metrics.
func forgetRemovedWorkers(reg *workers.Registry, srv *server.Server) {
	reg.OnMembership(func(ev workers.MemberEvent) {
		if ev.Kind == workers.MemberRemoved {
			srv.ForgetWorker(ev.Worker.URL())
		}
	})
}
