package workers

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/configs"
)

// Membership changes reach the listeners in order; draining and removed workers are not
// routable; a static worker and a discovered one live side by side; kvgate_workers counts
// each state.
func TestMembership(t *testing.T) {
	static := newFake(t)
	cfg := configs.Default()
	cfg.Workers = []configs.Worker{{URL: static.URL, DPSize: 1}}
	cfg.Auth.WorkerAPIKey = "fleet-key"
	reg, err := NewRegistry(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var heard []string
	reg.OnMembership(func(ev MemberEvent) { heard = append(heard, ev.Kind+" "+ev.Worker.URL()) })

	a, b := newFake(t), newFake(t)
	steps := []struct {
		name     string
		do       func() error
		heard    string // the notifications of this step, ";"-joined
		routable []string
	}{
		{"add", func() error { _, err := reg.Add(configs.Worker{URL: a.URL + "/"}, false); return err },
			"added " + a.URL, []string{static.URL, a.URL}},
		{"add draining", func() error { _, err := reg.Add(configs.Worker{URL: b.URL, DPSize: 2}, true); return err },
			"added " + b.URL + ";draining " + b.URL, []string{static.URL, a.URL}},
		{"add twice", func() error {
			if _, err := reg.Add(configs.Worker{URL: a.URL}, false); err == nil {
				t.Error("adding a worker already in the fleet succeeded")
			}
			return nil
		}, "", []string{static.URL, a.URL}},
		{"undrain", func() error { reg.SetDraining(b.URL, false); return nil }, "undrained " + b.URL, []string{static.URL, a.URL, b.URL, b.URL}},
		{"drain", func() error { reg.SetDraining(a.URL, true); return nil }, "draining " + a.URL, []string{static.URL, b.URL, b.URL}},
		{"drain again is no change", func() error { reg.SetDraining(a.URL, true); return nil }, "", []string{static.URL, b.URL, b.URL}},
		{"remove", func() error { reg.Remove(a.URL); return nil }, "removed " + a.URL, []string{static.URL, b.URL, b.URL}},
		{"remove unknown", func() error {
			if reg.Remove(a.URL) || reg.SetDraining(a.URL, false) {
				t.Error("a removed worker is still known")
			}
			return nil
		}, "", []string{static.URL, b.URL, b.URL}},
	}
	for _, st := range steps {
		heard = nil
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := strings.Join(heard, ";"); got != st.heard {
			t.Errorf("%s: heard %q, want %q", st.name, got, st.heard)
		}
		var routable []string
		for _, tl := range reg.Routable() {
			routable = append(routable, tl.Worker)
		}
		if strings.Join(routable, " ") != strings.Join(st.routable, " ") {
			t.Errorf("%s: routable %v, want %v", st.name, routable, st.routable)
		}
	}
	if w := reg.Get(b.URL); w == nil || !w.HasAPIKey() || w.DPSize() != 2 {
		t.Errorf("discovered worker %+v: want the fleet key and dp_size 2", w)
	}

	// A removed worker's probe verdict reaches nobody.
	gone, _ := reg.Add(configs.Worker{URL: "http://127.0.0.1:9"}, false)
	var changes atomic.Int32 // probes run concurrently
	reg.OnChange(func(*Worker, string) { changes.Add(1) })
	reg.Remove(gone.URL())
	reg.ProbeAll(context.Background())
	if n := changes.Load(); n != 2 { // the static worker's and b's admissions, not the removed one's
		t.Errorf("%d probe changes heard, want 2", n)
	}

	reg.SetDraining(b.URL, true)
	prom := prometheus.NewRegistry()
	prom.MustRegister(reg.Collector())
	mfs, err := prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, m := range mfs[0].GetMetric() {
		got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
	}
	want := map[string]float64{StateHealthy: 1, StateDraining: 1, StateUnknown: 0, StateEjected: 0}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("kvgate_workers{state=%s} = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}
