package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvgate/kvgate/cluster/clusterconfig"
	"github.com/kvgate/kvgate/sessions"
)

// A split heals without losing session bindings: on a 3-node NATS cluster of embedded servers
// (an R3 sessions bucket), one server is cut off (shut down) while replicas on both sides keep
// routing. The minority replica routes on its own state and counts the failed writes; the
// majority keeps binding. After the server is back, every binding written on the majority side
// is in the bucket, and the minority replica's tracker follows the bucket's binding again from
// its next turn (rule shared_affinity), not the worker it chose during the split.
func TestBindingsSplitHeals(t *testing.T) {
	if testing.Short() {
		t.Skip("forms a 3-node JetStream cluster and restarts one server (about 12 s)")
	}
	routes := []string{hostPort(freePort(t)), hostPort(freePort(t)), hostPort(freePort(t))}
	var cfgs []clusterconfig.Config
	servers := make([]*server.Server, 3)
	for i := range 3 {
		c := embeddedConfig(t, fmt.Sprintf("n%d", i))
		c.EmbeddedNATS.ClusterListen = routes[i]
		c.EmbeddedNATS.Routes = routes
		cfgs = append(cfgs, c)
		servers[i] = startSplitServer(t, c)
	}
	// One replica per server, each connected to its server only (as a gateway next to it).
	var bs []*Bindings
	var nodes []*Node
	for i, c := range cfgs {
		rc := replicaConfig(c, fmt.Sprintf("r%d", i), time.Minute)
		rc.KVReplicas = 3
		n := startNode(t, rc)
		b, err := NewBindings(n, BindingsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b.race = 50 * time.Millisecond
		b.Start(context.Background())
		t.Cleanup(b.Close)
		bs, nodes = append(bs, b), append(nodes, n)
	}
	for i, b := range bs {
		if !waitFor(15*time.Second, b.Ready) {
			t.Fatalf("r%d: R3 buckets not ready: %+v", i, nodes[i].Status())
		}
	}
	maj, min := bs[0], bs[2]
	tracker, err := sessions.New(sessions.Defaults(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	tracker.SetShared(min) // the minority replica's session tracker, as cmd/kvgate wires it

	maj.Routed("x", "", wA) // bound before the split
	maj.Released("x", wA)
	for i, b := range bs {
		eventually(t, 5*time.Second, fmt.Sprintf("r%d sees x", i), lookupIs(b, "x", wA))
	}

	servers[2].Shutdown() // the minority side: its replica loses NATS
	eventually(t, 5*time.Second, "minority disconnected", func() bool { return !nodes[2].Connected() })
	errs := counterValue(t, nodes[2].errs.WithLabelValues("bindings"))
	// The minority keeps routing on its own state: x goes to another worker there (a turn
	// later than the race window, in which it would follow the fresh binding).
	time.Sleep(2 * min.race)
	tracker.OnRouted("x", wC, nil)
	tracker.OnReleased("x", wC)
	if hs := tracker.Hints("x", ""); len(hs) != 1 || hs[0].Target != wC || hs[0].Rule != sessions.RuleAffinity {
		t.Fatalf("minority hints during the split: %+v, want its own affinity to %v", hs, wC)
	}
	eventually(t, 5*time.Second, "minority's failed write counted", func() bool {
		return counterValue(t, nodes[2].errs.WithLabelValues("bindings")) > errs
	})
	if _, _, degraded := min.HealthDetail(); !degraded {
		t.Error("minority bindings not degraded during the split")
	}
	// The majority keeps binding, new sessions and moves alike.
	eventually(t, 10*time.Second, "majority binds during the split", func() bool {
		maj.Routed("during", "", wB)
		v, _, err := stored(t, maj, "during")
		return err == nil && v.Worker == wB.Worker
	})
	maj.Released("during", wB)
	for i := range 5 {
		id := fmt.Sprintf("m%d", i)
		maj.Routed(id, "", wC)
		maj.Released(id, wC)
	}
	for i := range 5 {
		eventually(t, 5*time.Second, "majority binding m", func() bool {
			v, _, err := stored(t, maj, fmt.Sprintf("m%d", i))
			return err == nil && v.Worker == wC.Worker
		})
	}

	healed := time.Now()
	servers[2].WaitForShutdown()
	servers[2] = startSplitServer(t, cfgs[2]) // heal: same name, routes and store
	eventually(t, 10*time.Second, "minority reconnected", nodes[2].Connected)
	// The minority's client can reconnect to the restarted server a moment before that server
	// has its routes and JetStream back (its reads then get "no responders": the store is still
	// unreachable and the replica rightly stays on its own state). Under a loaded CPU that moment
	// stretches, so the turn below waits until the store answers the minority's side again: a
	// read of a key nobody writes, on the bucket directly (not through the bindings' cache).
	eventually(t, 10*time.Second, "the bucket answers the minority", func() bool {
		_, _, err := stored(t, min, "never-written")
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
	t.Logf("minority behind at its first turn after the heal: %v", min.Behind())
	// From its first turn once the store is back, whether or not its watch has replayed the
	// bucket yet (in practice it has not: Behind is still true here), the minority follows the
	// bucket's binding of x (wA), not its split-time choice (wC): a binding learned after a
	// reset wins over routing before it.
	tracker.SyncShared(context.Background(), "x", "")
	if hs := tracker.Hints("x", ""); len(hs) != 1 || hs[0].Target != wA || hs[0].Rule != sessions.RuleSharedAffinity {
		t.Fatalf("minority hints right after the reconnect: %+v, want the fleet's binding to %v (node %+v, behind %v, routes %d, js current %v)", hs, wA, nodes[2].Status(), min.Behind(), servers[2].NumRoutes(), servers[2].JetStreamIsCurrent())
	}
	eventually(t, 10*time.Second, "minority caught up", func() bool {
		return nodes[2].Connected() && min.Ready() && !min.Behind()
	})
	t.Logf("minority caught up %s after the heal (stale watches restarted: %v)", time.Since(healed),
		counterValue(t, min.opsTotal.WithLabelValues("watch", "stale")))
	for _, id := range []string{"x", "during", "m0", "m1", "m2", "m3", "m4"} {
		want := map[string]string{"x": wA.Worker, "during": wB.Worker}[id]
		if want == "" {
			want = wC.Worker
		}
		v, _, err := stored(t, min, id)
		if err != nil || v.Worker != want {
			t.Fatalf("binding %s after the heal, read on the minority side: %+v %v, want %s", id, v, err, want)
		}
		eventually(t, 2*time.Second, "minority cache has "+id, func() bool {
			got, ok := min.Lookup(id)
			return ok && got.Target.Worker == want
		})
	}
	// x's next turn on the minority replica follows the bucket (wA), not its split-time choice.
	tracker.SyncShared(context.Background(), "x", "")
	if hs := tracker.Hints("x", ""); len(hs) != 1 || hs[0].Target != wA || hs[0].Rule != sessions.RuleSharedAffinity {
		t.Fatalf("minority hints after the heal: %+v, want the fleet's binding to %v", hs, wA)
	}
}

// startSplitServer starts c's embedded server as startEmbedded does, except that it does not
// advertise its peers to clients: a replica connected to it stays cut off while it is down,
// instead of reconnecting to the majority's servers.
func startSplitServer(t *testing.T, c clusterconfig.Config) *server.Server {
	t.Helper()
	host, port, err := splitHostPort(c.EmbeddedNATS.Listen)
	if err != nil {
		t.Fatal(err)
	}
	ch, cp, err := splitHostPort(c.EmbeddedNATS.ClusterListen)
	if err != nil {
		t.Fatal(err)
	}
	opts := &server.Options{ServerName: c.ReplicaID, Host: host, Port: port, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: c.EmbeddedNATS.StoreDir, DisableJetStreamBanner: true,
		JetStreamMaxMemory: int64(c.EmbeddedNATS.MaxMemory), JetStreamMaxStore: int64(c.EmbeddedNATS.MaxMemory),
		Cluster: server.ClusterOpts{Name: "kvgate", Host: ch, Port: cp, NoAdvertise: true}}
	for _, r := range c.EmbeddedNATS.Routes {
		u, err := url.Parse("nats-route://" + r)
		if err != nil {
			t.Fatal(err)
		}
		opts.Routes = append(opts.Routes, u)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}
