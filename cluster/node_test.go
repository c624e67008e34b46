package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvgate/kvgate/cluster/clusterconfig"
)

func TestStartEmbeddedStandalone(t *testing.T) {
	n := startNode(t, embeddedConfig(t, "r1"))
	if !n.Connected() {
		t.Fatal("not connected to its own embedded server")
	}
	st := n.Status()
	if st.ReplicaID != "r1" || !st.Embedded || st.Degraded || st.Fleet != "default" {
		t.Fatalf("status %+v", st)
	}
	if got := n.Subject("load", "r1"); got != "kvgate.v1.default.load.r1" {
		t.Fatalf("subject %q", got)
	}
	// JetStream is on: a key-value bucket can be created.
	if _, err := n.JetStream().AccountInfo(context.Background()); err != nil {
		t.Fatalf("jetstream: %v", err)
	}
}

func TestStartRefusesNoCluster(t *testing.T) {
	if _, err := Start(context.Background(), clusterconfig.Default(), Options{}); err == nil {
		t.Fatal("Start without nats_url or embedded server must fail")
	}
}

// A replica whose NATS is not up yet still starts (degraded) and connects once it is.
func TestStartBeforeNATSIsUp(t *testing.T) {
	server := embeddedConfig(t, "srv")
	c := clusterconfig.Default()
	c.ReplicaID = "client"
	c.NATSURL = "nats://" + server.EmbeddedNATS.Listen
	n := startNode(t, c)
	if n.Connected() || !n.Status().Degraded {
		t.Fatalf("connected to a server that is not running: %+v", n.Status())
	}
	startNode(t, server)
	eventually(t, 5*time.Second, "client connects once the server is up", n.Connected)
}

// Two replicas whose embedded servers list each other as routes form one NATS cluster: a
// message published on one reaches a subscriber on the other.
func TestEmbeddedRoutesFormOneCluster(t *testing.T) {
	ra, rb := hostPort(freePort(t)), hostPort(freePort(t))
	ca, cb := embeddedConfig(t, "a"), embeddedConfig(t, "b")
	for _, c := range []*clusterconfig.Config{&ca, &cb} {
		c.EmbeddedNATS.Routes = []string{ra, "nats-route://" + rb}
	}
	ca.EmbeddedNATS.ClusterListen, cb.EmbeddedNATS.ClusterListen = ra, rb
	a, b := startNode(t, ca), startNode(t, cb)
	sub, err := b.Conn().SubscribeSync(b.Subject("probe"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	var got *nats.Msg
	eventually(t, 10*time.Second, "a message crosses the route", func() bool {
		_ = a.Conn().Publish(a.Subject("probe"), []byte("hi"))
		m, err := sub.NextMsg(50 * time.Millisecond)
		got = m
		return err == nil
	})
	if string(got.Data) != "hi" {
		t.Fatalf("got %q", got.Data)
	}
}

// The embedded server going away makes its client degraded (a status, not an error), and the
// status recovers when a server is back on the same address.
func TestDegradedWhileNATSIsDown(t *testing.T) {
	server := embeddedConfig(t, "srv")
	srv, err := Start(context.Background(), server, Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := clusterconfig.Default()
	c.ReplicaID = "client"
	c.NATSURL = "nats://" + server.EmbeddedNATS.Listen
	n := startNode(t, c)
	reconnected := make(chan struct{}, 1)
	n.OnReconnect(func() { reconnected <- struct{}{} })
	eventually(t, 5*time.Second, "connected", n.Connected)
	srv.Close()
	eventually(t, 5*time.Second, "degraded after the server stopped", func() bool { return n.Status().Degraded })
	if err := n.Conn().Publish(n.Subject("x"), nil); err == nil {
		t.Fatal("a publish while disconnected must fail fast (no reconnect buffer)")
	}
	startNode(t, server)
	eventually(t, 10*time.Second, "reconnected", n.Connected)
	select {
	case <-reconnected:
	case <-time.After(5 * time.Second):
		t.Fatal("OnReconnect callbacks did not run")
	}
	if st := n.Status(); st.Disconnects == 0 || st.Reconnects == 0 || !strings.Contains(st.LastError, "connection") && st.LastError != "" {
		t.Fatalf("status after the outage %+v", st)
	}
}
