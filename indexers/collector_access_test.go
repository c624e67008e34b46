package indexers

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/kvkey"
)

// A forged publisher on the collector: it connects from a second loopback address
// (127.0.0.2, bound as the connection's source) and sends the next batch under a real worker's
// topic (the attack of reading kvgate_kv_last_seq and publishing seq+1). Without access
// control the batch is applied; with the default (only the workers' addresses may connect)
// the ZAP handler refuses the connection; with 127.0.0.2 allowed to connect, the message is
// still dropped because its sender is not the topic's worker. The genuine stream goes on
// either way.
func TestCollectorForgedPublisher(t *testing.T) {
	tests := []struct {
		name   string
		access *CollectorAccess
		// forged: the forged batch is applied (the attack works).
		forged  bool
		refused bool // counted as a refused connection (else as a wrong sender)
	}{
		{name: "no access control (the attack)", access: nil, forged: true},
		{name: "default: the workers' addresses", access: &CollectorAccess{MatchSender: true}, refused: true},
		{name: "allowed to connect, wrong sender", access: &CollectorAccess{MatchSender: true,
			Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rig := newLiveRig(t)
			port := freePort(t)
			listen := fmt.Sprintf("tcp://127.0.0.1:%d", port)
			tg := kvkey.Target{Worker: "http://127.0.0.1:8000"}
			topic := "kv@127.0.0.1:8000@m"
			sc := newScenario(t, 41, 12, LayoutMap)
			evilSc := newScenario(t, 42, 3, LayoutMap)
			p := newTestPubTo(t, rig.m.zctx, topic, 100, ReplayWithTopic, listen)
			cfg := CollectorConfig{Listen: listen, Access: tc.access,
				Targets: []SubscriberConfig{{Target: tg, Topic: topic, ReplayEndpoint: p.repEP, ReplayTimeout: time.Second}}}
			if err := rig.m.StartCollector(rig.ctx, cfg); err != nil {
				t.Fatal(err)
			}
			s := rig.sub(tg)
			for _, pl := range sc.payloads[:10] {
				p.publish(pl, false) // what the SUB misses while connecting, the ring replays
			}
			waitSeq(t, s, 9)
			sent := uint64(9)

			// The forger: a PUB whose connection leaves from 127.0.0.2.
			evil := newTestPubTo(t, rig.m.zctx, topic, 10, ReplayWithTopic, fmt.Sprintf("tcp://127.0.0.2:0;127.0.0.1:%d", port))
			waitFor(t, "the forged batch applied, refused or dropped", func() bool {
				evil.raw([]byte(topic), SeqFrame(sent+1), evilSc.payloads[0])
				time.Sleep(20 * time.Millisecond)
				c := rig.m.Collectors()[0]
				return s.stats.lastSeq.Load() == sent+1 || c.RefusedConnections > 0 || c.WrongSender > 0
			})
			time.Sleep(100 * time.Millisecond)
			c := rig.m.Collectors()[0]
			applied := s.stats.lastSeq.Load() == sent+1
			t.Logf("forged batch applied: %v; refused connections %d, wrong-sender messages %d", applied, c.RefusedConnections, c.WrongSender)
			if applied != tc.forged {
				t.Fatalf("forged batch applied: %v, want %v (collector %+v)", applied, tc.forged, c)
			}
			if tc.forged {
				return
			}
			if tc.refused && c.RefusedConnections == 0 || !tc.refused && (c.WrongSender == 0 || c.RefusedConnections != 0) {
				t.Fatalf("refused connections %d, wrong-sender messages %d", c.RefusedConnections, c.WrongSender)
			}
			reg := prometheus.NewRegistry()
			if err := rig.m.Register(reg); err != nil {
				t.Fatal(err)
			}
			if tc.refused {
				if v := sampleValue(t, reg, "kvgate_kv_collector_refused_connections_total", "", ""); v < 1 {
					t.Fatalf("kvgate_kv_collector_refused_connections_total %v", v)
				}
			} else if v := sampleValue(t, reg, "kvgate_kv_collector_unknown_messages_total", "cause", "sender"); v < 1 {
				t.Fatalf("kvgate_kv_collector_unknown_messages_total{cause=sender} %v", v)
			}
			// The genuine stream goes on, and the index is exactly the genuine one.
			for _, pl := range sc.payloads[10:] {
				p.publish(pl, false)
			}
			waitSeq(t, s, len(sc.payloads)-1)
			if !reflect.DeepEqual(dumpTarget(rig.ix, tg), sc.groundTruth(t, tg, 0, len(sc.payloads))) {
				t.Fatal("the index differs from the genuine stream")
			}
		})
	}
}

// CURVE: with a server key the collector takes only CURVE publishers whose public key is
// listed; a NULL publisher and one with another key are refused.
func TestCollectorCurve(t *testing.T) {
	srvPub, srvSec, err := zmq.NewCurveKeypair()
	if err != nil {
		t.Skipf("libzmq without CURVE: %v", err)
	}
	cliPub, cliSec, _ := zmq.NewCurveKeypair()
	otherPub, otherSec, _ := zmq.NewCurveKeypair()
	rig := newLiveRig(t)
	listen := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	tg := kvkey.Target{Worker: "http://127.0.0.1:8000"}
	cfg := CollectorConfig{Listen: listen, Access: &CollectorAccess{MatchSender: true, CurveSecretKey: srvSec, CurveClientKeys: []string{cliPub}},
		Targets: []SubscriberConfig{{Target: tg, Topic: "t"}}}
	if err := rig.m.StartCollector(rig.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	s := rig.sub(tg)
	sc := newScenario(t, 43, 2, LayoutMap)
	pubWith := func(pub, sec string) *zmq.Socket {
		sock, err := rig.m.zctx.NewSocket(zmq.PUB)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sock.Close() })
		_ = sock.SetLinger(0)
		if pub != "" {
			if err := sock.ClientAuthCurve(srvPub, pub, sec); err != nil {
				t.Fatal(err)
			}
		}
		if err := sock.Connect(listen); err != nil {
			t.Fatal(err)
		}
		return sock
	}
	// A NULL publisher fails the mechanism handshake itself (libzmq never asks ZAP).
	null := pubWith("", "")
	for range 15 {
		_, _ = null.SendMessage("t", SeqFrame(0), sc.payloads[0])
		time.Sleep(20 * time.Millisecond)
	}
	if s.stats.haveSeq.Load() {
		t.Fatal("a NULL publisher's batch was applied")
	}
	other := pubWith(otherPub, otherSec)
	waitFor(t, "a publisher with an unlisted key refused", func() bool {
		_, _ = other.SendMessage("t", SeqFrame(0), sc.payloads[0])
		time.Sleep(20 * time.Millisecond)
		return rig.m.Collectors()[0].RefusedConnections > 0
	})
	if s.stats.haveSeq.Load() {
		t.Fatal("a refused publisher's batch was applied")
	}
	good := pubWith(cliPub, cliSec)
	waitFor(t, "the listed CURVE publisher's batch", func() bool {
		_, _ = good.SendMessage("t", SeqFrame(0), sc.payloads[0])
		time.Sleep(20 * time.Millisecond)
		return s.stats.haveSeq.Load()
	})
}

// The ZAP handler answers per RFC 27 and refuses malformed requests.
func TestZAPAnswer(t *testing.T) {
	g := newCollectorGuard(CollectorAccess{Allow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, "d", nil, quietLog())
	h := &zapHandler{guards: map[string]*collectorGuard{"d": g}, log: quietLog()}
	req := func(domain, addr, mech string) [][]byte {
		return [][]byte{[]byte("1.0"), []byte("id"), []byte(domain), []byte(addr), {}, []byte(mech)}
	}
	tests := []struct {
		name string
		req  [][]byte
		code string
	}{
		{"allowed", req("d", "10.1.2.3", "NULL"), "200"},
		{"outside the CIDRs", req("d", "192.168.0.1", "NULL"), "400"},
		{"unknown domain", req("x", "10.1.2.3", "NULL"), "400"},
		{"PLAIN", req("d", "10.1.2.3", "PLAIN"), "400"},
		{"CURVE without a key configured", req("d", "10.1.2.3", "CURVE"), "400"},
		{"malformed", [][]byte{[]byte("1.0")}, "500"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(h.answer(tc.req)[2]); got != tc.code {
				t.Fatalf("status %s, want %s", got, tc.code)
			}
		})
	}
}
