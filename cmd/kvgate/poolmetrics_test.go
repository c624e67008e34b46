package main

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// Two pools register the same collectors: the one without a model label gets the pool's model,
// the one with its own model label is joined, and both pools' series are served.
func TestPoolMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newPoolMetrics(reg)
	for _, model := range []string{"a", "b"} {
		r := m.forPool(model)
		decisions := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_decisions_total", Help: "h"}, []string{"policy"})
		reports := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_reports_total", Help: "h"}, []string{"model", "mode"})
		if err := r.Register(decisions); err != nil {
			t.Fatal(err)
		}
		if err := r.Register(reports); err != nil {
			t.Fatal(err)
		}
		decisions.WithLabelValues("kv").Inc()
		reports.WithLabelValues(model+"-adapter", "exact").Add(2)
	}
	want := `
# HELP t_decisions_total h
# TYPE t_decisions_total counter
t_decisions_total{model="a",policy="kv"} 1
t_decisions_total{model="b",policy="kv"} 1
# HELP t_reports_total h
# TYPE t_reports_total counter
t_reports_total{mode="exact",model="a-adapter"} 2
t_reports_total{mode="exact",model="b-adapter"} 2
`
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.TrimSpace(b.String()); got != strings.TrimSpace(want) {
		t.Errorf("gathered:\n%s\nwant:\n%s", got, want)
	}
	// A collector registered twice by one pool is still refused.
	dup := prometheus.NewCounter(prometheus.CounterOpts{Name: "t_decisions_total", Help: "h", ConstLabels: prometheus.Labels{"policy": "kv"}})
	if err := m.forPool("a").Register(dup); err == nil {
		t.Error("a duplicate series was accepted")
	}
}
