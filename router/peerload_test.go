package router

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// peerMsg is one load message as the cluster's receiver hands it to PeerLoads.
type peerMsg struct {
	peer    string
	epoch   uint64
	seq     uint64
	snap    bool
	entries []TargetLoadVector
	at      time.Duration // since the test's start
}

func lv(requests, prefillTokens int64) LoadVector {
	return LoadVector{Requests: requests, PrefillRequests: requests, PrefillTokens: prefillTokens}
}

func TestPeerLoadsStateMachine(t *testing.T) {
	w0 := kvkey.Target{Worker: "http://w0"}
	w1 := kvkey.Target{Worker: "http://w1"}
	e := func(t kvkey.Target, v LoadVector) TargetLoadVector { return TargetLoadVector{Target: t, Load: v} }
	tests := []struct {
		name       string
		msgs       []peerMsg
		expireAt   time.Duration // 0: no Expire call
		want       map[kvkey.Target]LoadVector
		wantPeers  int
		wantApprox map[string]bool
		wantGaps   uint64
	}{
		{
			name: "deltas add up",
			msgs: []peerMsg{
				{peer: "a", epoch: 1, seq: 1, snap: true},
				{peer: "a", epoch: 1, seq: 2, entries: []TargetLoadVector{e(w0, lv(1, 100))}},
				{peer: "a", epoch: 1, seq: 3, entries: []TargetLoadVector{e(w0, lv(1, 50)), e(w1, lv(2, 10))}},
			},
			want:       map[kvkey.Target]LoadVector{w0: lv(2, 150), w1: lv(2, 10)},
			wantPeers:  1,
			wantApprox: map[string]bool{"a": false},
		},
		{
			name: "peers sum",
			msgs: []peerMsg{
				{peer: "a", epoch: 1, seq: 1, snap: true, entries: []TargetLoadVector{e(w0, lv(1, 100))}},
				{peer: "b", epoch: 7, seq: 40, snap: true, entries: []TargetLoadVector{e(w0, lv(3, 30))}},
			},
			want:      map[kvkey.Target]LoadVector{w0: lv(4, 130)},
			wantPeers: 2,
		},
		{
			name: "snapshot replaces",
			msgs: []peerMsg{
				{peer: "a", epoch: 1, seq: 1, snap: true, entries: []TargetLoadVector{e(w0, lv(5, 500)), e(w1, lv(1, 1))}},
				{peer: "a", epoch: 1, seq: 2, entries: []TargetLoadVector{e(w0, lv(1, 1))}},
				{peer: "a", epoch: 1, seq: 3, snap: true, entries: []TargetLoadVector{e(w0, lv(2, 20))}},
			},
			want:       map[kvkey.Target]LoadVector{w0: lv(2, 20), w1: {}},
			wantPeers:  1,
			wantApprox: map[string]bool{"a": false},
		},
		{
			name: "gap marks approximate until the next snapshot",
			msgs: []peerMsg{
				{peer: "a", epoch: 1, seq: 1, snap: true},
				{peer: "a", epoch: 1, seq: 2, entries: []TargetLoadVector{e(w0, lv(1, 100))}},
				{peer: "a", epoch: 1, seq: 4, entries: []TargetLoadVector{e(w0, lv(1, 100))}},
			},
			want:       map[kvkey.Target]LoadVector{w0: lv(2, 200)},
			wantPeers:  1,
			wantApprox: map[string]bool{"a": true},
			wantGaps:   1,
		},
		{
			name: "snapshot after a gap clears approximate",
			msgs: []peerMsg{
				{peer: "a", epoch: 1, seq: 1, snap: true},
				{peer: "a", epoch: 1, seq: 3, entries: []TargetLoadVector{e(w0, lv(1, 100))}},
				{peer: "a", epoch: 1, seq: 4, snap: true, entries: []TargetLoadVector{e(w0, lv(2, 100))}},
			},
			want:       map[kvkey.Target]LoadVector{w0: lv(2, 100)},
			wantApprox: map[string]bool{"a": false},
			wantPeers:  1,
			wantGaps:   1,
		},
		{
			name: "phantom load from a dropped done is gone at the next snapshot",
			msgs: []peerMsg{
				{peer: "a", epoch: 1, seq: 1, snap: true},
				{peer: "a", epoch: 1, seq: 2, entries: []TargetLoadVector{e(w0, lv(1, 100))}}, // begin
				// seq 3, the done (-1, -100), is lost
				{peer: "a", epoch: 1, seq: 4, snap: true}, // the peer has nothing in flight
			},
			want:       map[kvkey.Target]LoadVector{w0: {}},
			wantPeers:  1,
			wantApprox: map[string]bool{"a": false},
			wantGaps:   1,
		},
		{
			name: "stale and duplicate messages are ignored",
			msgs: []peerMsg{
				{peer: "a", epoch: 1, seq: 5, snap: true},
				{peer: "a", epoch: 1, seq: 6, entries: []TargetLoadVector{e(w0, lv(1, 100))}},
				{peer: "a", epoch: 1, seq: 6, entries: []TargetLoadVector{e(w0, lv(1, 100))}},
				{peer: "a", epoch: 1, seq: 3, snap: true, entries: []TargetLoadVector{e(w0, lv(9, 900))}},
			},
			want:      map[kvkey.Target]LoadVector{w0: lv(1, 100)},
			wantPeers: 1,
		},
		{
			name: "new epoch resets the peer",
			msgs: []peerMsg{
				{peer: "a", epoch: 1, seq: 100, snap: true, entries: []TargetLoadVector{e(w0, lv(4, 400))}},
				{peer: "a", epoch: 2, seq: 1, snap: true, entries: []TargetLoadVector{e(w1, lv(1, 10))}},
			},
			want:       map[kvkey.Target]LoadVector{w0: {}, w1: lv(1, 10)},
			wantPeers:  1,
			wantApprox: map[string]bool{"a": false},
		},
		{
			name: "new epoch first heard from a delta is approximate",
			msgs: []peerMsg{
				{peer: "a", epoch: 1, seq: 1, snap: true, entries: []TargetLoadVector{e(w0, lv(4, 400))}},
				{peer: "a", epoch: 2, seq: 1, entries: []TargetLoadVector{e(w0, lv(1, 10))}},
			},
			want:       map[kvkey.Target]LoadVector{w0: lv(1, 10)},
			wantPeers:  1,
			wantApprox: map[string]bool{"a": true},
		},
		{
			name: "a negative sum (deltas without their baseline) reads as zero",
			msgs: []peerMsg{
				{peer: "a", epoch: 1, seq: 1, entries: []TargetLoadVector{e(w0, lv(-1, -100))}},
			},
			want:       map[kvkey.Target]LoadVector{w0: {}},
			wantPeers:  1,
			wantApprox: map[string]bool{"a": true},
		},
		{
			name: "a silent peer expires after the timeout, a live one stays",
			msgs: []peerMsg{
				{peer: "a", epoch: 1, seq: 1, snap: true, entries: []TargetLoadVector{e(w0, lv(4, 400))}},
				{peer: "b", epoch: 1, seq: 1, snap: true, entries: []TargetLoadVector{e(w0, lv(1, 10))}},
				{peer: "b", epoch: 1, seq: 2, snap: true, entries: []TargetLoadVector{e(w0, lv(1, 10))}, at: 2 * time.Second},
			},
			expireAt:  3500 * time.Millisecond, // a: 3.5 s silent (> 3 s); b: 1.5 s
			want:      map[kvkey.Target]LoadVector{w0: lv(1, 10)},
			wantPeers: 1,
		},
		{
			name: "a peer not yet past the timeout stays",
			msgs: []peerMsg{
				{peer: "a", epoch: 1, seq: 1, snap: true, entries: []TargetLoadVector{e(w0, lv(4, 400))}},
			},
			expireAt:  2900 * time.Millisecond,
			want:      map[kvkey.Target]LoadVector{w0: lv(4, 400)},
			wantPeers: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pl := NewPeerLoads(3 * time.Second)
			t0 := time.Unix(1000, 0)
			for _, m := range tc.msgs {
				if m.snap {
					pl.ApplySnapshot(m.peer, m.epoch, m.seq, m.entries, t0.Add(m.at))
				} else {
					pl.ApplyDelta(m.peer, m.epoch, m.seq, m.entries, t0.Add(m.at))
				}
			}
			if tc.expireAt > 0 {
				pl.Expire(t0.Add(tc.expireAt))
			}
			for tg, want := range tc.want {
				if got := pl.Sum(tg); got != want {
					t.Errorf("Sum(%s) = %+v, want %+v", tg, got, want)
				}
			}
			if got := pl.Len(); got != tc.wantPeers {
				t.Errorf("peers %d, want %d", got, tc.wantPeers)
			}
			approx := map[string]bool{}
			for _, v := range pl.Peers(t0) {
				approx[v.Replica] = v.Approximate
			}
			for id, want := range tc.wantApprox {
				if approx[id] != want {
					t.Errorf("peer %s approximate %v, want %v", id, approx[id], want)
				}
			}
			if got := pl.Stats().Gaps; got != tc.wantGaps {
				t.Errorf("gaps %d, want %d", got, tc.wantGaps)
			}
		})
	}
}

// TestPeerLoadsShare checks the debug view's per-peer split and that it agrees with Sum.
func TestPeerLoadsShare(t *testing.T) {
	w0 := kvkey.Target{Worker: "http://w0"}
	pl := NewPeerLoads(time.Second)
	now := time.Now()
	pl.ApplySnapshot("a", 1, 1, []TargetLoadVector{{w0, lv(1, 10)}}, now)
	pl.ApplySnapshot("b", 1, 1, []TargetLoadVector{{w0, lv(2, 20)}}, now)
	sh := pl.Share(w0)
	if sh.Total != lv(3, 30) || len(sh.ByPeer) != 2 || sh.ByPeer["a"] != lv(1, 10) || sh.ByPeer["b"] != lv(2, 20) {
		t.Fatalf("share %+v", sh)
	}
	pl.Forget("a")
	if got := pl.Sum(w0); got != lv(2, 20) {
		t.Fatalf("after Forget(a): %+v", got)
	}
}

// TestPeerLoadsSumWhole reads Sum while one writer applies messages that keep every field a
// fixed multiple of the request count: a read must never see part of one message applied.
func TestPeerLoadsSumWhole(t *testing.T) {
	w0 := kvkey.Target{Worker: "http://w0"}
	pl := NewPeerLoads(time.Minute)
	pl.ApplySnapshot("a", 1, 1, nil, time.Now())
	step := LoadVector{Requests: 1, PrefillRequests: 1, PrefillTokens: 100, Blocks: 7,
		AheadTokens: 100, AheadPairs: 3, Decodes: 1, DecodeKV: 50}
	scaled := func(n int64) LoadVector {
		return LoadVector{n * step.Requests, n * step.PrefillRequests, n * step.PrefillTokens, n * step.Blocks,
			n * step.AheadTokens, n * step.AheadPairs, n * step.Decodes, n * step.DecodeKV}
	}
	done := make(chan struct{})
	defer func() { <-done }() // the writer ends before the test does, failed or not
	go func() {
		defer close(done)
		for i := range 20000 {
			d := step
			if i%3 == 2 {
				d = step.Neg() // down as well as up
			}
			pl.ApplyDelta("a", 1, uint64(i+2), []TargetLoadVector{{w0, d}}, time.Now())
		}
	}()
	for reads := 0; ; reads++ {
		select {
		case <-done:
			if reads == 0 {
				t.Fatal("no read overlapped the writer")
			}
			return
		default:
		}
		if got := pl.Sum(w0); got != scaled(got.Requests) {
			t.Fatalf("read %d saw a message half applied: %+v", reads, got)
		}
	}
}

// TestPeerLoadsBounds checks the peer bound: a message from one peer too many is refused.
func TestPeerLoadsBounds(t *testing.T) {
	w0 := kvkey.Target{Worker: "http://w0"}
	pl := NewPeerLoads(time.Second)
	now := time.Now()
	for i := range MaxPeers + 3 {
		pl.ApplySnapshot(string(rune('A'+i%26))+string(rune('a'+i/26)), 1, 1, []TargetLoadVector{{w0, lv(1, 1)}}, now)
	}
	if pl.Len() != MaxPeers || pl.Sum(w0).Requests != MaxPeers || pl.Stats().Refused != 3 {
		t.Fatalf("peers %d sum %+v stats %+v", pl.Len(), pl.Sum(w0), pl.Stats())
	}
}

// recordingPublisher sums the deltas it hears, per target.
type recordingPublisher struct {
	mu  sync.Mutex
	sum map[kvkey.Target]LoadVector
	n   int
}

func (r *recordingPublisher) LoadDelta(t kvkey.Target, d LoadVector) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sum == nil {
		r.sum = map[kvkey.Target]LoadVector{}
	}
	v := r.sum[t]
	v.Add(d)
	r.sum[t] = v
	r.n++
}

func (r *recordingPublisher) get(t kvkey.Target) LoadVector {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sum[t]
}

// TestLoadTrackerPublishes checks that the deltas a tracker publishes always add up to its own
// counters, through begin, first token and done in either order, shared blocks included.
func TestLoadTrackerPublishes(t *testing.T) {
	w0 := kvkey.Target{Worker: "http://w0"}
	lt := NewLoadTracker(time.Minute)
	pub := &recordingPublisher{}
	lt.SetPublisher(pub)
	check := func(step string) {
		t.Helper()
		l := lt.Load(w0)
		want := LoadVector{Requests: int64(l.Requests), PrefillRequests: int64(l.PrefillRequests),
			PrefillTokens: int64(l.PrefillTokens), Blocks: int64(l.ActiveBlocks)}
		if got := pub.get(w0); got != want {
			t.Fatalf("%s: published sum %+v, tracker %+v", step, got, want)
		}
	}
	a := lt.Begin(w0, &Request{PromptTokens: 64, BlockHashes: []kvkey.BlockHash{1, 2, 3, 4}}, 0)
	check("begin a")
	b := lt.Begin(w0, &Request{PromptTokens: 48, BlockHashes: []kvkey.BlockHash{1, 2, 9}}, 2)
	check("begin b (two shared blocks)")
	a.FirstToken()
	check("a first token")
	b.Done()
	check("b done before its first token")
	a.Done()
	a.Done()
	check("a done twice")
	if v := pub.get(w0); !v.IsZero() {
		t.Fatalf("nothing in flight, published sum %+v", v)
	}
}

// TestScoringAddsPeerLoad checks, for each load-aware policy, that the peers' load on a target
// steers requests away from it: w0 carries the peers' load and w1 a little of the own, so
// without the fleet w0 wins (or ties) and with it every pick is w1.
func TestScoringAddsPeerLoad(t *testing.T) {
	w0, w1 := tgt(0), tgt(1)
	peerBusy := LoadVector{Requests: 6, PrefillRequests: 6, PrefillTokens: 6 * 4096, Blocks: 6 * 256,
		AheadTokens: 6 * 4096, AheadPairs: 6 * 4096 * 2048, Decodes: 6, DecodeKV: 6 * 4096}
	for _, policy := range []string{PolicyKV, PolicyKVBlocks, "least_loaded"} {
		t.Run(policy, func(t *testing.T) {
			picks := func(withFleet bool) (onW0 int) {
				e, err := Build(policy, Options{Seed: 1}, DispatcherOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if withFleet {
					pl := NewPeerLoads(time.Minute)
					pl.ApplySnapshot("peer", 1, 1, []TargetLoadVector{{w0, peerBusy}}, time.Now())
					e.SetFleet(Fleet{Peers: pl})
				}
				// One small request of our own in flight on w1.
				h := e.begin(Decision{Chosen: Choice{Target: w1}}, request(chain(99, 2)))
				defer h.Done()
				cands := []Candidate{{Target: w0}, {Target: w1, InFlight: 1}}
				for i := range 20 {
					d, err := e.Pick(context.Background(), request(chain(uint64(i+1), 16)), cands)
					if err != nil {
						t.Fatal(err)
					}
					if d.Chosen.Target == w0 {
						onW0++
					}
				}
				return onW0
			}
			if n := picks(false); n == 0 {
				t.Fatalf("control: without the fleet w0 was never picked (the test would prove nothing)")
			}
			if n := picks(true); n != 0 {
				t.Fatalf("with the peers' load on w0, %d of 20 picks still went there", n)
			}
		})
	}
}

// TestKVPublishesTimeModel checks that under kv the published deltas add up to the time
// model's queue and decode accounting as well as the tracker's, through a routed attempt's
// lifecycle, and that a failed attempt before its first token releases everything.
func TestKVPublishesTimeModel(t *testing.T) {
	e, err := Build(PolicyKV, Options{}, DispatcherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pub := &recordingPublisher{}
	e.SetFleet(Fleet{Load: pub})
	w := tgt(0)
	check := func(step string) {
		t.Helper()
		st, _ := e.kv.timed.state(w)
		l := e.load.Load(w)
		want := LoadVector{Requests: int64(l.Requests), PrefillRequests: int64(l.PrefillRequests),
			PrefillTokens: int64(l.PrefillTokens), Blocks: int64(l.ActiveBlocks),
			AheadTokens: int64(st.AheadTokens), AheadPairs: int64(st.AheadPairs),
			Decodes: int64(st.DecodeRequests), DecodeKV: int64(st.DecodeKVTokens)}
		if got := pub.get(w); got != want {
			t.Fatalf("%s: published %+v, own accounting %+v", step, got, want)
		}
	}
	cands := []Candidate{{Target: w}}
	_, a, err := e.Route(context.Background(), request(chain(1, 8)), cands)
	if err != nil {
		t.Fatal(err)
	}
	a.Sent()
	check("a routed")
	_, b, err := e.Route(context.Background(), request(chain(2, 4)), cands)
	if err != nil {
		t.Fatal(err)
	}
	b.Sent()
	a.FirstToken()
	check("a decoding, b queued")
	if v := pub.get(w); v.Decodes != 1 || v.AheadTokens == 0 {
		t.Fatalf("expected one decode and b's queue, got %+v", v)
	}
	b.Failed(nil)
	a.Done()
	check("both ended")
	if v := pub.get(w); !v.IsZero() {
		t.Fatalf("nothing in flight, published sum %+v", v)
	}
}
