package workers

import "github.com/prometheus/client_golang/prometheus"

// Collector returns the kvgate_workers{state} gauge: how many workers are in each state
// (healthy, unknown, ejected, draining), read from the registry at scrape time. Every state is
// reported, 0 included, so a dashboard's series never vanish.
func (r *Registry) Collector() prometheus.Collector { return workersCollector{r: r} }

var workersDesc = prometheus.NewDesc("kvgate_workers",
	"Workers in the fleet by state: healthy, unknown (not probed yet; routable), ejected (failed health probes), draining (terminating or not ready in discovery).",
	[]string{"state"}, nil)

type workersCollector struct{ r *Registry }

func (c workersCollector) Describe(ch chan<- *prometheus.Desc) { ch <- workersDesc }

func (c workersCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[string]int{StateHealthy: 0, StateUnknown: 0, StateEjected: 0, StateDraining: 0}
	for _, w := range c.r.Workers() {
		counts[w.Status().State]++
	}
	for st, n := range counts {
		ch <- prometheus.MustNewConstMetric(workersDesc, prometheus.GaugeValue, float64(n), st)
	}
}
