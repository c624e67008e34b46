package indexers

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testport"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/kvkey"
)

// scenario is a deterministic stream of encoded batches for one target.
type scenario struct {
	payloads [][]byte
	batches  []*EventBatch
}

func newScenario(t testing.TB, seed uint64, n int, layout Layout) scenario {
	r := rand.New(rand.NewPCG(seed, 7))
	w := newModelWorld(r, 1)
	var sc scenario
	for len(sc.batches) < n {
		b := &EventBatch{TS: float64(len(sc.batches)), DPRank: Some[int64](0)}
		for range 1 + r.IntN(3) {
			if ev := w.step(r, 0); ev != nil {
				b.Events = append(b.Events, ev)
			}
		}
		p, err := EncodeBatch(b, EncodeOptions{Layout: layout})
		if err != nil {
			t.Fatal(err)
		}
		sc.batches = append(sc.batches, b)
		sc.payloads = append(sc.payloads, p)
	}
	return sc
}

// groundTruth applies batches [from, to) directly to a fresh index.
func (sc scenario) groundTruth(t testing.TB, tg kvkey.Target, from, to int) map[kvkey.BlockHash][numTiers]int32 {
	ix := NewIndex(Options{BlockSize: modelBS})
	if err := ix.AddTarget(tg); err != nil {
		t.Fatal(err)
	}
	for _, p := range sc.payloads[from:to] {
		b, err := DecodeBatch(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := ix.Apply(tg, b); err != nil {
			t.Fatal(err)
		}
	}
	return dumpTarget(ix, tg)
}

// dumpTarget is a target's residency: our hash → references per tier.
func dumpTarget(ix *Index, tg kvkey.Target) map[kvkey.BlockHash][numTiers]int32 {
	ts := ix.reg.Load().byTarget[tg]
	out := map[kvkey.BlockHash][numTiers]int32{}
	if ts == nil {
		return out
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for h, i := range ts.byOur {
		if n := ts.slab[i]; n.res != [numTiers]int32{} {
			out[h] = n.res
		}
	}
	return out
}

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type liveRig struct {
	m   *Subscribers
	ix  *Index
	ctx context.Context
}

func newLiveRig(t *testing.T) *liveRig {
	ix := NewIndex(Options{BlockSize: modelBS})
	m, err := NewSubscribers(ix, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); _ = m.Close() })
	return &liveRig{m: m, ix: ix, ctx: ctx}
}

func (r *liveRig) follow(t *testing.T, tg kvkey.Target, p *testPub, withReplay bool) *Subscriber {
	cfg := SubscriberConfig{Target: tg, Endpoint: p.pubEP, Topic: p.topic, ReplayTimeout: time.Second}
	if withReplay {
		cfg.ReplayEndpoint = p.repEP
	}
	if err := r.m.Start(r.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	r.m.mu.Lock()
	s := r.m.subs[tg].sub
	r.m.mu.Unlock()
	time.Sleep(150 * time.Millisecond) // let the SUB connect (a missed start is replayed anyway)
	return s
}

func waitSeq(t *testing.T, s *Subscriber, seq int) {
	waitFor(t, "last seq", func() bool { return s.stats.haveSeq.Load() && s.stats.lastSeq.Load() == uint64(seq) })
}

func TestLiveGapRecoveredByReplay(t *testing.T) {
	for _, f := range []ReplayFormat{ReplayWithTopic, ReplayNoTopic} {
		t.Run(map[ReplayFormat]string{ReplayWithTopic: "v0.26 replay", ReplayNoTopic: "old replay"}[f], func(t *testing.T) {
			rig := newLiveRig(t)
			tg := kvkey.Target{Worker: "http://w1", DPRank: 0}
			sc := newScenario(t, 1, 60, LayoutMap)
			p := newTestPub(t, rig.m.zctx, "kv-events", DefaultReplayBufferSteps, f)
			s := rig.follow(t, tg, p, true)
			for i, payload := range sc.payloads {
				p.publish(payload, i < len(sc.payloads)-1 && (i%7 == 3 || (i > 20 && i < 26))) // single losses and a run
			}
			waitSeq(t, s, len(sc.payloads)-1)
			if want := sc.groundTruth(t, tg, 0, len(sc.payloads)); !reflect.DeepEqual(dumpTarget(rig.ix, tg), want) {
				t.Fatalf("index after replayed gaps differs from the no-loss state")
			}
			if s.stats.gaps.Load() == 0 || s.stats.replaysOK.Load() == 0 || s.stats.resetsGap.Load() != 0 {
				t.Fatalf("gaps %d replays %d resets %d", s.stats.gaps.Load(), s.stats.replaysOK.Load(), s.stats.resetsGap.Load())
			}
		})
	}
}

func TestLiveUnrecoverableGapResetsOnlyThatTarget(t *testing.T) {
	rig := newLiveRig(t)
	ta := kvkey.Target{Worker: "http://a", DPRank: 0}
	tb := kvkey.Target{Worker: "http://b", DPRank: 1}
	sa, sb := newScenario(t, 2, 40, LayoutMap), newScenario(t, 3, 40, LayoutArray)
	pa := newTestPub(t, rig.m.zctx, "", 3, ReplayWithTopic) // ring of 3: too short for the gap
	pb := newTestPub(t, rig.m.zctx, "", 100, ReplayWithTopic)
	subA, subB := rig.follow(t, ta, pa, true), rig.follow(t, tb, pb, true)
	for i := range 40 {
		pa.publish(sa.payloads[i], i >= 20 && i < 35) // 15 lost, only 3 in the ring
		pb.publish(sb.payloads[i], false)
	}
	waitSeq(t, subA, 39)
	waitSeq(t, subB, 39)
	if subA.stats.resetsGap.Load() != 1 || subB.stats.resetsGap.Load() != 0 {
		t.Fatalf("resets: a %d, b %d", subA.stats.resetsGap.Load(), subB.stats.resetsGap.Load())
	}
	// After the reset A knows what the ring still had when the gap was seen (batches 37..39,
	// requested at batch 35 → ring then held 33..35; live 36.. follow), B is untouched.
	if !reflect.DeepEqual(dumpTarget(rig.ix, tb), sb.groundTruth(t, tb, 0, 40)) {
		t.Fatal("target b changed by a's reset")
	}
	gotA := dumpTarget(rig.ix, ta)
	matched := false
	for from := 33; from <= 35; from++ {
		if reflect.DeepEqual(gotA, sa.groundTruth(t, ta, from, 40)) {
			matched = true
		}
	}
	if !matched {
		t.Fatalf("target a after reset is not the tail state (%d blocks)", len(gotA))
	}
}

func TestLiveRestartDetected(t *testing.T) {
	rig := newLiveRig(t)
	tg := kvkey.Target{Worker: "http://r", DPRank: 0}
	before, after := newScenario(t, 4, 15, LayoutMap), newScenario(t, 5, 10, LayoutMap)
	p := newTestPub(t, rig.m.zctx, "kv-events", 100, ReplayWithTopic)
	s := rig.follow(t, tg, p, true)
	for _, pl := range before.payloads {
		p.publish(pl, false)
	}
	waitSeq(t, s, 14)
	v := rig.ix.ResidencyVersion(tg)
	p.restart()
	for _, pl := range after.payloads {
		p.publish(pl, false)
	}
	waitFor(t, "restart reset", func() bool { return s.stats.resetsRestart.Load() == 1 })
	waitSeq(t, s, 9)
	if !reflect.DeepEqual(dumpTarget(rig.ix, tg), after.groundTruth(t, tg, 0, 10)) {
		t.Fatal("state after restart is not the new engine's state alone")
	}
	if rig.ix.ResidencyVersion(tg) <= v {
		t.Fatal("residency version did not move on restart")
	}
	// A health flap reported by the gateway's prober is only a hint: the stream never broke
	// and the ring still holds the last applied batch, so the index is kept.
	v = rig.ix.ResidencyVersion(tg)
	joins := s.stats.joinReplays.Load()
	rig.m.WorkerRestarted("http://r")
	waitFor(t, "flap checked against the ring", func() bool {
		return s.stats.replaysOK.Load() > 0 && s.stats.state.Load() == StateLive
	})
	time.Sleep(100 * time.Millisecond)
	if s.stats.resetsHealth.Load() != 0 || rig.ix.ResidencyVersion(tg) != v || s.stats.joinReplays.Load() != joins {
		t.Fatalf("flap of an intact stream reset the index (health resets %d)", s.stats.resetsHealth.Load())
	}
	// A worker that restarted quietly (its new batches only in the ring, none live yet) and
	// flapped: the ring no longer holds the last applied batch, so the target is reset and
	// rebuilt at once from the new engine's ring, without a new live batch.
	again := newScenario(t, 13, 6, LayoutMap)
	p.restart()
	for _, pl := range again.payloads {
		p.publish(pl, true)
	}
	rig.m.WorkerRestarted("http://r")
	waitFor(t, "health reset", func() bool { return s.stats.resetsHealth.Load() == 1 })
	waitSeq(t, s, 5)
	if rig.ix.ResidencyVersion(tg) <= v {
		t.Fatal("residency version did not move on the health reset")
	}
	if !reflect.DeepEqual(dumpTarget(rig.ix, tg), again.groundTruth(t, tg, 0, 6)) {
		t.Fatal("state after the health reset is not the ring's")
	}
	if !rig.m.EventsHealthy(tg) {
		t.Fatal("rebuilt from the ring's start, the target must be exact")
	}
}

func TestLiveGarbageSurvived(t *testing.T) {
	rig := newLiveRig(t)
	tg := kvkey.Target{Worker: "http://g", DPRank: 0}
	sc := newScenario(t, 6, 12, LayoutMap)
	p := newTestPub(t, rig.m.zctx, "", 100, ReplayWithTopic)
	s := rig.follow(t, tg, p, true)
	for i, pl := range sc.payloads {
		if i == 5 {
			// Malformed frames are in no replay ring: the SUB must be receiving live before
			// they go out. Follow's sleep does not promise that on a loaded CPU; the first five
			// batches applied (live, or by the join replay once the SUB connected) do.
			waitSeq(t, s, 4)
			p.raw([]byte{}, []byte{1, 2, 3}, []byte{0x93})    // 3-byte seq frame
			p.raw([]byte{}, SeqFrame(999))                    // 2 frames
			p.raw([]byte{}, SeqFrame(0), []byte{}, []byte{1}) // 4 frames
		}
		if i == 8 {
			// A garbage payload under a valid seq: counted, skipped, the stream continues.
			p.publish([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}, false)
			p.publish(pl, false)
			continue
		}
		p.publish(pl, false)
	}
	waitSeq(t, s, len(sc.payloads))
	if s.stats.parseFrames.Load() != 3 || s.stats.parsePayload.Load() != 1 {
		t.Fatalf("parse errors: frames %d payload %d", s.stats.parseFrames.Load(), s.stats.parsePayload.Load())
	}
	if !reflect.DeepEqual(dumpTarget(rig.ix, tg), sc.groundTruth(t, tg, 0, len(sc.payloads))) {
		t.Fatal("garbage changed the index")
	}
	if s.stats.resetsGap.Load()+s.stats.resetsRestart.Load() != 0 {
		t.Fatal("garbage caused a reset")
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	return testport.Free(t)
}

// Workers configured with a non-wildcard endpoint connect out (vLLM binds only endpoints with "*"): the gateway binds.
func TestLiveBindModeAndBackoff(t *testing.T) {
	rig := newLiveRig(t)
	tg := kvkey.Target{Worker: "http://out", DPRank: 0}
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	if err := rig.m.Start(rig.ctx, SubscriberConfig{Target: tg, Endpoint: ep, Bind: true}); err != nil {
		t.Fatal(err)
	}
	pub, err := rig.m.zctx.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	_ = pub.SetLinger(0)
	if err := pub.Connect(ep); err != nil {
		t.Fatal(err)
	}
	// The subscriber reports the connection once the handshake is done (its socket monitor);
	// the PUB then still needs a moment to process the subscription (slow joiner), and this
	// subscriber has no replay socket to recover what it drops.
	waitFor(t, "connection", func() bool { return rig.m.EventsHealthy(tg) })
	time.Sleep(100 * time.Millisecond)
	sc := newScenario(t, 8, 5, LayoutMap)
	for i, p := range sc.payloads {
		if _, err := pub.SendMessage(LiveFrames("", uint64(i), p)); err != nil {
			t.Fatal(err)
		}
	}
	rig.m.mu.Lock()
	s := rig.m.subs[tg].sub
	rig.m.mu.Unlock()
	waitSeq(t, s, 4)
	if !reflect.DeepEqual(dumpTarget(rig.ix, tg), sc.groundTruth(t, tg, 0, 5)) {
		t.Fatal("bind-mode stream not applied")
	}
	// A second subscriber binding the same port fails and backs off, retrying.
	tg2 := kvkey.Target{Worker: "http://clash", DPRank: 0}
	if err := rig.m.Start(rig.ctx, SubscriberConfig{Target: tg2, Endpoint: ep, Bind: true,
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	rig.m.mu.Lock()
	s2 := rig.m.subs[tg2].sub
	rig.m.mu.Unlock()
	waitFor(t, "reconnect attempts", func() bool { return s2.stats.reconnects.Load() >= 2 })
	rig.m.Stop(tg2, true)
	if st, _ := s2.stats.state.Load().(string); st != StateStopped {
		t.Fatalf("state after Stop: %s", st)
	}
}

// TestLiveJoinReplaysEarlierBatches: batches a worker published before the gateway subscribed
// are only in its replay ring (a PUB sends to no one); the subscriber asks for them as soon as
// its SUB is connected, without waiting for another live batch. A batch published
// right after the join replay but dropped by the PUB (slow joiner) is found by the second look
// after JoinSettle, again without a further live batch.
func TestLiveJoinReplaysEarlierBatches(t *testing.T) {
	for _, f := range []ReplayFormat{ReplayWithTopic, ReplayNoTopic} {
		t.Run(map[ReplayFormat]string{ReplayWithTopic: "v0.26 replay", ReplayNoTopic: "old replay"}[f], func(t *testing.T) {
			rig := newLiveRig(t)
			tg := kvkey.Target{Worker: "http://early", DPRank: 0}
			sc := newScenario(t, 11, 30, LayoutMap)
			p := newTestPub(t, rig.m.zctx, "kv-events", DefaultReplayBufferSteps, f)
			for _, pl := range sc.payloads[:25] {
				p.publish(pl, false) // nobody subscribed yet: only the ring keeps them
			}
			cfg := SubscriberConfig{Target: tg, Endpoint: p.pubEP, ReplayEndpoint: p.repEP, Topic: p.topic,
				ReplayTimeout: time.Second, JoinSettle: time.Second}
			if err := rig.m.Start(rig.ctx, cfg); err != nil {
				t.Fatal(err)
			}
			rig.m.mu.Lock()
			s := rig.m.subs[tg].sub
			rig.m.mu.Unlock()
			waitSeq(t, s, 24)
			if !reflect.DeepEqual(dumpTarget(rig.ix, tg), sc.groundTruth(t, tg, 0, 25)) {
				t.Fatal("index after the join replay differs from the published state")
			}
			if !rig.m.EventsHealthy(tg) {
				t.Fatal("joined subscription not healthy")
			}
			// Slow joiner: the PUB drops the next batch; no live batch follows it.
			p.publish(sc.payloads[25], true)
			waitSeq(t, s, 25)
			if !reflect.DeepEqual(dumpTarget(rig.ix, tg), sc.groundTruth(t, tg, 0, 26)) {
				t.Fatal("batch lost to the slow joiner not recovered")
			}
			// Then the live stream continues with no duplicate and no reset.
			for _, pl := range sc.payloads[26:] {
				p.publish(pl, false)
			}
			waitSeq(t, s, 29)
			if !reflect.DeepEqual(dumpTarget(rig.ix, tg), sc.groundTruth(t, tg, 0, 30)) {
				t.Fatal("live stream after the join differs from the no-loss state")
			}
			st := &s.stats
			if st.joinReplays.Load() != 1 || st.batches.Load() != 30 || st.resetsGap.Load()+st.resetsRestart.Load() != 0 {
				t.Fatalf("joins %d batches %d resets %d/%d", st.joinReplays.Load(), st.batches.Load(),
					st.resetsGap.Load(), st.resetsRestart.Load())
			}
			// The join shows on GET /debug/workers and /metrics.
			if snap := rig.m.Snapshot(); len(snap) != 1 || snap[0].JoinReplays != 1 || snap[0].State != StateLive {
				t.Fatalf("snapshot %+v", snap)
			}
			reg := prometheus.NewRegistry()
			if err := rig.m.Register(reg); err != nil {
				t.Fatal(err)
			}
			if got := counterValue(t, reg, "kvgate_kv_join_replays_total"); got != 1 {
				t.Fatalf("kvgate_kv_join_replays_total = %v", got)
			}
		})
	}
}

// TestLiveLateDuplicateIsNotARestart: a replay reply and the live copy of the same batch travel
// on different connections, so the live copy can arrive after the replay delivered it. Such a
// copy (above the last live seq, at or below the last applied one) is skipped; a live seq at or
// below the previous live one is checked against the replay ring before anything is reset.
func TestLiveLateDuplicateIsNotARestart(t *testing.T) {
	rig := newLiveRig(t)
	tg := kvkey.Target{Worker: "http://dup", DPRank: 0}
	sc := newScenario(t, 12, 10, LayoutMap)
	p := newTestPub(t, rig.m.zctx, "kv-events", 100, ReplayWithTopic)
	s := rig.follow(t, tg, p, true)
	p.publish(sc.payloads[0], false)
	for i := 1; i < 5; i++ {
		p.publish(sc.payloads[i], true) // only in the ring
	}
	// Batch 5 goes out live (revealing the gap 1..4); 6 and 7 are published before the replay
	// request is served, but their live copies are late.
	p.do(func(pub, _ *zmq.Socket) {
		if _, err := pub.SendMessage(LiveFrames(p.topic, 5, sc.payloads[5])); err != nil {
			t.Error(err)
		}
		for i := 5; i < 8; i++ {
			p.ring.Add(uint64(i), sc.payloads[i])
		}
		p.seq = 8
	})
	waitSeq(t, s, 7)
	p.raw([]byte(p.topic), SeqFrame(6), sc.payloads[6])
	p.raw([]byte(p.topic), SeqFrame(7), sc.payloads[7])
	for i := 8; i < 10; i++ {
		p.publish(sc.payloads[i], false)
	}
	waitSeq(t, s, 9)
	// Three duplicates: batch 5 (live, then in the replay it triggered) and the late 6 and 7.
	if st := &s.stats; st.lateDuplicates.Load() != 3 || st.resetsRestart.Load() != 0 || st.batches.Load() != 10 {
		t.Fatalf("duplicates %d restarts %d batches %d", st.lateDuplicates.Load(), st.resetsRestart.Load(), st.batches.Load())
	}
	if !reflect.DeepEqual(dumpTarget(rig.ix, tg), sc.groundTruth(t, tg, 0, 10)) {
		t.Fatalf("late duplicates changed the index (%d blocks, want %d)", len(dumpTarget(rig.ix, tg)), len(sc.groundTruth(t, tg, 0, 10)))
	}
	// At or below the last live seq: checked against the ring, which still holds batch 9 with
	// the same bytes, so it is a stale copy and not an engine restart.
	p.raw([]byte(p.topic), SeqFrame(8), sc.payloads[8])
	waitFor(t, "stale copy", func() bool { return s.stats.stale.Load() == 1 })
	if s.stats.resetsRestart.Load() != 0 || !reflect.DeepEqual(dumpTarget(rig.ix, tg), sc.groundTruth(t, tg, 0, 10)) {
		t.Fatal("one step back of the same engine reset the target")
	}
}

// counterValue returns the single sample of a counter family.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s: not exactly one sample", name)
	return 0
}
