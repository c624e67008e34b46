package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/keylimits"
)

// limitsReplica starts a client node of the server and a limits sync over lim, reporting every
// 20 ms (the production interval is 100 ms; the test's load is compressed in time likewise).
func limitsReplica(t *testing.T, server *Node, id, keyFile string, lim *keylimits.Limiter) (*Node, *LimitsSync) {
	t.Helper()
	n := startNode(t, keyedClient(server, id, keyFile))
	eventually(t, 5*time.Second, id+" connected", n.Connected)
	s, err := startLimitsSync(context.Background(), n, n.Conn(), lim, prometheus.NewRegistry(), nil, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return n, s
}

// Three replicas on an embedded NATS server share one 1,200 rpm key (burst 20): requests every
// 2 ms spread round robin over them for 3 s are admitted, in total, within 5% of what one
// bucket admits over the time they took (20 + 20/s), where three independent buckets would
// admit three times that.
func TestLimitsSyncFleetWide(t *testing.T) {
	srv := startNode(t, embeddedConfig(t, "nats"))
	limits := map[string]keylimits.Limits{"k": {RequestsPerMinute: 1200}}
	lims := make([]*keylimits.Limiter, 3)
	for i := range lims {
		lims[i] = keylimits.New(limits, 400*time.Millisecond, time.Now())
		limitsReplica(t, srv, fmt.Sprint("r", i), "", lims[i])
	}
	for i, l := range lims {
		eventually(t, 3*time.Second, fmt.Sprintf("r%d hears both peers", i), func() bool { return l.Peers() == 2 })
	}
	// The buckets filled while the replicas met: the run starts with a full burst everywhere.
	start := time.Now()
	admitted, sent := 0, 0
	for time.Since(start) < 3*time.Second {
		l := lims[sent%3]
		if d := l.Admit("k", 0, time.Now()); d.Allowed {
			admitted++
			l.Release(d.Ticket)
		}
		sent++
		time.Sleep(2 * time.Millisecond)
	}
	elapsed := time.Since(start)
	want := 20 + 20*elapsed.Seconds()
	t.Logf("%d of %d admitted in %s across 3 replicas; one bucket admits %.1f", admitted, sent, elapsed.Round(time.Millisecond), want)
	if math.Abs(float64(admitted)-want) > 0.05*want {
		t.Fatalf("admitted %d, want %.1f ± 5%%", admitted, want)
	}
}

// A replica that leaves is forgotten at once (its leave message), one killed after the peer
// timeout; either way the others' share of the key returns to the whole limit.
func TestLimitsSyncLeaveAndExpiry(t *testing.T) {
	srv := startNode(t, embeddedConfig(t, "nats"))
	limits := map[string]keylimits.Limits{"k": {RequestsPerMinute: 60}}
	a := keylimits.New(limits, 300*time.Millisecond, time.Now())
	b := keylimits.New(limits, 300*time.Millisecond, time.Now())
	c := keylimits.New(limits, 300*time.Millisecond, time.Now())
	limitsReplica(t, srv, "a", "", a)
	_, sb := limitsReplica(t, srv, "b", "", b)
	nc, _ := limitsReplica(t, srv, "c", "", c)
	eventually(t, 3*time.Second, "a hears b and c", func() bool { return a.Peers() == 2 })
	sb.Close()
	eventually(t, time.Second, "b's leave forgotten", func() bool { return a.Peers() == 1 })
	nc.Close() // killed: no leave message
	eventually(t, 2*time.Second, "c expired", func() bool { return a.Peers() == 0 })
}

// With a fleet key, an outsider on the bus cannot claim a key's share (a forged report of huge
// demand from a fake replica would starve the real ones): the forgery is dropped, the real
// peer's report still counts.
func TestLimitsSyncForgedReportDropped(t *testing.T) {
	srv := startNode(t, embeddedConfig(t, "nats"))
	keyFile := writeKey(t, testKey)
	limits := map[string]keylimits.Limits{"k": {RequestsPerMinute: 600}}
	a := keylimits.New(limits, time.Second, time.Now())
	b := keylimits.New(limits, time.Second, time.Now())
	na, _ := limitsReplica(t, srv, "a", keyFile, a)
	limitsReplica(t, srv, "b", keyFile, b)
	eventually(t, 3*time.Second, "a hears b", func() bool { return a.Peers() == 1 })

	evil, err := nats.Connect(na.Conn().ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close()
	data, _ := json.Marshal(limitsMsg{Replica: "evil", Epoch: 1, Seq: 1, Keys: []limitsEntry{{Name: "k", Requests: 1e9}}})
	for range 5 {
		if err := evil.Publish(na.Subject("limits", "evil"), data); err != nil {
			t.Fatal(err)
		}
	}
	if err := evil.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if a.Peers() != 1 {
		t.Fatalf("a counts %d peers: the forged replica was admitted", a.Peers())
	}
	// a's share is still about a half: the burst (10) is half a's.
	ok := 0
	for range 20 {
		if a.Admit("k", 0, time.Now()).Allowed {
			ok++
		}
	}
	if ok < 4 || ok > 6 {
		t.Fatalf("a admitted %d of a burst of 10 shared with one peer", ok)
	}
}
