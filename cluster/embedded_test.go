package cluster

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// An embedded server whose routes name no other server (none, or only its own route listener,
// as a one-seed fleet lists itself) runs standalone, so that its JetStream works: a one-node
// NATS cluster never elects a meta leader.
func TestEmbeddedWithoutPeerRoutesHasJetStream(t *testing.T) {
	tests := []struct {
		name   string
		routes func(own string) []string
	}{
		{"no routes", func(string) []string { return nil }},
		{"only its own route", func(own string) []string { return []string{own} }},
		{"only its own route, nats-route:// form", func(own string) []string { return []string{"nats-route://" + own} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := embeddedConfig(t, "solo")
			c.EmbeddedNATS.ClusterListen = hostPort(freePort(t))
			c.EmbeddedNATS.Routes = tc.routes(c.EmbeddedNATS.ClusterListen)
			start := time.Now()
			n, err := Start(context.Background(), c, Options{})
			if err != nil {
				t.Fatalf("start (after %s): %v", time.Since(start).Round(time.Millisecond), err)
			}
			t.Cleanup(n.Close)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			kv, err := n.JetStream().CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "solo"})
			if err != nil {
				t.Fatalf("JetStream unusable: %v", err)
			}
			if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
				t.Fatalf("put: %v", err)
			}
		})
	}
}

func TestIsOwnRoute(t *testing.T) {
	tests := []struct {
		host  string
		port  int
		route string
		want  bool
	}{
		{"127.0.0.1", 6222, "nats-route://127.0.0.1:6222", true},
		{"127.0.0.1", 6222, "nats-route://127.0.0.1:6223", false},
		{"10.0.0.1", 6222, "nats-route://10.0.0.2:6222", false}, // every node on 6222
		{"0.0.0.0", 6222, "nats-route://127.0.0.1:6222", true},
		{"", 6222, "nats-route://localhost:6222", true},
		{"0.0.0.0", 6222, "nats-route://nats-1:6222", false},
		{"127.0.0.1", 6222, "nats-route://nats-1", false}, // no port
	}
	for _, tc := range tests {
		u, err := url.Parse(tc.route)
		if err != nil {
			t.Fatal(err)
		}
		if got := isOwnRoute(tc.host, tc.port, u); got != tc.want {
			t.Errorf("isOwnRoute(%q, %d, %s) = %v, want %v", tc.host, tc.port, tc.route, got, tc.want)
		}
	}
}
