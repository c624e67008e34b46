package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/workers"
)

// metrics are the gateway's Prometheus series, registered on a registry owned by one Server.
type metrics struct {
	reg            *prometheus.Registry
	requests       *prometheus.CounterVec   // endpoint, code
	inFlight       *prometheus.GaugeVec     // endpoint
	ttfb           *prometheus.HistogramVec // endpoint
	duration       *prometheus.HistogramVec // endpoint
	upstreamErrors *prometheus.CounterVec   // worker, kind
	retries        *prometheus.CounterVec   // endpoint
	workerRequests *prometheus.CounterVec   // worker, code
	disconnects    *prometheus.CounterVec   // endpoint
	authFailures   *prometheus.CounterVec   // listener
	limited        *prometheus.CounterVec   // reason
}

// Upstream error kinds.
const (
	errConnect         = "connect"             // dial, reset or header timeout before any response
	errStatus          = "status"              // 502/503/504 from the worker, retried
	errBeforeFirstByte = "before_first_byte"   // response started but no body byte arrived
	errMidStream       = "mid_stream"          // the stream broke after bytes reached the client
	errIdle            = "idle_timeout"        // no bytes for proxy.stream_idle_timeout
	errFirstByte       = "first_byte_deadline" // no body byte within the predicted deadline (proxy.first_byte_*)
)

// newMetrics registers the server's series on prom (a new registry when nil); fleet lists every
// pool's workers at scrape time.
func newMetrics(fleet func() []*workers.Worker, prom *prometheus.Registry) *metrics {
	if prom == nil {
		prom = prometheus.NewRegistry()
	}
	m := &metrics{
		reg: prom,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_requests_total", Help: "Client requests by endpoint and HTTP status sent to the client (499: client went away).",
		}, []string{"endpoint", "code"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvgate_requests_in_flight", Help: "Client requests being served.",
		}, []string{"endpoint"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_time_to_first_byte_seconds", Help: "From request arrival to the first response body byte sent to the client.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"endpoint"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_request_duration_seconds", Help: "From request arrival to the end of the response.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
		}, []string{"endpoint"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_upstream_errors_total", Help: "Worker failures seen while proxying, by kind: connect, status, before_first_byte, mid_stream, idle_timeout, first_byte_deadline.",
		}, []string{"worker", "kind"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_retries_total", Help: "Requests sent to another worker after a failure before the first byte.",
		}, []string{"endpoint"}),
		workerRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_worker_requests_total", Help: "Requests sent to each worker by the HTTP status it answered (0: no answer).",
		}, []string{"worker", "code"}),
		disconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_client_disconnects_total", Help: "Requests whose client went away before the response ended (the upstream request is cancelled).",
		}, []string{"endpoint"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_auth_failures_total", Help: "Requests refused with 401 for a missing or wrong key, by listener: client (auth.api_keys) or admin (admin_token).",
		}, []string{"listener"}),
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_key_limited_total", Help: "Requests refused with 429 by their client key's limits (auth.keys), by reason: requests, tokens, concurrency.",
		}, []string{"reason"}),
	}
	m.reg.MustRegister(m.requests, m.inFlight, m.ttfb, m.duration, m.upstreamErrors, m.retries,
		m.workerRequests, m.disconnects, m.authFailures, m.limited, newWorkerCollector(fleet),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// workerCollector reads worker health and in-flight counts at scrape time. A worker belongs to
// one model's pool (configs checks it), so its URL alone names it.
type workerCollector struct {
	fleet                                    func() []*workers.Worker
	descHealthy, descInFlight, descEjections *prometheus.Desc
}

func newWorkerCollector(fleet func() []*workers.Worker) *workerCollector {
	return &workerCollector{
		fleet:         fleet,
		descHealthy:   prometheus.NewDesc("kvgate_worker_healthy", "1 when the worker is routable, 0 when ejected.", []string{"worker"}, nil),
		descInFlight:  prometheus.NewDesc("kvgate_worker_in_flight", "Requests in flight from this gateway to the worker's DP rank.", []string{"worker", "dp_rank"}, nil),
		descEjections: prometheus.NewDesc("kvgate_worker_ejections_total", "Times the worker was ejected by health checking.", []string{"worker"}, nil),
	}
}

func (c *workerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.descHealthy
	ch <- c.descInFlight
	ch <- c.descEjections
}

func (c *workerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, w := range c.fleet() {
		st := w.Status()
		healthy := 0.0
		if st.Healthy {
			healthy = 1
		}
		ch <- prometheus.MustNewConstMetric(c.descHealthy, prometheus.GaugeValue, healthy, st.URL)
		ch <- prometheus.MustNewConstMetric(c.descEjections, prometheus.CounterValue, float64(st.Ejections), st.URL)
		for rank, n := range st.InFlight {
			ch <- prometheus.MustNewConstMetric(c.descInFlight, prometheus.GaugeValue, float64(n), st.URL, strconv.Itoa(rank))
		}
	}
}

// detailedLabel marks a detailed series: one per worker.
const detailedLabel = "worker"

// publicGatherer is g without the detailed series (those with a worker label): the client
// listener's /metrics unless metrics.detailed_public.
type publicGatherer struct{ g prometheus.Gatherer }

// Gather implements prometheus.Gatherer.
func (p publicGatherer) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := p.g.Gather()
	out := mfs[:0]
	for _, mf := range mfs {
		ms := mf.Metric[:0]
		for _, m := range mf.Metric {
			if !hasLabel(m, detailedLabel) {
				ms = append(ms, m)
			}
		}
		if mf.Metric = ms; len(ms) > 0 {
			out = append(out, mf)
		}
	}
	return out, err
}

func hasLabel(m *dto.Metric, name string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return true
		}
	}
	return false
}
