package indexers

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/kvkey"
)

func (r *liveRig) sub(t kvkey.Target) *Subscriber {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return r.m.subs[t].sub
}

func (r *liveRig) debug(t *testing.T, tg kvkey.Target) TargetDebug {
	t.Helper()
	for _, d := range r.m.Snapshot() {
		if d.Worker == tg.Worker && d.DPRank == tg.DPRank {
			return d
		}
	}
	t.Fatalf("no snapshot for %v", tg)
	return TargetDebug{}
}

// A worker that restarts right after the gateway joined through its replay ring (so no batch
// has come over the live socket yet): its new batches are not late duplicates; the target is
// reset and follows the new engine.
func TestLiveRestartRightAfterJoin(t *testing.T) {
	rig := newLiveRig(t)
	tg := kvkey.Target{Worker: "http://rj", DPRank: 0}
	before, after := newScenario(t, 21, 10, LayoutMap), newScenario(t, 22, 5, LayoutMap)
	p := newTestPub(t, rig.m.zctx, "", 100, ReplayWithTopic)
	for _, pl := range before.payloads {
		p.publish(pl, false) // nobody subscribed: ring only
	}
	s := rig.follow(t, tg, p, true)
	waitSeq(t, s, 9)
	p.restart()
	for _, pl := range after.payloads {
		p.publish(pl, false)
	}
	waitFor(t, "restart reset", func() bool { return s.stats.resetsRestart.Load() == 1 })
	waitSeq(t, s, 4)
	if got, want := dumpTarget(rig.ix, tg), after.groundTruth(t, tg, 0, 5); !reflect.DeepEqual(got, want) {
		t.Fatalf("index after the restart: %d blocks, want the new engine's %d", len(got), len(want))
	}
	if !rig.m.EventsHealthy(tg) {
		t.Fatal("followed from the new engine's first batch, the index must be exact")
	}
}

// One bogus sequence number must not poison the stream: it is dropped and counted, and the
// genuine batches after it are applied.
func TestLiveBogusSeqDropped(t *testing.T) {
	for _, withReplay := range []bool{true, false} {
		t.Run(fmt.Sprintf("replay=%v", withReplay), func(t *testing.T) {
			rig := newLiveRig(t)
			tg := kvkey.Target{Worker: "http://bogus", DPRank: 0}
			sc := newScenario(t, 23, 10, LayoutMap)
			p := newTestPub(t, rig.m.zctx, "", 100, ReplayWithTopic)
			s := rig.follow(t, tg, p, withReplay)
			for _, pl := range sc.payloads[:5] {
				p.publish(pl, false)
			}
			waitSeq(t, s, 4)
			p.raw([]byte(""), SeqFrame(1_000_000_000_000), sc.payloads[5])
			for _, pl := range sc.payloads[5:] {
				p.publish(pl, false)
			}
			waitSeq(t, s, 9)
			if !reflect.DeepEqual(dumpTarget(rig.ix, tg), sc.groundTruth(t, tg, 0, 10)) {
				t.Fatal("index after a bogus seq differs from the genuine stream's")
			}
			d := rig.debug(t, tg)
			if d.Dropped[DropImplausible] != 1 || d.Resets[ResetGap] != 0 || d.IndexMode != ModeExact {
				t.Fatalf("dropped %v resets %v mode %s", d.Dropped, d.Resets, d.IndexMode)
			}
			reg := prometheus.NewRegistry()
			if err := rig.m.Register(reg); err != nil {
				t.Fatal(err)
			}
			if got := sampleValue(t, reg, "kvgate_kv_batches_dropped_total", "reason", DropImplausible); got != 1 {
				t.Fatalf("kvgate_kv_batches_dropped_total{reason=implausible_seq} = %v", got)
			}
		})
	}
}

// A replay whose replies have a hole (the ROUTER dropped one at its HWM): the contiguous part
// is applied and the rest asked for again, from the last applied batch, without a reset. A
// drop on every attempt cannot hit the re-ask, whose missing batch is its second reply.
func TestLiveReplayWithHole(t *testing.T) {
	for _, tc := range []struct {
		name   string
		drops  int
		resets int64
	}{{"hole once", 1, 0}, {"hole on every attempt", 3, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			rig := newLiveRig(t)
			tg := kvkey.Target{Worker: "http://hole", DPRank: 0}
			sc := newScenario(t, 24, 10, LayoutMap)
			p := newTestPub(t, rig.m.zctx, "", 100, ReplayWithTopic)
			s := rig.follow(t, tg, p, true)
			p.publish(sc.payloads[0], false)
			waitSeq(t, s, 0)
			p.do(func(_, _ *zmq.Socket) { p.dropReplies[4] = tc.drops })
			for i := 1; i < 9; i++ {
				p.publish(sc.payloads[i], true)
			}
			p.publish(sc.payloads[9], false)
			waitSeq(t, s, 9)
			waitFor(t, "replay done", func() bool { return s.stats.state.Load() == StateLive })
			if !reflect.DeepEqual(dumpTarget(rig.ix, tg), sc.groundTruth(t, tg, 0, 10)) {
				t.Fatal("index after a replay with a hole differs from the no-loss state")
			}
			if got := s.stats.resetsGap.Load(); got != tc.resets {
				t.Fatalf("gap resets %d, want %d", got, tc.resets)
			}
			if !rig.m.EventsHealthy(tg) {
				t.Fatal("complete from the ring's start, the index must be exact")
			}
		})
	}
}

// A sequence number no batch ever had (the sim's --fault-skip-seq-every): the ring, asked from
// the batch before it, shows nothing was lost, so the index stays exact and nothing is reset.
func TestLiveSkippedSeqIsNotALoss(t *testing.T) {
	rig := newLiveRig(t)
	tg := kvkey.Target{Worker: "http://skip", DPRank: 0}
	sc := newScenario(t, 25, 10, LayoutMap)
	p := newTestPub(t, rig.m.zctx, "", 100, ReplayWithTopic)
	s := rig.follow(t, tg, p, true)
	for i, pl := range sc.payloads {
		if i == 3 || i == 7 {
			p.skip()
		}
		p.publish(pl, i == 5)
	}
	waitSeq(t, s, 11)
	waitFor(t, "replay done", func() bool { return s.stats.state.Load() == StateLive })
	if !reflect.DeepEqual(dumpTarget(rig.ix, tg), sc.groundTruth(t, tg, 0, 10)) {
		t.Fatal("index after skipped sequence numbers differs from the no-loss state")
	}
	d := rig.debug(t, tg)
	if d.Resets[ResetGap] != 0 || d.IndexMode != ModeExact || d.Dropped[DropSkipped] != 2 {
		t.Fatalf("resets %v mode %s dropped %v", d.Resets, d.IndexMode, d.Dropped)
	}
}

// llm-d's simulator counts from 1: a first batch 1 with nothing before it is a complete
// stream, not a failed replay.
func TestLiveSeqFromOne(t *testing.T) {
	rig := newLiveRig(t)
	tg := kvkey.Target{Worker: "http://one", DPRank: 0}
	sc := newScenario(t, 25, 8, LayoutMap)
	p := newTestPub(t, rig.m.zctx, "", 100, ReplayWithTopic)
	p.do(func(_, _ *zmq.Socket) { p.seq = 1 })
	s := rig.follow(t, tg, p, true) // joined before the first batch
	for _, pl := range sc.payloads {
		p.publish(pl, false)
	}
	waitSeq(t, s, 8)
	if !reflect.DeepEqual(dumpTarget(rig.ix, tg), sc.groundTruth(t, tg, 0, 8)) {
		t.Fatal("stream from 1 not applied")
	}
	if d := rig.debug(t, tg); d.ReplaysFailed != 0 || d.Gaps != 0 || d.IndexMode != ModeExact || !rig.m.EventsHealthy(tg) {
		t.Fatalf("replays failed %d gaps %d mode %s", d.ReplaysFailed, d.Gaps, d.IndexMode)
	}
}

// last_seq is unsigned: a counter above 2^63 is reported as is, not negative.
func TestLiveLastSeqAbove2To63(t *testing.T) {
	rig := newLiveRig(t)
	tg := kvkey.Target{Worker: "http://big", DPRank: 0}
	sc := newScenario(t, 26, 3, LayoutMap)
	p := newTestPub(t, rig.m.zctx, "", 100, ReplayWithTopic)
	const base = uint64(1)<<63 + 5
	p.do(func(_, _ *zmq.Socket) { p.seq = base })
	s := rig.follow(t, tg, p, false)
	for _, pl := range sc.payloads {
		p.publish(pl, false)
	}
	waitFor(t, "last seq", func() bool { return s.stats.lastSeq.Load() == base+2 })
	if d := rig.debug(t, tg); d.LastSeq != base+2 || !d.HaveSeq {
		t.Fatalf("snapshot last_seq %d have %v", d.LastSeq, d.HaveSeq)
	}
	reg := prometheus.NewRegistry()
	if err := rig.m.Register(reg); err != nil {
		t.Fatal(err)
	}
	if got := sampleValue(t, reg, "kvgate_kv_last_seq", "", ""); got != float64(base+2) {
		t.Fatalf("kvgate_kv_last_seq = %v", got)
	}
}

// ZMQ_MAXMSGSIZE: a message above the limit never reaches the subscriber (libzmq drops the
// connection; it reconnects), while the same message under the default limit is delivered.
func TestLiveMaxMsgSize(t *testing.T) {
	for _, tc := range []struct {
		name      string
		limit     int64
		delivered int64
	}{{"default limit", 0, 1}, {"1 KiB limit", 1024, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			rig := newLiveRig(t)
			tg := kvkey.Target{Worker: "http://max", DPRank: 0}
			p := newTestPub(t, rig.m.zctx, "", 100, ReplayWithTopic)
			cfg := SubscriberConfig{Target: tg, Endpoint: p.pubEP, MaxMsgSize: tc.limit,
				ReconnectMin: 10 * time.Millisecond, ReconnectMax: 20 * time.Millisecond}
			if err := rig.m.Start(rig.ctx, cfg); err != nil {
				t.Fatal(err)
			}
			s := rig.sub(tg)
			time.Sleep(150 * time.Millisecond)
			big := make([]byte, 4096)
			for i := range big {
				big[i] = 0xc1 // never valid msgpack: counted as a payload error if delivered
			}
			p.raw([]byte(""), SeqFrame(0), big)
			// Then small batches until one arrives (the SUB may be reconnecting).
			sc := newScenario(t, 27, 1, LayoutMap)
			waitFor(t, "a small batch after the big one", func() bool {
				p.raw([]byte(""), SeqFrame(1), sc.payloads[0])
				time.Sleep(10 * time.Millisecond)
				return s.stats.haveSeq.Load()
			})
			if got := s.stats.parsePayload.Load(); got != tc.delivered {
				t.Fatalf("big message delivered %d times, want %d", got, tc.delivered)
			}
		})
	}
}

// Collector mode: kvgate binds one SUB, each worker's PUB connects to it, messages are
// attributed by topic (llm-d's kv@<pod-ip>:<port>@<model>) and data_parallel_rank, and each
// worker+rank recovers gaps from its own replay socket. Unknown topics are counted and dropped.
func TestLiveCollectorTwoWorkers(t *testing.T) {
	rig := newLiveRig(t)
	listen := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	type wk struct {
		tg    kvkey.Target
		topic string
		sc    scenario
		p     *testPub
	}
	ws := []*wk{
		{tg: kvkey.Target{Worker: "http://10.0.0.1:8000", DPRank: 0}, topic: "kv@10.0.0.1:8000@m"},
		{tg: kvkey.Target{Worker: "http://10.0.0.1:8000", DPRank: 1}, topic: "kv@10.0.0.1:8000@m"},
		{tg: kvkey.Target{Worker: "http://10.0.0.2:8000", DPRank: 0}, topic: "kv@10.0.0.2:8000@m"},
	}
	var targets []SubscriberConfig
	for i, w := range ws {
		w.sc = newScenario(t, uint64(30+i), 20, LayoutMap)
		for j, b := range w.sc.batches { // the rank travels in the batch
			b.DPRank = Some(int64(w.tg.DPRank))
			pl, err := EncodeBatch(b, EncodeOptions{Layout: LayoutMap})
			if err != nil {
				t.Fatal(err)
			}
			w.sc.payloads[j] = pl
		}
		w.p = newTestPubTo(t, rig.m.zctx, w.topic, 100, ReplayWithTopic, listen)
		targets = append(targets, SubscriberConfig{Target: w.tg, Topic: w.topic, ReplayEndpoint: w.p.repEP,
			ReplayTimeout: time.Second})
	}
	// Batches published before the collector exists are only in the rings.
	for _, w := range ws {
		for _, pl := range w.sc.payloads[:5] {
			w.p.publish(pl, false)
		}
	}
	if err := rig.m.StartCollector(rig.ctx, CollectorConfig{Listen: listen, Targets: targets}); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		s := rig.sub(w.tg)
		waitSeq(t, s, 4)
	}
	for i := 5; i < 20; i++ {
		for _, w := range ws {
			w.p.publish(w.sc.payloads[i], i%6 == 2) // some only in the ring: gaps
		}
	}
	ws[0].p.raw([]byte("kv@10.9.9.9:8000@m"), SeqFrame(0), ws[0].sc.payloads[0])
	for _, w := range ws {
		s := rig.sub(w.tg)
		waitSeq(t, s, 19)
		if !reflect.DeepEqual(dumpTarget(rig.ix, w.tg), w.sc.groundTruth(t, w.tg, 0, 20)) {
			t.Fatalf("%v: index differs from its worker's stream", w.tg)
		}
		if st := &s.stats; st.resetsGap.Load()+st.resetsRestart.Load() != 0 || st.rankMismatch.Load() != 0 {
			t.Fatalf("%v: resets %d/%d rank mismatches %d", w.tg, st.resetsGap.Load(), st.resetsRestart.Load(), st.rankMismatch.Load())
		}
		if !rig.m.EventsHealthy(w.tg) {
			t.Fatalf("%v not healthy", w.tg)
		}
	}
	waitFor(t, "unknown topic counted", func() bool {
		c := rig.m.Collectors()
		return len(c) == 1 && c[0].UnknownTopic == 1
	})
	if c := rig.m.Collectors()[0]; len(c.RecentUnknown) != 1 || c.RecentUnknown[0] != "kv@10.9.9.9:8000@m" || c.Targets != 3 {
		t.Fatalf("collector debug %+v", c)
	}
}

// sampleValue returns the value of the sample of a family whose label has the value ("" =
// the only sample), counter or gauge.
func sampleValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == "" && len(mf.GetMetric()) == 1
			for _, lp := range m.GetLabel() {
				if label != "" && lp.GetName() == label && lp.GetValue() == value {
					match = true
				}
			}
			if !match {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s{%s=%q}: no sample", name, label, value)
	return 0
}

// A worker process that restarts fast, re-binding its sockets before any /health probe could
// notice and publishing nothing yet: the SUB's monitor sees the connection drop and come back,
// and the ring check that follows (the same as for a health flap) resets the target before
// any new batch arrives. A reconnect to the same engine (its ring still holds the last batch)
// changes nothing.
func TestLiveReconnectChecksRing(t *testing.T) {
	rig := newLiveRig(t)
	tg := kvkey.Target{Worker: "http://rc", DPRank: 0}
	sc := newScenario(t, 21, 10, LayoutMap)
	p := newTestPub(t, rig.m.zctx, "", 100, ReplayWithTopic)
	s := rig.follow(t, tg, p, true)
	for _, pl := range sc.payloads {
		p.publish(pl, false)
	}
	waitSeq(t, s, 9)
	if len(dumpTarget(rig.ix, tg)) == 0 {
		t.Fatal("no blocks indexed before the restart")
	}
	p.bounce()
	waitFor(t, "reconnect check", func() bool { return s.stats.reconnectChecks.Load() >= 1 })
	waitFor(t, "restart reset", func() bool { return s.stats.resetsRestart.Load()+s.stats.resetsHealth.Load() >= 1 })
	if got := dumpTarget(rig.ix, tg); len(got) != 0 {
		t.Fatalf("after the restart, with no new batch, the index still credits %d blocks", len(got))
	}
}
