package router

import (
	"fmt"
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/router/latency"
)

// timeMetrics are the time model's histograms, by worker (worker URL#rank).
type timeMetrics struct {
	pred, obs, errs *prometheus.HistogramVec
	samples         *prometheus.CounterVec   // by worker and source
	lost            *prometheus.CounterVec   // by worker
	fitErrs         *prometheus.HistogramVec // by source
}

func newTimeMetrics(reg prometheus.Registerer) (*timeMetrics, error) {
	secs := []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80}
	m := &timeMetrics{
		pred: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_router_predicted_ttft_seconds",
			Help:    "The kv policy's predicted time to first token on the chosen worker+rank, at routing.",
			Buckets: secs,
		}, []string{"worker"}),
		obs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_router_observed_ttft_seconds",
			Help:    "Time to first token the gateway measured (routing to the worker's first response byte), kv policy.",
			Buckets: secs,
		}, []string{"worker"}),
		errs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_router_ttft_prediction_error_ratio",
			Help:    "(predicted − observed) / observed time to first token, kv policy (positive: predicted too long).",
			Buckets: []float64{-0.9, -0.5, -0.25, -0.1, 0, 0.1, 0.25, 0.5, 1, 2, 5},
		}, []string{"worker"}),
	}
	m.samples = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvgate_router_latency_fit_samples_total",
		Help: "Samples the kv policy's per-worker latency fit took, by source (gateway_ttft, worker_prefill, worker_step, gateway_itl).",
	}, []string{"worker", "source"})
	m.fitErrs = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvgate_router_latency_fit_error_ratio",
		Help:    "(predicted − measured) / measured of each latency fit sample before the fit took it, by source.",
		Buckets: []float64{-0.9, -0.5, -0.25, -0.1, 0, 0.1, 0.25, 0.5, 1, 2, 5},
	}, []string{"source"})
	m.lost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvgate_router_cache_lost_before_schedule_tokens_total",
		Help: "Prompt tokens the index held on the chosen worker+rank at routing that the worker's cached_tokens did not reuse: evicted while the request waited there (kv policy).",
	}, []string{"worker"})
	for _, c := range []prometheus.Collector{m.pred, m.obs, m.errs, m.samples, m.fitErrs, m.lost} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register router latency metrics: %w", err)
		}
	}
	return m, nil
}

func (m *timeMetrics) predicted(worker string, ms float64) {
	if m != nil {
		m.pred.WithLabelValues(worker).Observe(ms / 1000)
	}
}

func (m *timeMetrics) fitted(worker string, src latency.Source, relErr float64) {
	if m == nil {
		return
	}
	m.samples.WithLabelValues(worker, src.String()).Inc()
	m.fitErrs.WithLabelValues(src.String()).Observe(relErr)
}

// cacheLost counts the tokens the index promised at routing that the worker did not reuse.
func (m *timeMetrics) cacheLost(worker string, tokens float64) {
	if m != nil && tokens > 0 {
		m.lost.WithLabelValues(worker).Add(tokens)
	}
}

func (m *timeMetrics) observed(worker string, ms, predMs float64) {
	if m == nil {
		return
	}
	m.obs.WithLabelValues(worker).Observe(ms / 1000)
	m.errs.WithLabelValues(worker).Observe((predMs - ms) / math.Max(ms, 1))
}
