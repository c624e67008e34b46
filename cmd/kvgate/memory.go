package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/sessions"
	"github.com/kvgate/kvgate/tokenize"
)

// memoryCollector reports every bounded cache's byte budget and estimated bytes in use
// (kvgate_memory_budget_bytes{cache}, kvgate_memory_used_bytes{cache}), read at scrape time.
// docs/operations.md ("Memory budgets") lists the caches and their default budgets.
type memoryCollector struct {
	targets    func() int // worker+ranks in the fleet: per-target budgets are multiplied by it
	dispatcher *router.Dispatcher
	tok        *tokenize.Tokenizer // nil without a tokenizer
	index      *indexers.Index     // nil without KV events
	sessions   *sessions.Tracker   // nil without session tracking
	budget     *prometheus.Desc
	used       *prometheus.Desc
}

func newMemoryCollector(targets func() int, d *router.Dispatcher, tok *tokenize.Tokenizer, ix *indexers.Index, sm *sessions.Tracker) *memoryCollector {
	return &memoryCollector{targets: targets, dispatcher: d, tok: tok, index: ix, sessions: sm,
		budget: prometheus.NewDesc("kvgate_memory_budget_bytes",
			"Byte budget of each bounded cache (per-target caches: times the fleet's worker+ranks).", []string{"cache"}, nil),
		used: prometheus.NewDesc("kvgate_memory_used_bytes",
			"Estimated bytes each bounded cache holds (entries times its per-entry size, or its accounted bytes).", []string{"cache"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *memoryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.budget
	ch <- c.used
}

// Collect implements prometheus.Collector.
func (c *memoryCollector) Collect(ch chan<- prometheus.Metric) {
	for _, u := range c.uses() {
		ch <- prometheus.MustNewConstMetric(c.budget, prometheus.GaugeValue, float64(u.Budget), u.Cache)
		ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, float64(u.Used), u.Cache)
	}
}

// uses lists every cache's use and budget.
func (c *memoryCollector) uses() []router.MemoryUse {
	targets := c.targets()
	var out []router.MemoryUse
	if c.tok != nil {
		su, sb, mu, mb := c.tok.CacheMemory()
		out = append(out, router.MemoryUse{Cache: "segment_cache", Used: su, Budget: sb},
			router.MemoryUse{Cache: "chat_message_cache", Used: mu, Budget: mb})
	}
	if c.index != nil {
		used, per := c.index.MemoryUse()
		out = append(out, router.MemoryUse{Cache: "kv_index", Used: used, Budget: per * int64(targets)})
	}
	if c.sessions != nil {
		fu, fb, su, sb := c.sessions.MemoryUse()
		out = append(out, router.MemoryUse{Cache: "session_forest", Used: fu, Budget: fb},
			router.MemoryUse{Cache: "sessions", Used: su, Budget: sb})
	}
	if c.dispatcher != nil {
		out = append(out, c.dispatcher.MemoryUse(targets)...)
	}
	return out
}
