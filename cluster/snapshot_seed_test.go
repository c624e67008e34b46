package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/cluster/clusterconfig"
	"github.com/kvgate/kvgate/kvkey"
)

// routedConfig is an embedded server listening for routes on listen, routed to routes.
func routedConfig(t *testing.T, id, listen string, routes []string) clusterconfig.Config {
	t.Helper()
	c := embeddedConfig(t, id)
	c.EmbeddedNATS.ClusterListen = listen
	c.EmbeddedNATS.Routes = routes
	return c
}

// A seed replica whose embedded server joins the NATS cluster late gets a peer's snapshot at
// once: its offer crosses the route that forms while it starts.
func TestFetchSnapshotSeedJoiningLate(t *testing.T) {
	tg := kvkey.Target{Worker: "http://w1"}
	routes := []string{hostPort(freePort(t)), hostPort(freePort(t))}
	na := startNode(t, routedConfig(t, "a", routes[0], routes))
	a, err := NewSnapshots(na, &fakeSource{snaps: map[kvkey.Target][]byte{tg: []byte("state")}}, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	if err := na.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	nb := startNode(t, routedConfig(t, "b", routes[1], routes))
	b, err := NewSnapshots(nb, &fakeSource{}, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, peer, err := b.FetchSnapshot(ctx, tg)
	if err != nil || peer != "a" || string(got) != "state" {
		t.Fatalf("got %q from %q, err %v", got, peer, err)
	}
}
