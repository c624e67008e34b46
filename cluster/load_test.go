package cluster

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/cluster/clusterconfig"
	"github.com/kvgate/kvgate/confval"
	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
)

func TestLoadWireRoundTrip(t *testing.T) {
	w0 := kvkey.Target{Worker: "http://127.0.0.1:8000", DPRank: 3}
	w1 := kvkey.Target{Worker: "http://127.0.0.1:8001"}
	load := []router.TargetLoadVector{
		{Target: w0, Load: router.LoadVector{Requests: 2, PrefillRequests: 1, PrefillTokens: 4096, Blocks: 300,
			AheadTokens: 4096, AheadPairs: 1 << 40, Decodes: 1, DecodeKV: 8192}},
		{Target: w1, Load: router.LoadVector{Requests: -1, PrefillTokens: -77, Blocks: -5}},
	}
	tests := []struct {
		name string
		b    []byte
		want wireMsg
	}{
		{"delta", encodeLoad(kindDelta, "r1", 0xdeadbeefcafe, 42, load),
			wireMsg{kind: kindDelta, replica: "r1", epoch: 0xdeadbeefcafe, seq: 42, load: load}},
		{"snapshot", encodeLoad(kindSnapshot, "r-2", 7, 1, load[:1]),
			wireMsg{kind: kindSnapshot, replica: "r-2", epoch: 7, seq: 1, load: load[:1]}},
		{"empty snapshot", encodeLoad(kindSnapshot, "r", 7, 9, nil), wireMsg{kind: kindSnapshot, replica: "r", epoch: 7, seq: 9}},
		{"leave", encodeLoad(kindLeave, "r", 7, 10, nil), wireMsg{kind: kindLeave, replica: "r", epoch: 7, seq: 10}},
		{"approx", encodeApprox("r", 7, 3, []approxEntry{{w0, []kvkey.BlockHash{1, 2, 1 << 63}}, {w1, []kvkey.BlockHash{9}}}),
			wireMsg{kind: kindApprox, replica: "r", epoch: 7, seq: 3,
				approx: []approxEntry{{w0, []kvkey.BlockHash{1, 2, 1 << 63}}, {w1, []kvkey.BlockHash{9}}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeMsg(tc.b)
			if err != nil {
				t.Fatal(err)
			}
			if got.kind != tc.want.kind || got.replica != tc.want.replica || got.epoch != tc.want.epoch || got.seq != tc.want.seq ||
				len(got.load) != len(tc.want.load) || len(got.approx) != len(tc.want.approx) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i := range got.load {
				if got.load[i] != tc.want.load[i] {
					t.Fatalf("entry %d: %+v, want %+v", i, got.load[i], tc.want.load[i])
				}
			}
			for i := range got.approx {
				g, w := got.approx[i], tc.want.approx[i]
				if g.target != w.target || len(g.hashes) != len(w.hashes) {
					t.Fatalf("approx %d: %+v, want %+v", i, g, w)
				}
				for j := range g.hashes {
					if g.hashes[j] != w.hashes[j] {
						t.Fatalf("approx %d hash %d: %x, want %x", i, j, g.hashes[j], w.hashes[j])
					}
				}
			}
		})
	}
}

func TestLoadWireRejects(t *testing.T) {
	good := encodeLoad(kindDelta, "r1", 1, 1, []router.TargetLoadVector{{Target: kvkey.Target{Worker: "http://w"}, Load: router.LoadVector{Requests: 1}}})
	long := appendHeader(nil, kindSnapshot, "r", 1, 1, maxWireEntries+1)
	manyHashes := appendHeader(nil, kindApprox, "r", 1, 1, 1)
	manyHashes = appendTarget(manyHashes, kvkey.Target{Worker: "w"})
	manyHashes = append(manyHashes, 0xff, 0xff, 0xff, 0x0f) // a huge uvarint hash count
	tests := []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"version", append([]byte{9}, good[1:]...), "version 9"},
		{"kind", append([]byte{wireVersion, 77}, good[2:]...), "unknown kind"},
		{"truncated", good[:len(good)-3], "truncated"},
		{"trailing", append(append([]byte{}, good...), 0), "trailing"},
		{"too many entries", long, "over the limit"},
		{"too many hashes", manyHashes, "over the limit"},
		{"no replica", encodeLoad(kindDelta, "", 1, 1, nil), "empty replica"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeMsg(tc.b)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// lossyPublisher drops the messages whose index (0-based, in publish order) is in drop.
type lossyPublisher struct {
	next publisher
	mu   sync.Mutex
	n    int
	drop func(i int, data []byte) bool
}

func (p *lossyPublisher) PublishMsg(m *nats.Msg) error {
	p.mu.Lock()
	i := p.n
	p.n++
	p.mu.Unlock()
	if p.drop != nil && p.drop(i, m.Data) {
		return nil
	}
	return p.next.PublishMsg(m)
}

// loadCluster is one embedded NATS server and client replicas on it, each with a load sync.
type loadCluster struct {
	t      *testing.T
	server *Node
}

func newLoadCluster(t *testing.T) *loadCluster {
	return &loadCluster{t: t, server: startNode(t, embeddedConfig(t, "nats"))}
}

// replica starts a client node named id and its load sync (wrapped by wrap when non-nil).
func (c *loadCluster) replica(id string, approx *indexers.ApproxIndex, wrap func(publisher) publisher) (*Node, *LoadSync) {
	return c.replicaEvery(id, approx, wrap, 100*time.Millisecond, 400*time.Millisecond)
}

// replicaWith is replica with the given load sync options.
func (c *loadCluster) replicaWith(id string, o LoadSyncOptions) (*Node, *LoadSync) {
	return c.start(id, o, nil, 100*time.Millisecond, 400*time.Millisecond)
}

// replicaEvery is replica with the given load_interval and peer_timeout.
func (c *loadCluster) replicaEvery(id string, approx *indexers.ApproxIndex, wrap func(publisher) publisher, interval, timeout time.Duration) (*Node, *LoadSync) {
	return c.start(id, LoadSyncOptions{Approx: approx}, wrap, interval, timeout)
}

func (c *loadCluster) start(id string, o LoadSyncOptions, wrap func(publisher) publisher, interval, timeout time.Duration) (*Node, *LoadSync) {
	c.t.Helper()
	n := startNode(c.t, clientConfig(c.server, id, interval, timeout))
	eventually(c.t, 5*time.Second, id+" connected", n.Connected)
	var pub publisher = n.Conn()
	if wrap != nil {
		pub = wrap(pub)
	}
	o.Registerer = prometheus.NewRegistry()
	ls, err := startLoadSync(context.Background(), n, pub, o)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(ls.Close)
	return n, ls
}

// TestLoadSyncTwoReplicas: a request in flight through A is in B's view of the peers within
// milliseconds (deltas, not the snapshot), leaves it when it ends, and never shows in A's own
// peer view; A killed (no leave message) is gone from B within peer_timeout.
func TestLoadSyncTwoReplicas(t *testing.T) {
	c := newLoadCluster(t)
	// Snapshots every 500ms: what b sees within 200ms came by the delta path.
	nodeA, a := c.replicaEvery("a", nil, nil, 500*time.Millisecond, time.Second)
	_, b := c.replicaEvery("b", nil, nil, 500*time.Millisecond, time.Second)
	w0 := kvkey.Target{Worker: "http://w0"}
	eventually(t, 2*time.Second, "b hears a's snapshots", func() bool { return b.Peers().Len() == 1 })

	lt := router.NewLoadTracker(time.Minute)
	lt.SetPublisher(a)
	begun := time.Now()
	h := lt.Begin(w0, &router.Request{PromptTokens: 64, BlockSize: 16, BlockHashes: []kvkey.BlockHash{1, 2, 3, 4}}, 0)
	for b.Peers().Sum(w0).Requests != 1 && time.Since(begun) < time.Second {
		time.Sleep(100 * time.Microsecond)
	}
	seen := time.Since(begun)
	t.Logf("a's Begin seen by b after %s", seen)
	if seen > 200*time.Millisecond {
		t.Errorf("b saw a's request after %s: later than the delta path allows (2ms batches; snapshots every 500ms)", seen)
	}
	if got := b.Peers().Sum(w0); got != (router.LoadVector{Requests: 1, PrefillRequests: 1, PrefillTokens: 64, Blocks: 4}) {
		t.Fatalf("b's view of a: %+v", got)
	}
	if got := a.Peers().Sum(w0); !got.IsZero() {
		t.Fatalf("a counts its own load as a peer's: %+v", got)
	}
	h.FirstToken()
	h.Done()
	eventually(t, time.Second, "a's request ends in b's view", func() bool { return b.Peers().Sum(w0).IsZero() })

	h = lt.Begin(w0, &router.Request{PromptTokens: 64, BlockSize: 16}, 0)
	defer h.Done()
	eventually(t, time.Second, "b sees a's second request", func() bool { return b.Peers().Sum(w0).Requests == 1 })
	nodeA.Close() // killed: its connection gone, no leave message
	killed := time.Now()
	eventually(t, 3*time.Second, "a's load expires from b", func() bool { return b.Peers().Len() == 0 && b.Peers().Sum(w0).IsZero() })
	// Expiry runs every peer_timeout/4; the rest is slack for a loaded machine.
	if d := time.Since(killed); d > time.Second+250*time.Millisecond+250*time.Millisecond {
		t.Errorf("a's load expired %s after it was killed, peer_timeout 1s", d)
	} else {
		t.Logf("a's load expired from b %s after it was killed (peer_timeout 1s)", d.Round(time.Millisecond))
	}
}

// TestLoadSyncLostDone: a lost delta (the one that ended a request) leaves phantom load on
// the peer only until the next snapshot, which also clears the gap's approximate flag.
func TestLoadSyncLostDone(t *testing.T) {
	c := newLoadCluster(t)
	var dropNext sync.Mutex
	dropping := false
	_, a := c.replicaEvery("a", nil, func(p publisher) publisher {
		return &lossyPublisher{next: p, drop: func(_ int, data []byte) bool {
			dropNext.Lock()
			defer dropNext.Unlock()
			if dropping && len(data) > 1 && data[1] == kindDelta {
				dropping = false
				return true
			}
			return false
		}}
	}, 300*time.Millisecond, time.Second)
	_, b := c.replica("b", nil, nil)
	w0 := kvkey.Target{Worker: "http://w0"}
	lt := router.NewLoadTracker(time.Minute)
	lt.SetPublisher(a)
	h := lt.Begin(w0, &router.Request{PromptTokens: 64, BlockSize: 16}, 0)
	eventually(t, time.Second, "b sees a's request", func() bool { return b.Peers().Sum(w0).Requests == 1 })
	dropNext.Lock()
	dropping = true
	dropNext.Unlock()
	snaps := b.Peers().Stats().Snapshots
	h.Done() // its delta is lost
	time.Sleep(20 * time.Millisecond)
	if b.Peers().Sum(w0).Requests != 1 && b.Peers().Stats().Snapshots == snaps {
		t.Fatalf("the lost done was not lost: b's view %+v before any new snapshot", b.Peers().Sum(w0))
	}
	eventually(t, 400*time.Millisecond, "the phantom load is gone at the next snapshot", func() bool { return b.Peers().Sum(w0).IsZero() })
	// A later delta shows the gap; the next snapshot clears the flag.
	h = lt.Begin(w0, &router.Request{PromptTokens: 16, BlockSize: 16}, 0)
	h.Done()
	eventually(t, 500*time.Millisecond, "b's view of a is exact again", func() bool {
		ps := b.Peers().Peers(time.Now())
		return len(ps) == 1 && !ps[0].Approximate && b.Peers().Stats().Gaps >= 1
	})
}

// TestLoadSyncApprox: a prompt A routes to a target in approximate mode is predicted by B's
// approximate index too.
func TestLoadSyncApprox(t *testing.T) {
	c := newLoadCluster(t)
	_, a := c.replica("a", nil, nil)
	bIndex := indexers.NewApproxIndex(time.Minute, 1000)
	w0 := kvkey.Target{Worker: "http://w0"}
	_, _ = c.replicaWith("b", LoadSyncOptions{Approx: bIndex, KnownTarget: func(t kvkey.Target) bool { return t == w0 }})
	a.RoutedApprox(kvkey.Target{Worker: "http://not-in-b-fleet"}, []kvkey.BlockHash{1, 2})
	a.RoutedApprox(w0, []kvkey.BlockHash{11, 12, 13})
	eventually(t, time.Second, "b's approximate index holds a's prompt", func() bool { return bIndex.Resident(w0) == 3 })
	if n := bIndex.Resident(kvkey.Target{Worker: "http://not-in-b-fleet"}); n != 0 {
		t.Fatalf("b recorded %d blocks for a target it does not have", n)
	}
	out := make([]indexers.TierMatch, 1)
	bIndex.MatchTiers([]kvkey.BlockHash{11, 12, 13, 14}, []kvkey.Target{w0}, out)
	if out[0].G1 != 3 {
		t.Fatalf("b predicts %d blocks of a's prompt on w0, want 3", out[0].G1)
	}
}

// TestLoadSyncMetrics: messages sent and received are counted, and the peers gauge follows.
func TestLoadSyncMetrics(t *testing.T) {
	c := newLoadCluster(t)
	_, a := c.replica("a", nil, nil)
	_, b := c.replica("b", nil, nil)
	a.LoadDelta(kvkey.Target{Worker: "http://w0"}, router.LoadVector{Requests: 1})
	eventually(t, time.Second, "b hears a", func() bool { return b.Peers().Sum(kvkey.Target{Worker: "http://w0"}).Requests == 1 })
	if n := counter(t, a.m.load.WithLabelValues("sent")); n < 2 {
		t.Fatalf("a sent %v load messages, want a snapshot and a delta at least", n)
	}
	eventually(t, time.Second, "b counts a snapshot and a delta received", func() bool {
		return counter(t, b.m.load.WithLabelValues("received")) >= 2
	})
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// clientConfig is a replica id connecting to server's embedded NATS, with the given
// load_interval and peer_timeout.
func clientConfig(server *Node, id string, interval, timeout time.Duration) clusterconfig.Config {
	cfg := clusterconfig.Default()
	cfg.ReplicaID = id
	cfg.NATSURL = "nats://" + server.Config().EmbeddedNATS.Listen
	cfg.LoadInterval = confval.Duration(interval)
	cfg.PeerTimeout = confval.Duration(timeout)
	return cfg
}

// TestLoadSyncNATSRestart: with the NATS server down, a replica's publishes fail fast and are
// counted, and its peers stop counting its load after peer_timeout (each routes on its own);
// once the server is back on the same address, the reconnect's snapshot rebuilds the view.
func TestLoadSyncNATSRestart(t *testing.T) {
	c := newLoadCluster(t)
	_, a := c.replica("a", nil, nil)
	_, b := c.replica("b", nil, nil)
	w0 := kvkey.Target{Worker: "http://w0"}
	a.LoadDelta(w0, router.LoadVector{Requests: 2, PrefillTokens: 100})
	eventually(t, time.Second, "b sees a's load", func() bool { return b.Peers().Sum(w0).Requests == 2 })

	cfg := c.server.Config()
	c.server.Close()
	eventually(t, 2*time.Second, "b stops counting a while NATS is down", func() bool { return b.Peers().Len() == 0 })
	a.LoadDelta(w0, router.LoadVector{Requests: 1}) // now 3, published nowhere
	eventually(t, time.Second, "a counts its failed publishes", func() bool {
		return counter(t, a.m.load.WithLabelValues("publish_failed")) > 0
	})

	startNode(t, cfg) // the same listen address and store
	eventually(t, 5*time.Second, "b sees a's load again after the reconnect", func() bool { return b.Peers().Sum(w0).Requests == 3 })
}
