package indexers

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// collector exports per-target index and subscription metrics from the live counters at
// scrape time, so targets that come and go need no label bookkeeping.
type collector struct {
	m *Subscribers

	events, blocks, dropped, resident, orphans  *prometheus.Desc
	batches, gaps, replays, resets, parseErrors *prometheus.Desc
	reconnects, lastSeq, state, version         *prometheus.Desc
	joins, duplicates, recoveries               *prometheus.Desc
	droppedBatches, mode, unknownTopic          *prometheus.Desc
	refused                                     *prometheus.Desc
	warmStarts, warmBytes                       *prometheus.Desc
	silent                                      *prometheus.Desc
}

// Register registers the subscriptions' metrics (prefix kvgate_kv_) with reg.
func (m *Subscribers) Register(reg prometheus.Registerer) error {
	return reg.Register(m.Collector())
}

// Collector returns the subscriptions' metrics collector.
func (m *Subscribers) Collector() prometheus.Collector {
	l := []string{"worker", "dp_rank"}
	d := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc("kvgate_kv_"+name, help, append(append([]string{}, l...), extra...), nil)
	}
	return &collector{m: m,
		events:      d("events_applied_total", "KV events applied to the index, by kind and tier.", "kind", "tier"),
		blocks:      d("blocks_applied_total", "Blocks in applied KV events, by kind and tier.", "kind", "tier"),
		dropped:     d("blocks_dropped_total", "Blocks not applied, by reason.", "reason"),
		resident:    d("index_resident_blocks", "Blocks resident per tier in the index.", "tier"),
		orphans:     d("index_orphan_blocks", "Resident G1 blocks whose parent is not resident (queries scan these targets)."),
		batches:     d("event_batches_total", "Event batches received (live and replayed)."),
		gaps:        d("event_gaps_total", "Sequence gaps detected on the live stream."),
		replays:     d("replays_total", "Replay exchanges, by result.", "result"),
		resets:      d("resets_total", "Resets of the target's index state, by reason.", "reason"),
		parseErrors: d("parse_errors_total", "Malformed or unknown input skipped, by kind.", "kind"),
		reconnects:  d("reconnects_total", "Subscription restarts after socket errors."),
		lastSeq:     d("last_seq", "Last applied event batch sequence number (absent before the first)."),
		state:       d("subscription_state", "1 for the subscription's current state.", "state"),
		version:     d("residency_version", "Residency version (increases on every removal, clear and reset)."),
		joins:       d("join_replays_total", "Replays requested on (re)connecting, before any live batch revealed a gap."),
		duplicates:  d("late_duplicates_total", "Live batches skipped because a replay had already delivered them."),
		recoveries: d("parent_recoveries_total",
			"Stores with an unknown parent, placed under a recently routed prompt (recovered) or dropped (failed).", "result"),
		droppedBatches: d("batches_dropped_total", "Event batches not applied, by reason: late_duplicate, stale (older than the applied "+
			"batches of the same engine), implausible_seq (a jump the replay ring does not confirm), unconfirmed (a step back "+
			"no later batch confirmed), skipped_seq (a sequence number the replay ring shows no batch ever had).", "reason"),
		warmStarts: d("warm_starts_total", "Warm starts of the target's index from a peer replica's snapshot, by result: installed, "+
			"no_peer, timeout, fetch_failed, install_failed, rejected (the replay ring did not confirm its cursor), no_replay_endpoint, "+
			"content_rejected (the ring's last batches up to the cursor contradict its content).", "result"),
		warmBytes: d("warm_start_bytes_total", "Bytes of peer snapshots installed into the target's index."),
		mode:      d("index_approximate", "1 while the target's index lost batches and the router scores it approximately."),
		silent: d("events_silent", "1 while the subscription has heard no event although prompts were routed to the worker "+
			"for 30s (a worker publishing elsewhere: a --kv-events-config endpoint tcp://HOST:PORT connects out; see the log)."),
		unknownTopic: prometheus.NewDesc("kvgate_kv_collector_unknown_messages_total",
			"Messages the collector could not attribute to a configured worker+rank, by cause: topic, dp_rank, sender (not an address of the topic's worker).", []string{"listen", "cause"}, nil),
		refused: prometheus.NewDesc("kvgate_kv_collector_refused_connections_total",
			"Publisher connections the collector's ZAP handler refused (address not allowed, CURVE key not listed).", []string{"listen"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.events, c.blocks, c.dropped, c.resident, c.orphans, c.batches,
		c.gaps, c.replays, c.resets, c.parseErrors, c.reconnects, c.lastSeq, c.state, c.version, c.joins, c.duplicates,
		c.recoveries, c.droppedBatches, c.mode, c.unknownTopic, c.refused, c.warmStarts, c.warmBytes, c.silent} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	reg := c.m.ix.reg.Load()
	c.m.mu.Lock()
	subs := make(map[string]*Subscriber, len(c.m.subs))
	for t, r := range c.m.subs {
		subs[t.String()] = r.sub
	}
	collectors := append([]*collectorFeed(nil), c.m.collectors...)
	c.m.mu.Unlock()
	for _, cf := range collectors {
		ch <- prometheus.MustNewConstMetric(c.unknownTopic, prometheus.CounterValue, float64(cf.unknownTopic.Load()), cf.cfg.Listen, "topic")
		ch <- prometheus.MustNewConstMetric(c.unknownTopic, prometheus.CounterValue, float64(cf.unknownRank.Load()), cf.cfg.Listen, "dp_rank")
		if g := cf.guard; g != nil {
			ch <- prometheus.MustNewConstMetric(c.unknownTopic, prometheus.CounterValue, float64(g.sender.Load()), cf.cfg.Listen, "sender")
			ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(g.refused.Load()), cf.cfg.Listen)
		}
	}
	counter := func(d *prometheus.Desc, v int64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
	}
	gauge := func(d *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
	}
	for t, ts := range reg.byTarget {
		w, r := t.Worker, strconv.Itoa(t.DPRank)
		for k := range numKinds {
			for tier := range Tier(numTiers) {
				counter(c.events, ts.stats.events[k][tier].Load(), w, r, kindNames[k], tier.String())
				counter(c.blocks, ts.stats.blocks[k][tier].Load(), w, r, kindNames[k], tier.String())
			}
		}
		for i, name := range dropNames {
			counter(c.dropped, ts.stats.drops[i].Load(), w, r, name)
		}
		for tier := range Tier(numTiers) {
			gauge(c.resident, float64(ts.resident[tier].Load()), w, r, tier.String())
		}
		gauge(c.orphans, float64(ts.orphans[0].Load()), w, r)
		counter(c.recoveries, ts.stats.recovered.Load(), w, r, "recovered")
		counter(c.recoveries, ts.stats.unrecovered.Load(), w, r, "failed")
		gauge(c.version, float64(ts.version.Load()), w, r)
		s := subs[t.String()]
		if s == nil {
			continue
		}
		st := &s.stats
		counter(c.batches, st.batches.Load(), w, r)
		counter(c.gaps, st.gaps.Load(), w, r)
		counter(c.replays, st.replaysOK.Load(), w, r, "ok")
		counter(c.replays, st.replaysFailed.Load(), w, r, "failed")
		counter(c.resets, st.resetsGap.Load(), w, r, ResetGap)
		counter(c.resets, st.resetsRestart.Load(), w, r, ResetRestart)
		counter(c.resets, st.resetsHealth.Load(), w, r, ResetHealth)
		counter(c.resets, st.resetsWarm.Load(), w, r, ResetWarmStart)
		if s.cfg.WarmStart != nil {
			s.cursor.mu.Lock()
			counts, bytes := s.cursor.counts, s.cursor.bytes
			s.cursor.mu.Unlock()
			for i, res := range warmResults {
				counter(c.warmStarts, counts[i], w, r, res)
			}
			counter(c.warmBytes, bytes, w, r)
		}
		counter(c.parseErrors, st.parseFrames.Load(), w, r, "frames")
		counter(c.parseErrors, st.parsePayload.Load(), w, r, "payload")
		counter(c.parseErrors, st.malformed.Load(), w, r, "malformed_event")
		counter(c.parseErrors, st.unknownEvents.Load(), w, r, "unknown_event")
		counter(c.parseErrors, st.rankMismatch.Load(), w, r, "dp_rank_mismatch")
		counter(c.parseErrors, st.pendingOverflow.Load(), w, r, "replay_buffer_overflow")
		counter(c.reconnects, st.reconnects.Load(), w, r)
		silent := 0.0
		if st.silent.Load() {
			silent = 1
		}
		gauge(c.silent, silent, w, r)
		counter(c.joins, st.joinReplays.Load(), w, r)
		counter(c.duplicates, st.lateDuplicates.Load(), w, r)
		if st.haveSeq.Load() {
			gauge(c.lastSeq, float64(st.lastSeq.Load()), w, r)
		}
		counter(c.droppedBatches, st.lateDuplicates.Load(), w, r, DropLateDuplicate)
		counter(c.droppedBatches, st.stale.Load(), w, r, DropStale)
		counter(c.droppedBatches, st.implausible.Load(), w, r, DropImplausible)
		counter(c.droppedBatches, st.unconfirmed.Load(), w, r, DropUnconfirmed)
		counter(c.droppedBatches, st.skippedSeq.Load(), w, r, DropSkipped)
		approx := 0.0
		if st.approximate.Load() {
			approx = 1
		}
		gauge(c.mode, approx, w, r)
		cur, _ := st.state.Load().(string)
		for _, name := range []string{StateConnecting, StateLive, StateReplaying, StateBackoff, StateStopped} {
			v := 0.0
			if name == cur {
				v = 1
			}
			gauge(c.state, v, w, r, name)
		}
	}
}
