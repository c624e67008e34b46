package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testport"

	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/cluster/clusterconfig"
	"github.com/kvgate/kvgate/confval"
	"github.com/kvgate/kvgate/kvkey"
)

var (
	wA = kvkey.Target{Worker: "http://a", DPRank: 0}
	wB = kvkey.Target{Worker: "http://b", DPRank: 1}
	wC = kvkey.Target{Worker: "http://c", DPRank: 0}
)

// replicaConfig is a replica connecting to the server srv runs, with the given session TTL.
func replicaConfig(srv clusterconfig.Config, id string, ttl time.Duration) clusterconfig.Config {
	c := clusterconfig.Default()
	c.ReplicaID = id
	c.NATSURL = "nats://" + srv.EmbeddedNATS.Listen
	c.SessionTTL = confval.Duration(ttl)
	c.KVDeadline = confval.Duration(500 * time.Millisecond) // generous: 2 shared cores under -race
	return c
}

// counterValue reads one counter series.
func counterValue(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// startBindings runs a node's bindings until the end of the test and waits until they are ready.
func startBindings(t *testing.T, n *Node, o BindingsOptions) *Bindings {
	t.Helper()
	b, err := NewBindings(n, o)
	if err != nil {
		t.Fatal(err)
	}
	b.race = 50 * time.Millisecond // the tests' deadline is long; keep the race window short
	b.Start(context.Background())
	t.Cleanup(b.Close)
	eventually(t, 5*time.Second, n.ReplicaID()+" bindings ready", b.Ready)
	return b
}

// stored reads a session's binding straight from the bucket.
func stored(t *testing.T, b *Bindings, id string) (bindValue, uint64, error) {
	t.Helper()
	kv := b.kv.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	e, err := kv.sessions.Get(ctx, key("s", id))
	if err != nil {
		return bindValue{}, 0, err
	}
	var v bindValue
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		t.Fatal(err)
	}
	return v, e.Revision(), nil
}

func lookupIs(b *Bindings, id string, want kvkey.Target) func() bool {
	return func() bool {
		got, ok := b.Lookup(id)
		return ok && got.Target == want
	}
}

// Concurrent first turns of the same sessions on three replicas, each routed to a different
// worker: exactly one Create wins per session, the other two follow the winner, and every
// replica ends up with the winner's binding.
func TestBindingsCreateRaceOneWinner(t *testing.T) {
	srv := embeddedConfig(t, "srv")
	startNode(t, srv)
	targets := []kvkey.Target{wA, wB, wC}
	var bs []*Bindings
	for i := range 3 {
		n := startNode(t, replicaConfig(srv, fmt.Sprintf("r%d", i), time.Minute))
		bs = append(bs, startBindings(t, n, BindingsOptions{}))
	}
	const sessions = 30
	var wg sync.WaitGroup
	for i, b := range bs {
		wg.Go(func() {
			for s := range sessions {
				b.Routed(fmt.Sprintf("sess-%d", s), "", targets[i])
			}
		})
	}
	wg.Wait()
	for s := range sessions {
		id := fmt.Sprintf("sess-%d", s)
		var v bindValue
		eventually(t, 5*time.Second, id+" stored", func() bool {
			var err error
			v, _, err = stored(t, bs[0], id)
			return err == nil
		})
		win := kvkey.Target{Worker: v.Worker, DPRank: v.Rank}
		for _, b := range bs {
			eventually(t, 5*time.Second, id+" followed on "+b.node.ReplicaID(), lookupIs(b, id, win))
		}
	}
	created, moved := 0.0, 0.0
	for _, b := range bs {
		created += counterValue(t, b.opsTotal.WithLabelValues("create", "ok"))
		moved += counterValue(t, b.opsTotal.WithLabelValues("rebind", "ok"))
	}
	if created != sessions || moved != 0 {
		t.Fatalf("creates won %v, rebinds %v: want exactly one create per session (%d) and no rebind", created, moved, sessions)
	}
}

// Touches are CAS updates at the cached revision, rate-limited to one per TTL/8; a rebind moves
// every replica; a write at a stale revision adopts the bucket's binding instead.
func TestBindingsTouchAndCAS(t *testing.T) {
	srv := embeddedConfig(t, "srv")
	startNode(t, srv)
	// TTL 8 s: the turn "within TTL/8 of the create" below comes after r2 saw the binding and a
	// read of the bucket, which a loaded CPU stretched past the 250 ms of a 2 s TTL (the turn
	// then rightly touched the binding).
	const ttl = 8 * time.Second
	b1 := startBindings(t, startNode(t, replicaConfig(srv, "r1", ttl)), BindingsOptions{})
	b2 := startBindings(t, startNode(t, replicaConfig(srv, "r2", ttl)), BindingsOptions{})

	b1.Routed("s", "", wA)
	eventually(t, 5*time.Second, "r2 sees the binding", lookupIs(b2, "s", wA))
	_, rev1, err := stored(t, b1, "s")
	if err != nil {
		t.Fatal(err)
	}
	b1.Routed("s", "", wA) // within TTL/8 of the create: no write
	time.Sleep(300 * time.Millisecond)
	if _, rev, _ := stored(t, b1, "s"); rev != rev1 {
		t.Fatalf("a turn within TTL/8 rewrote the binding (rev %d → %d)", rev1, rev)
	}
	time.Sleep(ttl/8 - 300*time.Millisecond + 50*time.Millisecond)
	b1.Routed("s", "", wA) // past TTL/8 (1 s): a touch
	eventually(t, 5*time.Second, "touch", func() bool { _, rev, _ := stored(t, b1, "s"); return rev > rev1 })
	if n := counterValue(t, b1.opsTotal.WithLabelValues("touch", "ok")); n != 1 {
		t.Fatalf("touches %v, want 1", n)
	}

	time.Sleep(100 * time.Millisecond) // past the race window of the touch r2 just saw
	b2.Routed("s", "", wB)             // r2 sent a turn elsewhere: it rebinds, r1 follows
	eventually(t, 5*time.Second, "r1 follows the rebind", lookupIs(b1, "s", wB))

	// A write at a stale revision loses the CAS and adopts what the bucket holds.
	b1.apply(context.Background(), bindOp{kind: opBind, key: key("s", "s"), target: wC, known: rev1})
	if got, _ := b1.Lookup("s"); got.Target != wB {
		t.Fatalf("after a stale CAS r1 holds %v, want the bucket's %v", got.Target, wB)
	}
	if v, _, _ := stored(t, b1, "s"); v.Worker != wB.Worker {
		t.Fatalf("a stale CAS overwrote the binding: %+v", v)
	}
	if n := counterValue(t, b1.opsTotal.WithLabelValues("rebind", "conflict")); n != 1 {
		t.Fatalf("conflicts %v, want 1", n)
	}

	b2.Ended("s")
	eventually(t, 5*time.Second, "end deletes everywhere", func() bool { _, ok := b1.Lookup("s"); return !ok })
	if _, _, err := stored(t, b1, "s"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("after the end the bucket still answers %v", err)
	}
}

// A binding idle for the session TTL expires in the bucket and in the cache; the session's
// next turn binds it afresh.
func TestBindingsTTLExpiry(t *testing.T) {
	srv := embeddedConfig(t, "srv")
	startNode(t, srv)
	b := startBindings(t, startNode(t, replicaConfig(srv, "r1", time.Second)), BindingsOptions{})
	b.Routed("s", "", wA)
	b.Released("s", wA) // the request is over: nothing keeps the binding alive
	eventually(t, 5*time.Second, "bound", lookupIs(b, "s", wA))
	eventually(t, 5*time.Second, "expired in the bucket", func() bool {
		_, _, err := stored(t, b, "s")
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
	eventually(t, 2*time.Second, "expired in the cache", func() bool { _, ok := b.Lookup("s"); return !ok })
	b.Routed("s", "", wB)
	eventually(t, 5*time.Second, "bound again", lookupIs(b, "s", wB))
}

// watchStale asks the stream leader for the last sequence a watch should have delivered: a
// watch that delivered it, or one whose missing sequence the leader no longer holds, is not
// stale; one short of a sequence the leader holds is.
func TestBindingsWatchStale(t *testing.T) {
	srv := embeddedConfig(t, "srv")
	startNode(t, srv)
	b := startBindings(t, startNode(t, replicaConfig(srv, "r1", time.Minute)), BindingsOptions{})
	b.Routed("s", "", wA)
	b.Released("s", wA)
	eventually(t, 5*time.Second, "bound", lookupIs(b, "s", wA))
	_, rev, err := stored(t, b, "s")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		name                 string
		delivered, leaderHas uint64
		want                 bool
	}{
		{"delivered the last", rev, rev, false},
		{"short of a held message", rev - 1, rev, true},
		{"short of one never written", rev, rev + 100, false},
		{"nothing delivered of a held message", 0, rev, true},
	} {
		if got := b.watchStale(ctx, c.delivered, c.leaderHas); got != c.want {
			t.Errorf("%s: stale = %v, want %v", c.name, got, c.want)
		}
	}
}

// NATS down: writes and pin reads fail fast and are counted, the cache still answers, nothing
// blocks or panics; once the server is back (an empty memory store) the buckets are recreated
// and new sessions bind again.
func TestBindingsNATSDownAndBack(t *testing.T) {
	srv := embeddedConfig(t, "srv")
	server := startNode(t, srv)
	n := startNode(t, replicaConfig(srv, "r1", time.Minute))
	b := startBindings(t, n, BindingsOptions{})
	b.Routed("before", "", wA)
	if err := b.SharePin(context.Background(), "resp_1", wB); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "bound", lookupIs(b, "before", wA))

	server.Close()
	eventually(t, 5*time.Second, "disconnected", func() bool { return !n.Connected() })
	if _, _, degraded := b.HealthDetail(); !degraded {
		t.Error("bindings not reported degraded with NATS down")
	}
	errs := counterValue(t, n.errs.WithLabelValues("bindings"))
	start := time.Now()
	b.Routed("during", "", wC)
	if _, ok := b.Lookup("before"); !ok {
		t.Fatal("the cache forgot a binding while NATS is down")
	}
	if err := b.SharePin(context.Background(), "resp_down", wA); err == nil {
		t.Fatal("sharing a pin with NATS down reported success")
	}
	if _, ok, err := b.LookupPin(context.Background(), "resp_1"); ok || err == nil {
		t.Fatalf("pin read with NATS down: ok %v err %v, want an error", ok, err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Fatalf("calls with NATS down took %s", d)
	}
	eventually(t, 5*time.Second, "the failed write is counted", func() bool {
		return counterValue(t, n.errs.WithLabelValues("bindings")) > errs
	})

	startNode(t, srv) // same port, fresh memory store
	eventually(t, 10*time.Second, "reconnected and buckets recreated", func() bool { return n.Connected() && b.Ready() })
	if name, _, degraded := b.HealthDetail(); degraded || name != "cluster_bindings" {
		t.Errorf("health detail %q degraded %v after NATS is back", name, degraded)
	}
	b.Routed("after", "", wB)
	eventually(t, 5*time.Second, "a new session binds again", func() bool {
		v, _, err := stored(t, b, "after")
		return err == nil && v.Worker == wB.Worker
	})
	if err := b.SharePin(context.Background(), "resp_2", wC); err != nil {
		t.Fatalf("pins shared again: %v", err)
	}
	if got, ok, err := b.LookupPin(context.Background(), "resp_2"); err != nil || !ok || got != wC {
		t.Fatalf("pin read back: %v %v %v", got, ok, err)
	}
}

// A pin shared by one replica is read by another at once; an unknown id is a miss, not an
// error.
func TestBindingsPins(t *testing.T) {
	srv := embeddedConfig(t, "srv")
	startNode(t, srv)
	b1 := startBindings(t, startNode(t, replicaConfig(srv, "r1", time.Minute)), BindingsOptions{})
	b2 := startBindings(t, startNode(t, replicaConfig(srv, "r2", time.Minute)), BindingsOptions{})
	if err := b1.SharePin(context.Background(), "resp_abc", wB); err != nil {
		t.Fatal(err)
	}
	// Shared before SharePin returned: r2 reads it at once, no waiting.
	if got, ok, err := b2.LookupPin(context.Background(), "resp_abc"); err != nil || !ok || got != wB {
		t.Fatalf("r2 reads the pin: %v %v %v", got, ok, err)
	}
	b1.TouchPin("resp_abc", wC) // a rewrite behind (as a pin in use is)
	eventually(t, 5*time.Second, "the touch lands", func() bool {
		got, ok, err := b2.LookupPin(context.Background(), "resp_abc")
		return err == nil && ok && got == wC
	})
	if _, ok, err := b2.LookupPin(context.Background(), "resp_unknown"); ok || err != nil {
		t.Fatalf("unknown pin: ok %v err %v, want a plain miss", ok, err)
	}
}

// Keys never carry the raw id and are valid for any id a client may send.
func TestBindingKeys(t *testing.T) {
	for _, id := range []string{"", "a:b/c", "séance 42", "..", "x.y.z"} {
		k := key("s", id)
		if len(k) != 2+32 || k[:2] != "s." {
			t.Fatalf("key(%q) = %q", id, k)
		}
	}
	if key("s", "a") == key("p", "a") || key("s", "a") == key("s", "b") {
		t.Fatal("keys collide")
	}
}

// The cache is bounded: the least recently updated binding goes first.
func TestBindingsCacheBound(t *testing.T) {
	srv := embeddedConfig(t, "srv")
	startNode(t, srv)
	b := startBindings(t, startNode(t, replicaConfig(srv, "r1", time.Minute)), BindingsOptions{MaxEntries: 3})
	for i := range 5 {
		b.put(key("s", fmt.Sprint(i)), bindValue{Worker: "http://w"}, uint64(i+1))
	}
	if b.Len() != 3 {
		t.Fatalf("cache holds %d, want 3", b.Len())
	}
	if _, ok := b.Lookup("0"); ok {
		t.Fatal("the oldest binding was kept")
	}
	if _, ok := b.Lookup("4"); !ok {
		t.Fatal("the newest binding was dropped")
	}
}

// BenchmarkBindingsLookup is the cost a clustered replica adds to a routing decision's hints:
// one cache read per session id (hit or miss), no network.
func BenchmarkBindingsLookup(b *testing.B) {
	bs, err := NewBindings(&Node{cfg: clusterconfig.Default(), id: "r"}, BindingsOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 10_000 {
		bs.put(key("s", fmt.Sprint("sess-", i)), bindValue{Worker: "http://w"}, uint64(i+1))
	}
	for _, tc := range []struct{ name, id string }{{"hit", "sess-42"}, {"miss", "unknown-session"}} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				bs.Lookup(tc.id)
			}
		})
	}
}

// Children bound by different replicas form one sibling group that every replica sees.
func TestBindingsSharedSiblingGroup(t *testing.T) {
	srv := embeddedConfig(t, "srv")
	startNode(t, srv)
	b1 := startBindings(t, startNode(t, replicaConfig(srv, "r1", time.Minute)), BindingsOptions{})
	b2 := startBindings(t, startNode(t, replicaConfig(srv, "r2", time.Minute)), BindingsOptions{})
	b3 := startBindings(t, startNode(t, replicaConfig(srv, "r3", time.Minute)), BindingsOptions{})
	b1.Routed("root", "", wA)
	b1.Routed("kid1", "root", wB)
	b2.Routed("kid2", "root", wB)
	b2.Routed("kid3", "root", wC)
	b2.Routed("other", "", wC) // no parent: in no group
	want := []string{"http://b#1×2", "http://c#0×1"}
	eventually(t, 5*time.Second, "r3 sees the fleet's sibling group", func() bool {
		var got []string
		for _, g := range b3.Group("root") {
			got = append(got, fmt.Sprintf("%s×%d", g.Target, g.Members))
		}
		return fmt.Sprint(got) == fmt.Sprint(want)
	})
	if g := b3.Group("other"); g != nil {
		t.Fatalf("a session without children has a group: %v", g)
	}
}

// BenchmarkSharePin is the write a stored Responses response adds to its request's path.
func BenchmarkSharePin(b *testing.B) {
	srv := clusterconfig.Default()
	srv.ReplicaID = "srv"
	srv.EmbeddedNATS.Listen = testport.Addr(b)
	srv.EmbeddedNATS.StoreDir = b.TempDir()
	startNodeB(b, srv)
	n := startNodeB(b, replicaConfig(srv, "r1", time.Minute))
	bs, err := NewBindings(n, BindingsOptions{})
	if err != nil {
		b.Fatal(err)
	}
	bs.Start(context.Background())
	b.Cleanup(bs.Close)
	for !bs.Ready() {
		time.Sleep(10 * time.Millisecond)
	}
	i := 0
	for b.Loop() {
		i++
		if err := bs.SharePin(context.Background(), fmt.Sprint("resp_", i), wA); err != nil {
			b.Fatal(err)
		}
	}
}

// On a 3-node NATS cluster of embedded servers with an R3 bucket (cluster.kv_replicas 3),
// losing the server that leads the bucket's stream loses no binding, and new sessions bind
// again once a new leader is elected.
func TestBindingsR3SurviveLeaderLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("forms a 3-node JetStream cluster (about 9 s)")
	}
	routes := []string{hostPort(freePort(t)), hostPort(freePort(t)), hostPort(freePort(t))}
	var nodes []*Node
	var bs []*Bindings
	for i := range 3 {
		c := embeddedConfig(t, fmt.Sprintf("n%d", i))
		c.EmbeddedNATS.ClusterListen = routes[i]
		c.EmbeddedNATS.Routes = routes
		c.KVReplicas = 3
		c.KVDeadline = confval.Duration(time.Second)
		n := startNode(t, c)
		b, err := NewBindings(n, BindingsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b.Start(context.Background())
		t.Cleanup(b.Close)
		nodes, bs = append(nodes, n), append(bs, b)
	}
	start := time.Now()
	for i, b := range bs {
		if !waitFor(15*time.Second, b.Ready) {
			t.Fatalf("n%d: R3 buckets not ready: %+v", i, nodes[i].Status())
		}
	}
	bs[0].Routed("before", "", wA)
	for i, b := range bs {
		eventually(t, 5*time.Second, fmt.Sprintf("n%d sees the binding", i), lookupIs(b, "before", wA))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := nodes[0].JetStream().Stream(ctx, "KV_"+nodes[0].Bucket("sessions"))
	if err != nil {
		t.Fatal(err)
	}
	leader := st.CachedInfo().Cluster.Leader
	t.Logf("ready and bound after %s; stream leader %s", time.Since(start), leader)
	var survivors []*Bindings
	for i, n := range nodes {
		if n.ReplicaID() == leader {
			bs[i].Close()
			n.Close()
		} else {
			survivors = append(survivors, bs[i])
		}
	}
	if len(survivors) != 2 {
		t.Fatalf("stream leader %q is none of the nodes", leader)
	}
	s := survivors[0]
	eventually(t, 10*time.Second, "writes resume under a new leader", func() bool {
		s.Routed("after", "", wB)
		v, _, err := stored(t, s, "after")
		return err == nil && v.Worker == wB.Worker
	})
	if v, _, err := stored(t, survivors[1], "before"); err != nil || v.Worker != wA.Worker {
		t.Fatalf("the binding from before the leader loss: %+v %v", v, err)
	}
	if v, _, err := stored(t, survivors[1], "after"); err != nil || v.Worker != wB.Worker {
		t.Fatalf("the binding made after the leader loss, read by the other survivor: %+v %v", v, err)
	}
	// The other survivor follows it at once: it heard of the leader change, so its cache is
	// known to be behind and the turn's Sync reads the bucket (without it, its ordered
	// consumer, which lived on the lost leader, would be reset only after missed heartbeats,
	// about 10 s later).
	// The advisory is asynchronous: under load it may land a little after the write, but far
	// sooner than the heartbeat reset.
	o := survivors[1]
	eventually(t, 2*time.Second, "the other survivor knows its cache is behind (or already has the binding)", func() bool {
		return o.Behind() || lookupIs(o, "after", wB)()
	})
	o.Sync(context.Background(), "after", "")
	if got, ok := o.Lookup("after"); !ok || got.Target != wB {
		t.Fatalf("the other survivor right after the write: %+v %v, want %v", got, ok, wB)
	}
	// And its watch is restarted at once, so the cache catches up well before then.
	eventually(t, 3*time.Second, "the other survivor's watch catches up", func() bool { return !o.Behind() })
	s.Routed("later", "", wC)
	eventually(t, 2*time.Second, "the other survivor's watch delivers new bindings", lookupIs(o, "later", wC))
}

func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			return false
		}
	}
	return true
}

// A request that runs longer than the session TTL keeps its session's binding alive (touched
// every TTL/2 while it is in flight); a session with nothing in flight expires as before; the
// end of a request (the lease end) touches the binding, restarting its TTL.
func TestBindingsInFlightKeepAliveAndLeaseEnd(t *testing.T) {
	const ttl = 2 * time.Second
	srv := embeddedConfig(t, "srv")
	startNode(t, srv)
	b := startBindings(t, startNode(t, replicaConfig(srv, "r1", ttl)), BindingsOptions{})
	b.Routed("long", "", wA) // in flight until the end of the test
	b.Routed("idle", "", wB)
	b.Released("idle", wB)
	eventually(t, 5*time.Second, "both bound", func() bool { return lookupIs(b, "long", wA)() && lookupIs(b, "idle", wB)() })
	_, rev0, err := stored(t, b, "long")
	if err != nil {
		t.Fatal(err)
	}
	if _, d, _ := b.HealthDetail(); d.(BindingsStatus).InFlightSessions != 1 || d.(BindingsStatus).Behind {
		t.Fatalf("health detail %+v, want 1 session in flight and the cache caught up", d)
	}

	b.Routed("lease", "", wC)
	eventually(t, 5*time.Second, "lease bound", lookupIs(b, "lease", wC))
	_, leaseRev, _ := stored(t, b, "lease")
	time.Sleep(ttl * 2 / 5) // past TTL/8 (a lease end touches) but short of TTL/2 (no keep-alive)
	b.Released("lease", wC)
	eventually(t, 2*time.Second, "the lease end touches the binding", func() bool {
		_, rev, err := stored(t, b, "lease")
		return err == nil && rev > leaseRev
	})
	touched := time.Now()

	eventually(t, 3*ttl, "the idle session expires", func() bool {
		_, _, err := stored(t, b, "idle")
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
	time.Sleep(time.Until(touched.Add(ttl * 3 / 5)))
	if _, _, err := stored(t, b, "lease"); err != nil {
		t.Fatalf("binding touched at its lease end, read %s later: %v", ttl*3/5, err)
	}
	time.Sleep(time.Until(touched.Add(ttl + ttl/2)))
	v, rev, err := stored(t, b, "long")
	if err != nil {
		t.Fatalf("binding of a request in flight for %s (TTL %s): %v", time.Since(touched)+ttl*2/5, ttl, err)
	}
	if v.Worker != wA.Worker || rev <= rev0 {
		t.Fatalf("kept-alive binding %+v at revision %d (created at %d)", v, rev, rev0)
	}
	b.Released("long", wA)
	if b.InFlight() != 0 {
		t.Fatalf("in flight after the last release: %d sessions", b.InFlight())
	}

	// A session that ends while a request of it is still in flight is not bound again.
	b.Routed("ends", "", wB)
	eventually(t, 5*time.Second, "ends bound", lookupIs(b, "ends", wB))
	b.Ended("ends")
	time.Sleep(ttl/2 + ttl/4 + 100*time.Millisecond) // past a keeper tick that would touch it
	if _, _, err := stored(t, b, "ends"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("an ended session with a request in flight: the bucket answers %v, want not found", err)
	}
	b.Released("ends", wB)
}

// A request whose end never comes is no longer kept alive after MaxRequestAge.
func TestBindingsInFlightSafetyNet(t *testing.T) {
	srv := embeddedConfig(t, "srv")
	startNode(t, srv)
	b := startBindings(t, startNode(t, replicaConfig(srv, "r1", time.Second)), BindingsOptions{MaxRequestAge: 300 * time.Millisecond})
	b.Routed("leaked", "", wA)
	if b.InFlight() != 1 {
		t.Fatalf("in flight: %d sessions, want 1", b.InFlight())
	}
	eventually(t, 3*time.Second, "the leaked request is dropped", func() bool { return b.InFlight() == 0 })
	if n := counterValue(t, b.opsTotal.WithLabelValues("keepalive", "expired")); n != 1 {
		t.Fatalf("expired keep-alives counted %v, want 1", n)
	}
}
