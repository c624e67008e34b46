package main

import (
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// poolMetrics registers every pool's routing metrics on the gateway's one registry. A pool's
// series get the label model=<the pool's model> (its index, load, sessions and fit are its
// own, and a worker belongs to one pool, so without it two pools' series would collide). A
// collector whose series already carry a model label (the router's usage feedback, labelled
// by the request's model, base or adapter, which names exactly one pool) is registered as it
// is: the pools' instances of it are joined into one collector, their label values disjoint.
type poolMetrics struct {
	base prometheus.Registerer

	mu     sync.Mutex
	joined map[string]*joinedCollector // by the collector's descriptors
}

func newPoolMetrics(base prometheus.Registerer) *poolMetrics {
	return &poolMetrics{base: base, joined: map[string]*joinedCollector{}}
}

// forPool is the Registerer a pool's routing registers its metrics on.
func (m *poolMetrics) forPool(model string) prometheus.Registerer {
	return poolRegisterer{m: m, wrapped: prometheus.WrapRegistererWith(prometheus.Labels{"model": model}, m.base)}
}

type poolRegisterer struct {
	m       *poolMetrics
	wrapped prometheus.Registerer
}

// Register implements prometheus.Registerer.
func (r poolRegisterer) Register(c prometheus.Collector) error {
	descs := describe(c)
	if !slices.ContainsFunc(descs, func(d string) bool { return hasVariableLabel(d, "model") }) {
		return r.wrapped.Register(c)
	}
	key := strings.Join(descs, "\n")
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	if j, ok := r.m.joined[key]; ok {
		j.add(c)
		return nil
	}
	j := &joinedCollector{parts: []prometheus.Collector{c}}
	if err := r.m.base.Register(j); err != nil {
		return err
	}
	r.m.joined[key] = j
	return nil
}

// MustRegister implements prometheus.Registerer.
func (r poolRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// Unregister implements prometheus.Registerer (for the wrapped collectors; joined ones stay).
func (r poolRegisterer) Unregister(c prometheus.Collector) bool { return r.wrapped.Unregister(c) }

// describe lists a collector's descriptors as text, sorted.
func describe(c prometheus.Collector) []string {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	var out []string
	for d := range ch {
		out = append(out, d.String())
	}
	slices.Sort(out)
	return out
}

// variableLabels reads the variable label names from prometheus.Desc.String (the only view of
// a Desc's labels client_golang gives; TestPoolMetrics fails if its format changes).
var variableLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)

func hasVariableLabel(desc, name string) bool {
	m := variableLabels.FindStringSubmatch(desc)
	return m != nil && slices.Contains(strings.Split(m[1], ","), name)
}

// joinedCollector collects several pools' instances of one collector.
type joinedCollector struct {
	mu    sync.Mutex
	parts []prometheus.Collector
}

func (j *joinedCollector) add(c prometheus.Collector) {
	j.mu.Lock()
	j.parts = append(j.parts, c)
	j.mu.Unlock()
}

// Describe implements prometheus.Collector: the first instance's descriptors (every instance
// has the same).
func (j *joinedCollector) Describe(ch chan<- *prometheus.Desc) {
	j.mu.Lock()
	first := j.parts[0]
	j.mu.Unlock()
	first.Describe(ch)
}

// Collect implements prometheus.Collector.
func (j *joinedCollector) Collect(ch chan<- prometheus.Metric) {
	j.mu.Lock()
	parts := slices.Clone(j.parts)
	j.mu.Unlock()
	for _, c := range parts {
		c.Collect(ch)
	}
}
