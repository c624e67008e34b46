package cluster

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testport"

	"github.com/kvgate/kvgate/cluster/clusterconfig"
)

// freePort returns a loopback port nothing listens on (so a restarted server can reuse it).
func freePort(t *testing.T) int {
	t.Helper()
	return testport.Free(t)
}

func hostPort(p int) string { return "127.0.0.1:" + strconv.Itoa(p) }

// embeddedConfig is a standalone embedded server on a free port, its store in t's temp dir.
func embeddedConfig(t *testing.T, id string) clusterconfig.Config {
	t.Helper()
	c := clusterconfig.Default()
	c.ReplicaID = id
	c.EmbeddedNATS.Listen = hostPort(freePort(t))
	c.EmbeddedNATS.StoreDir = t.TempDir()
	return c
}

// startNode starts a node and stops it at the end of the test.
func startNode(t *testing.T, c clusterconfig.Config) *Node {
	t.Helper()
	n, err := Start(context.Background(), c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}

// eventually polls cond every 10 ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
