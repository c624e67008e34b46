package cluster

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/cluster/clusterconfig"
	"github.com/kvgate/kvgate/kvkey"
)

// counterOf reads a counter's value.
func counterOf(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// fakeSource offers fixed snapshots per target.
type fakeSource struct {
	mu    sync.Mutex
	snaps map[kvkey.Target][]byte
	fail  error // EncodeSnapshot's error, if set
}

func (f *fakeSource) SnapshotOffer(t kvkey.Target) (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.snaps[t]
	return 7, ok
}

func (f *fakeSource) EncodeSnapshot(t kvkey.Target) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, f.fail
	}
	d, ok := f.snaps[t]
	if !ok {
		return nil, errors.New("not exact")
	}
	return bytes.Clone(d), nil
}

// twoReplicas starts replica a (embedded server) and b (connected to it), each serving src.
func twoReplicas(t *testing.T, srcA, srcB SnapshotSource) (a, b *Snapshots) {
	t.Helper()
	ca := embeddedConfig(t, "a")
	cb := clusterconfig.Default()
	cb.ReplicaID = "b"
	cb.NATSURL = "nats://" + ca.EmbeddedNATS.Listen
	na := startNode(t, ca)
	nb := startNode(t, cb)
	eventually(t, 5*time.Second, "b connects", nb.Connected)
	var err error
	if a, err = NewSnapshots(na, srcA, prometheus.NewRegistry(), nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	if b, err = NewSnapshots(nb, srcB, prometheus.NewRegistry(), nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	// Let both subscriptions reach the server before the first request.
	if err := na.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	if err := nb.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	return a, b
}

func TestFetchSnapshot(t *testing.T) {
	tg := kvkey.Target{Worker: "http://w1", DPRank: 1}
	other := kvkey.Target{Worker: "http://w2"}
	big := make([]byte, 2*SnapshotChunk+12345) // three chunks
	for i := range big {
		big[i] = byte(i * 7)
	}
	tests := []struct {
		name    string
		srcA    *fakeSource // the peer's
		srcB    *fakeSource // the fetching replica's own
		target  kvkey.Target
		want    []byte
		wantErr error // errors.Is; nil with want nil: any error
		result  string
	}{
		{name: "three chunks from the peer", srcA: &fakeSource{snaps: map[kvkey.Target][]byte{tg: big}},
			srcB: &fakeSource{}, target: tg, want: big, result: fetchOK},
		{name: "no peer holds the target", srcA: &fakeSource{snaps: map[kvkey.Target][]byte{other: big}},
			srcB: &fakeSource{}, target: tg, wantErr: ErrNoPeer, result: fetchNoPeer},
		{name: "its own state is not asked for", srcA: &fakeSource{},
			srcB: &fakeSource{snaps: map[kvkey.Target][]byte{tg: big}}, target: tg, wantErr: ErrNoPeer, result: fetchNoPeer},
		{name: "the peer fails to encode", srcA: &fakeSource{snaps: map[kvkey.Target][]byte{tg: big}, fail: errors.New("boom")},
			srcB: &fakeSource{}, target: tg, result: fetchFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := twoReplicas(t, tc.srcA, tc.srcB)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			start := time.Now()
			got, peer, err := b.FetchSnapshot(ctx, tc.target)
			if tc.want != nil {
				if err != nil || peer != "a" || !bytes.Equal(got, tc.want) {
					t.Fatalf("got %d bytes from %q, err %v; want %d bytes from a", len(got), peer, err, len(tc.want))
				}
				if v := counterOf(t, a.served); v != 1 {
					t.Fatalf("served %v", v)
				}
				if v := counterOf(t, a.servedBytes); v != float64(len(big)) {
					t.Fatalf("served bytes %v", v)
				}
			} else {
				if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
					t.Fatalf("err %v, want %v", err, tc.wantErr)
				}
				if tc.wantErr == ErrNoPeer && time.Since(start) > time.Second {
					t.Fatalf("no peer took %s: the offer window is a fifth of the wait", time.Since(start))
				}
			}
			if v := counterOf(t, b.fetches.WithLabelValues(tc.result)); v != 1 {
				t.Fatalf("fetches{result=%s} = %v", tc.result, v)
			}
		})
	}
}

// With NATS unreachable a fetch fails at once, counted, instead of waiting.
func TestFetchSnapshotDisconnected(t *testing.T) {
	c := clusterconfig.Default()
	c.ReplicaID = "lonely"
	c.NATSURL = "nats://" + hostPort(freePort(t))
	n := startNode(t, c)
	s, err := NewSnapshots(n, &fakeSource{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start := time.Now()
	if _, _, err := s.FetchSnapshot(context.Background(), kvkey.Target{Worker: "w"}); err == nil || errors.Is(err, ErrNoPeer) {
		t.Fatalf("err %v, want a connection error", err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Fatalf("took %s", d)
	}
	if v := counterOf(t, s.fetches.WithLabelValues(fetchFailed)); v != 1 {
		t.Fatalf("failed fetches %v", v)
	}
}
