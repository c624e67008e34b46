package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/cluster/clusterconfig"
	"github.com/kvgate/kvgate/confval"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
)

// writeKey writes a fleet key file in t's temp dir and returns its path.
func writeKey(t *testing.T, key string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fleet.key")
	if err := os.WriteFile(p, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const testKey = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// outsider is a NATS client with bus access and no fleet key.
func outsider(t *testing.T, srv clusterconfig.Config) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect("nats://" + srv.EmbeddedNATS.Listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func TestFleetKeyMessages(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	k, err := loadFleetKey(writeKey(t, testKey), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	k.now = func() time.Time { return now }
	other, _ := loadFleetKey(writeKey(t, strings.Repeat("x", 40)), 30*time.Second)
	other.now = k.now
	signed := func(by *fleetKey, at time.Time) *nats.Msg {
		m := &nats.Msg{Subject: "kvgate.v1.f.load.a", Reply: "_INBOX.x", Data: []byte("body")}
		saved := by.now
		by.now = func() time.Time { return at }
		by.signMsg(m)
		by.now = saved
		return m
	}
	tests := []struct {
		name string
		msg  func() *nats.Msg
		want error
	}{
		{"valid", func() *nats.Msg { return signed(k, now) }, nil},
		{"unsigned", func() *nats.Msg { return &nats.Msg{Subject: "kvgate.v1.f.load.a", Data: []byte("body")} }, errUnsigned},
		{"another key", func() *nats.Msg { return signed(other, now) }, errBadMAC},
		{"body changed", func() *nats.Msg { m := signed(k, now); m.Data = []byte("bodY"); return m }, errBadMAC},
		{"moved to another subject", func() *nats.Msg { m := signed(k, now); m.Subject = "kvgate.v1.f.load.b"; return m }, errBadMAC},
		{"answer redirected", func() *nats.Msg { m := signed(k, now); m.Reply = "_INBOX.evil"; return m }, errBadMAC},
		{"replayed after the window", func() *nats.Msg { return signed(k, now.Add(-31*time.Second)) }, errStale},
		{"from the future", func() *nats.Msg { return signed(k, now.Add(31*time.Second)) }, errStale},
		{"garbage header", func() *nats.Msg {
			m := signed(k, now)
			m.Header.Set(authHeader, "v1 x y")
			return m
		}, errBadMAC},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := k.checkMsg(tc.msg()); !errors.Is(err, tc.want) {
				t.Fatalf("checkMsg: %v, want %v", err, tc.want)
			}
		})
	}
	var none *fleetKey
	if err := none.checkMsg(&nats.Msg{Subject: "x"}); err != nil {
		t.Fatalf("no key must accept everything: %v", err)
	}
	if _, err := loadFleetKey(writeKey(t, "short"), time.Second); err == nil {
		t.Fatal("a 5-byte key was accepted")
	}
}

// keyedClient is clientConfig with the fleet key file (none when "").
func keyedClient(server *Node, id, keyFile string) clusterconfig.Config {
	c := clientConfig(server, id, 100*time.Millisecond, 400*time.Millisecond)
	c.FleetKeyFile = keyFile
	return c
}

// An outside client with bus access publishes a forged load snapshot from a fake replica
// "evil" claiming 1000 requests on a worker (the herding attack): without a fleet key the peers
// count it; with one it is dropped and counted, while the real peer's load still arrives.
func TestForgedLoadDropped(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		t.Run(map[bool]string{false: "no fleet key", true: "fleet key"}[keyed], func(t *testing.T) {
			srvCfg := embeddedConfig(t, "nats")
			srv := startNode(t, srvCfg)
			keyFile := ""
			if keyed {
				keyFile = writeKey(t, testKey)
			}
			start := func(id string) (*Node, *LoadSync) {
				n := startNode(t, keyedClient(srv, id, keyFile))
				eventually(t, 5*time.Second, id+" connected", n.Connected)
				ls, err := startLoadSync(context.Background(), n, n.Conn(), LoadSyncOptions{Registerer: prometheus.NewRegistry()})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(ls.Close)
				return n, ls
			}
			_, a := start("a")
			nb, b := start("b")
			w := kvkey.Target{Worker: "http://w0"}
			a.LoadDelta(w, router.LoadVector{Requests: 1})
			eventually(t, 2*time.Second, "b hears a", func() bool { return b.Peers().Sum(w).Requests == 1 })

			evil := outsider(t, srvCfg)
			forged := encodeLoad(kindSnapshot, "evil", 1, 1, []router.TargetLoadVector{{Target: w, Load: router.LoadVector{Requests: 1000}}})
			stop := time.Now().Add(time.Second)
			for time.Now().Before(stop) {
				if err := evil.Publish(nb.Subject("load", "evil"), forged); err != nil {
					t.Fatal(err)
				}
				if b.Peers().Sum(w).Requests > 1 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			got := b.Peers().Sum(w).Requests
			rejected := counterOf(t, nb.unauth.WithLabelValues("load"))
			t.Logf("b counts %d requests in flight on w (a's real 1); %v forged messages dropped", got, rejected)
			if keyed {
				if got != 1 || rejected == 0 {
					t.Fatalf("with a fleet key: b counts %d requests on w (want a's 1), %v unauthenticated messages dropped", got, rejected)
				}
			} else if got != 1001 {
				t.Fatalf("without a fleet key the forged load should reproduce the attack: b counts %d", got)
			}
		})
	}
}

// An outside client rewrites a session's binding in the bucket (a forged value, then a
// replay of a genuine signed value the session has since moved from): replicas with the fleet
// key keep the genuine binding.
func TestForgedBindingIgnored(t *testing.T) {
	srvCfg := embeddedConfig(t, "srv")
	startNode(t, srvCfg)
	keyFile := writeKey(t, testKey)
	cfg := func(id string) clusterconfig.Config {
		c := replicaConfig(srvCfg, id, time.Minute)
		c.FleetKeyFile = keyFile
		c.MessageWindow = confval.Duration(time.Second)
		return c
	}
	na := startNode(t, cfg("a"))
	nb := startNode(t, cfg("b"))
	a := startBindings(t, na, BindingsOptions{})
	b := startBindings(t, nb, BindingsOptions{})

	a.Routed("s1", "", wA)
	eventually(t, 3*time.Second, "b learns s1 → wA", lookupIs(b, "s1", wA))
	evil := outsider(t, srvCfg)
	js, err := jetstream.New(evil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, nb.Bucket("sessions"))
	if err != nil {
		t.Fatal(err)
	}
	old, err := kv.Get(ctx, key("s", "s1"))
	if err != nil {
		t.Fatal(err)
	}
	// The session moves to wB (a genuine rebind: the turn after its binding was learned).
	e, _ := a.cached(key("s", "s1"))
	a.enqueue(bindOp{kind: opBind, key: key("s", "s1"), target: wB, known: e.rev})
	eventually(t, 3*time.Second, "b learns s1 → wB", lookupIs(b, "s1", wB))

	forged, _ := json.Marshal(bindValue{V: 1, Worker: wC.Worker, Rank: wC.DPRank, Writer: "evil", AtMs: time.Now().UnixMilli()})
	if _, err := kv.Put(ctx, key("s", "s1"), forged); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // past the message window: the old value is a replay now
	if _, err := kv.Put(ctx, key("s", "s1"), old.Value()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Second, "both writes rejected", func() bool {
		return counterOf(t, nb.unauth.WithLabelValues("binding")) >= 2
	})
	if got, ok := b.Lookup("s1"); !ok || got.Target != wB {
		t.Fatalf("b's binding of s1 after the forgeries: %+v %v, want wB", got, ok)
	}
	t.Logf("after a forged value and a replayed old one: s1 → %s; %v writes refused", wB.Worker, counterOf(t, nb.unauth.WithLabelValues("binding")))
}

// An outside client answers every snapshot offer as replica "evil" and serves forged bytes
// (the forged warm start): without a fleet key the cold replica takes them; with one it hears
// no signed offer and falls back to the ring (ErrNoPeer). And the outsider cannot download a
// genuine peer's snapshot: its unsigned open request gets no answer.
func TestForgedSnapshotRefused(t *testing.T) {
	tg := kvkey.Target{Worker: "http://w1"}
	for _, keyed := range []bool{false, true} {
		t.Run(map[bool]string{false: "no fleet key", true: "fleet key"}[keyed], func(t *testing.T) {
			srvCfg := embeddedConfig(t, "nats")
			srv := startNode(t, srvCfg)
			keyFile := ""
			if keyed {
				keyFile = writeKey(t, testKey)
			}
			nb := startNode(t, keyedClient(srv, "b", keyFile))
			eventually(t, 5*time.Second, "b connects", nb.Connected)
			b, err := NewSnapshots(nb, &fakeSource{}, prometheus.NewRegistry(), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(b.Close)
			forged := []byte("FORGED SNAPSHOT")
			evil := outsider(t, srvCfg)
			answer := func(subj string, f func(*nats.Msg) []byte) {
				if _, err := evil.Subscribe(subj, func(m *nats.Msg) { _ = m.Respond(f(m)) }); err != nil {
					t.Fatal(err)
				}
			}
			answer(nb.Subject("snap", "offer"), func(*nats.Msg) []byte { return []byte(`{"replica":"evil","seq":99}`) })
			answer(nb.Subject("snap", "evil", "open"), func(*nats.Msg) []byte {
				return []byte(`{"id":"x","seq":99,"bytes":15,"chunks":1}`)
			})
			answer(nb.Subject("snap", "evil", "chunk"), func(*nats.Msg) []byte { return forged })
			if err := evil.Flush(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			got, peer, err := b.FetchSnapshot(ctx, tg)
			t.Logf("cold replica fetched %q from %q (err %v)", got, peer, err)
			if !keyed {
				if err != nil || string(got) != string(forged) || peer != "evil" {
					t.Fatalf("without a key the attack should reproduce: %q from %q, %v", got, peer, err)
				}
				return
			}
			if !errors.Is(err, ErrNoPeer) || got != nil {
				t.Fatalf("with a key: %q from %q, err %v; want ErrNoPeer", got, peer, err)
			}
			if v := counterOf(t, nb.unauth.WithLabelValues("snapshot")); v == 0 {
				t.Fatal("the forged offer was not counted")
			}

			// A genuine peer holding tg: the outsider's unsigned open gets nothing.
			na := startNode(t, keyedClient(srv, "a", keyFile))
			eventually(t, 5*time.Second, "a connects", na.Connected)
			a, err := NewSnapshots(na, &fakeSource{snaps: map[kvkey.Target][]byte{tg: []byte("genuine")}}, prometheus.NewRegistry(), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(a.Close)
			if err := na.Conn().Flush(); err != nil {
				t.Fatal(err)
			}
			req, _ := json.Marshal(snapTarget{Worker: tg.Worker, From: "evil"})
			if m, err := evil.Request(na.Subject("snap", "a", "open"), req, 300*time.Millisecond); err == nil {
				t.Fatalf("an unsigned open was answered: %q", m.Data)
			}
			// The fleet itself still warm-starts from a (the outsider's offers are ignored).
			ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel2()
			if got, peer, err := b.FetchSnapshot(ctx2, tg); err != nil || string(got) != "genuine" || peer != "a" {
				t.Fatalf("b from a: %q from %q, %v", got, peer, err)
			}
		})
	}
}

// An outside client deletes both buckets (with no users on the server it may): every replica
// notices within seconds, is not ready (server.ReadinessCheck) until it recreated them, and a
// pin shared after that is found by the other replica.
func TestDeletedBucketsRecreated(t *testing.T) {
	srvCfg := embeddedConfig(t, "srv")
	startNode(t, srvCfg)
	na := startNode(t, replicaConfig(srvCfg, "a", time.Minute))
	nb := startNode(t, replicaConfig(srvCfg, "b", time.Minute))
	a := startBindings(t, na, BindingsOptions{})
	b := startBindings(t, nb, BindingsOptions{})
	if _, ready, _ := b.Readiness(); !ready {
		t.Fatal("not ready at start")
	}
	evil := outsider(t, srvCfg)
	js, err := jetstream.New(evil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var sawNotReady bool
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // /ready as a load balancer would poll it
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, ready, reason := b.Readiness(); !ready && strings.Contains(reason, "deleted") {
				sawNotReady = true
			}
			time.Sleep(time.Millisecond)
		}
	}()
	for _, what := range []string{"sessions", "pins"} {
		if err := js.DeleteKeyValue(ctx, nb.Bucket(what)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "both buckets back", func() bool {
		for _, what := range []string{"sessions", "pins"} {
			if _, err := js.KeyValue(ctx, nb.Bucket(what)); err != nil {
				return false
			}
		}
		_, ra, _ := a.Readiness()
		_, rb, _ := b.Readiness()
		return ra && rb && a.Ready() && b.Ready()
	})
	close(stop)
	<-done
	if !sawNotReady {
		t.Fatal("the deletion never showed in Readiness")
	}
	if v := counterOf(t, b.opsTotal.WithLabelValues("bucket", "deleted")); v < 1 {
		t.Fatalf("deletions counted %v", v)
	}
	if err := a.SharePin(ctx, "resp_after", wC); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := b.LookupPin(ctx, "resp_after"); err != nil || !ok || got != wC {
		t.Fatalf("pin after recreation: %v %v %v", got, ok, err)
	}
}
