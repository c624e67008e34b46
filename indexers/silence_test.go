package indexers

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/kvkey"
)

func TestSilentSince(t *testing.T) {
	const s = int64(time.Second)
	cases := []struct {
		name                                 string
		started, firstRouted, lastEvent, now int64
		want                                 bool
	}{
		{"idle worker: nothing routed", 1 * s, 0, 0, 100 * s, false},
		{"routed, silent 30s", 1 * s, 2 * s, 0, 32 * s, true},
		{"routed, silent 29s", 1 * s, 2 * s, 0, 31 * s, false},
		{"events arrived", 1 * s, 2 * s, 3 * s, 100 * s, false},
		{"routed before the subscription started: counted from its start", 50 * s, 2 * s, 0, 79 * s, false},
		{"routed before the subscription started, 30s after it", 50 * s, 2 * s, 0, 80 * s, true},
	}
	for _, tc := range cases {
		if got := silentSince(tc.started, tc.firstRouted, tc.lastEvent, tc.now, 30*time.Second); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A subscription to a port nobody binds (a worker whose --kv-events-config endpoint is
// tcp://HOST:PORT publishes by connecting out) hears nothing: once prompts are routed to its
// worker it is reported silent after SilenceAfter: a warning naming the cause, the
// kvgate_kv_events_silent gauge and a readiness reason naming no worker. A subscription whose
// worker got no prompt stays ready.
func TestSilentSubscription(t *testing.T) {
	ix := NewIndex(Options{BlockSize: 4})
	var log lockedBuf
	m, err := NewSubscribers(ix, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	reg := prometheus.NewPedanticRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	busy, idle := kvkey.Target{Worker: "http://busy:8000"}, kvkey.Target{Worker: "http://idle:8000"}
	for _, tg := range []kvkey.Target{busy, idle} {
		cfg := SubscriberConfig{Target: tg, Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t)), SilenceAfter: 300 * time.Millisecond}
		if err := m.Start(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if _, ready, _ := m.Readiness(); !ready {
		t.Fatal("not ready before anything was routed")
	}
	ix.NoteRouted(busy, []uint64{1}, []kvkey.BlockHash{1})
	waitFor(t, "the silent mark", func() bool { _, ready, _ := m.Readiness(); return !ready })
	name, _, reason := m.Readiness()
	if name != "kv_events" || !strings.Contains(reason, "1 KV-event subscription") || !strings.Contains(reason, "tcp://*:PORT") ||
		strings.Contains(reason, "busy") || strings.Contains(reason, "127.0.0.1") {
		t.Errorf("readiness %q: %q", name, reason)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_kv_events_silent" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == "worker" {
					got[lp.GetValue()] = mt.GetGauge().GetValue()
				}
			}
		}
	}
	if got[busy.Worker] != 1 || got[idle.Worker] != 0 || len(got) != 2 {
		t.Errorf("kvgate_kv_events_silent %v", got)
	}
	l := log.String()
	if n := strings.Count(l, "subscription silent"); n != 1 || !strings.Contains(l, "tcp://*:PORT") || !strings.Contains(l, "kv_events.listen") {
		t.Errorf("%d warnings; log:\n%s", n, l)
	}
}
