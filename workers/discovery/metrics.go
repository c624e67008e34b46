package discovery

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the discovery sources' counters, shared by every source of one gateway.
type Metrics struct {
	events *prometheus.CounterVec // source, type
	errors *prometheus.CounterVec // source, reason
}

// NewMetrics registers kvgate_discovery_events_total and kvgate_discovery_errors_total on reg
// (nil: counted but not exported).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_discovery_events_total",
			Help: "Discovery events by source (kubernetes, dns) and type: what the source saw (list, added, modified, deleted, bookmark, resolve) and what it changed in the fleet (worker_added, worker_draining, worker_ready, worker_removed).",
		}, []string{"source", "type"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_discovery_errors_total",
			Help: "Discovery failures by source and reason (unreachable, forbidden, unauthorized, gone, status, decode, token, watch_error, severed, resolve, endpoint).",
		}, []string{"source", "reason"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.events, m.errors} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("discovery metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *Metrics) event(source, typ string) {
	if m != nil {
		m.events.WithLabelValues(source, typ).Inc()
	}
}

func (m *Metrics) error(source, reason string) {
	if m != nil {
		m.errors.WithLabelValues(source, reason).Inc()
	}
}
