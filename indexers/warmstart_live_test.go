package indexers

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// peerFunc is a WarmStarter backed by a function (the cluster's NATS transport in production).
type peerFunc func(ctx context.Context, t kvkey.Target) ([]byte, string, error)

func (f peerFunc) FetchSnapshot(ctx context.Context, t kvkey.Target) ([]byte, string, error) {
	return f(ctx, t)
}

// A replica that starts after the worker's replay ring stopped reaching back to batch 0 gets
// the exact state from a warm peer's snapshot, confirmed against the ring, and follows the
// stream from there: its index equals the one of a replica that saw every batch. Without a
// peer (or with a snapshot the ring does not confirm) it starts from the ring alone, which no
// longer holds the early batches.
func TestLiveWarmStart(t *testing.T) {
	const ring, before, during, after = 20, 80, 10, 20
	tg := kvkey.Target{Worker: "http://w1", DPRank: 0}
	tests := []struct {
		name     string
		peer     func(a *liveRig) WarmStarter
		want     string // warm_start result
		state    string
		equal    bool   // the index equals the no-loss state
		mode     string // "": not checked (a cold target may leave approximate mode on an AllBlocksCleared)
		verified bool
	}{
		{name: "from a warm peer", want: WarmInstalled, state: "warm", equal: true, mode: ModeExact, verified: true,
			peer: func(a *liveRig) WarmStarter {
				return peerFunc(func(ctx context.Context, t kvkey.Target) ([]byte, string, error) {
					time.Sleep(100 * time.Millisecond) // batches published meanwhile wait in the SUB's queue
					data, err := a.m.EncodeSnapshot(t)
					return data, "peer-a", err
				})
			}},
		{name: "no peer", want: WarmNoPeer, state: "cold",
			peer: func(*liveRig) WarmStarter {
				return peerFunc(func(context.Context, kvkey.Target) ([]byte, string, error) {
					return nil, "", ErrNoSnapshot
				})
			}},
		{name: "a peer too slow", want: WarmTimeout, state: "cold",
			peer: func(*liveRig) WarmStarter {
				return peerFunc(func(ctx context.Context, _ kvkey.Target) ([]byte, string, error) {
					<-ctx.Done()
					return nil, "", ctx.Err()
				})
			}},
		{name: "another incarnation's snapshot is rejected", want: WarmRejected, state: "cold",
			peer: func(a *liveRig) WarmStarter {
				return peerFunc(func(ctx context.Context, t kvkey.Target) ([]byte, string, error) {
					seq, _ := a.m.SnapshotOffer(t)
					data, err := a.ix.EncodeSnapshot(t, SnapshotCursor{Seq: seq, Digest: 12345})
					return data, "peer-a", err
				})
			}},
		{name: "a forged snapshot with a stolen cursor is discarded", want: WarmContentRejected, state: "cold",
			peer: func(a *liveRig) WarmStarter {
				return peerFunc(func(ctx context.Context, t kvkey.Target) ([]byte, string, error) {
					// The real cursor (seq and digest, as a downloaded snapshot reveals them)
					// on another stream's content.
					sa := a.sub(t)
					sa.cursor.mu.Lock()
					cur := sa.cursor.cur
					sa.cursor.mu.Unlock()
					forged := NewIndex(Options{BlockSize: modelBS})
					if err := forged.AddTarget(t); err != nil {
						return nil, "", err
					}
					for _, pl := range newScenario(nil, 99, 60, LayoutMap).payloads {
						if b, err := DecodeBatch(pl); err == nil {
							_ = forged.Apply(t, b)
						}
					}
					data, err := forged.EncodeSnapshot(t, cur)
					return data, "evil", err
				})
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sc := newScenario(t, 5, before+during+after, LayoutMap)
			a := newLiveRig(t)
			p := newTestPub(t, a.m.zctx, "kv-events", ring, ReplayWithTopic)
			sa := a.follow(t, tg, p, true)
			for _, payload := range sc.payloads[:before] {
				p.publish(payload, false)
			}
			waitSeq(t, sa, before-1)
			if _, ok := a.m.SnapshotOffer(tg); !ok {
				t.Fatalf("a replica that followed from batch 0 offers no snapshot: %+v", a.debug(t, tg))
			}

			b := newLiveRig(t)
			b.m.SetWarmStarter(tc.peer(a), 500*time.Millisecond)
			cfg := SubscriberConfig{Target: tg, Endpoint: p.pubEP, Topic: p.topic, ReplayTimeout: time.Second,
				ReplayEndpoint: p.repEP}
			if err := b.m.Start(b.ctx, cfg); err != nil {
				t.Fatal(err)
			}
			sb := b.sub(tg)
			time.Sleep(20 * time.Millisecond)
			for _, payload := range sc.payloads[before : before+during] {
				p.publish(payload, false)
			}
			waitFor(t, "the warm start's outcome", func() bool {
				d := b.debug(t, tg).WarmStart
				return d != nil && d.State != "fetching"
			})
			time.Sleep(50 * time.Millisecond)
			for _, payload := range sc.payloads[before+during:] {
				p.publish(payload, false)
			}
			last := len(sc.payloads) - 1
			waitSeq(t, sa, last)
			waitSeq(t, sb, last)
			d := b.debug(t, tg)
			if d.WarmStart != nil {
				t.Logf("warm start: %s (%s) from %q, verified %v %s", d.WarmStart.Result, d.WarmStart.State, d.WarmStart.Peer, d.WarmStart.Verified, d.WarmStart.Error)
			}
			if d.WarmStart == nil || d.WarmStart.Result != tc.want || d.WarmStart.State != tc.state || d.WarmStart.Verified != tc.verified {
				t.Fatalf("warm start %+v, want result %s state %s verified %v", d.WarmStart, tc.want, tc.state, tc.verified)
			}
			if tc.mode != "" && d.IndexMode != tc.mode {
				t.Fatalf("index mode %s (%s), want %s", d.IndexMode, d.IndexModeReason, tc.mode)
			}
			truth := sc.groundTruth(t, tg, 0, len(sc.payloads))
			if !reflect.DeepEqual(dumpTarget(a.ix, tg), truth) {
				t.Fatal("the replica that saw everything differs from the no-loss state")
			}
			got := dumpTarget(b.ix, tg)
			if eq := reflect.DeepEqual(got, truth); eq != tc.equal {
				t.Fatalf("the started replica's index equals the no-loss state: %v, want %v (%d blocks vs %d)", eq, tc.equal, len(got), len(truth))
			}
			if _, ok := b.m.SnapshotOffer(tg); ok != tc.equal {
				t.Fatalf("the started replica offers its state: %v, want %v", ok, tc.equal)
			}
			if tc.equal {
				data, err := b.m.EncodeSnapshot(tg)
				if err != nil {
					t.Fatal(err)
				}
				if cur, _, err := SnapshotInfo(data); err != nil || cur.Seq != uint64(last) {
					t.Fatalf("its snapshot's cursor %+v (%v), want seq %d", cur, err, last)
				}
			} else if _, err := b.m.EncodeSnapshot(tg); !errors.Is(err, ErrNotExact) {
				t.Fatalf("a cold approximate state was offered: %v", err)
			}
		})
	}
}

// A replica whose stream lost more batches than the worker's ring holds (its own loss: the
// peer received them) replaces its state by the peer's snapshot instead of staying approximate.
// The two replicas follow two publishers with the same batches, so that only one of them loses.
func TestLiveWarmStartAfterLossyReset(t *testing.T) {
	const ring = 20
	tg := kvkey.Target{Worker: "http://w1", DPRank: 0}
	for _, withPeer := range []bool{true, false} {
		t.Run(map[bool]string{true: "peer", false: "no peer"}[withPeer], func(t *testing.T) {
			sc := newScenario(t, 9, 90, LayoutMap)
			a := newLiveRig(t)
			pa := newTestPub(t, a.m.zctx, "kv-events", ring, ReplayWithTopic)
			sa := a.follow(t, tg, pa, true)
			b := newLiveRig(t)
			b.m.SetWarmStarter(peerFunc(func(ctx context.Context, t kvkey.Target) ([]byte, string, error) {
				if !withPeer {
					return nil, "", ErrNoSnapshot
				}
				data, err := a.m.EncodeSnapshot(t)
				if errors.Is(err, ErrNotExact) {
					return nil, "", ErrNoSnapshot
				}
				return data, "peer-a", err
			}), time.Second)
			pb := newTestPub(t, b.m.zctx, "kv-events", ring, ReplayWithTopic)
			sb := b.follow(t, tg, pb, true)
			both := func(from, to int, lostOnB bool) {
				for _, payload := range sc.payloads[from:to] {
					pa.publish(payload, false)
					pb.publish(payload, lostOnB)
				}
			}
			both(0, 40, false)
			waitSeq(t, sa, 39)
			waitSeq(t, sb, 39)
			both(40, 70, true) // b's live stream drops 30 batches; its ring keeps only 20
			waitSeq(t, sa, 69)
			both(70, 71, false)
			waitSeq(t, sa, 70)
			waitFor(t, "b's lossy reset and its outcome", func() bool {
				w := b.debug(t, tg).WarmStart
				return sb.stats.resetsGap.Load() > 0 && w != nil && w.State != "fetching"
			})
			both(71, 90, false)
			waitSeq(t, sa, 89)
			waitSeq(t, sb, 89)
			truth := sc.groundTruth(t, tg, 0, 90)
			d := b.debug(t, tg)
			eq := reflect.DeepEqual(dumpTarget(b.ix, tg), truth)
			if withPeer && (!eq || d.IndexMode != ModeExact || d.WarmStart.Result != WarmInstalled || !d.WarmStart.Verified) {
				t.Fatalf("after the lossy reset: equal %v, mode %s (%s), warm start %+v", eq, d.IndexMode, d.IndexModeReason, d.WarmStart)
			}
			if !withPeer && (eq || d.WarmStart.Result != WarmNoPeer) {
				t.Fatalf("without a peer: equal %v, warm start %+v", eq, d.WarmStart)
			}
		})
	}
}
