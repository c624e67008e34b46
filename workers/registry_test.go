package workers

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/kvkey"
)

// fakeWorker answers /health with a switchable status and /v1/models with one model.
type fakeWorker struct {
	*httptest.Server
	status atomic.Int32
	probes atomic.Int32
	extra  atomic.Pointer[string] // a further card, as a runtime-loaded adapter adds one
}

func newFake(t *testing.T) *fakeWorker {
	f := &fakeWorker{}
	f.status.Store(http.StatusOK)
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			f.probes.Add(1)
			w.WriteHeader(int(f.status.Load()))
		case "/v1/models":
			extra := ""
			if id := f.extra.Load(); id != nil {
				extra = `,{"id":"` + *id + `","object":"model","parent":"base"}`
			}
			_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"base","object":"model","max_model_len":4096},{"id":"lora-a","object":"model","parent":"base"}` + extra + `]}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.Close)
	return f
}

func testConfig(urls ...string) configs.Config {
	c := configs.Default()
	c.Model = "base"
	for _, u := range urls {
		c.Workers = append(c.Workers, configs.Worker{URL: u, DPSize: 1})
	}
	c.Health.FailureThreshold = 2
	c.Health.SuccessThreshold = 2
	c.Health.Timeout = configs.Duration(time.Second)
	return c
}

func TestEjectionAndReadmission(t *testing.T) {
	f := newFake(t)
	reg, err := NewRegistry(testConfig(f.URL), nil)
	if err != nil {
		t.Fatal(err)
	}
	w := reg.Workers()[0]
	var changes []string
	reg.OnChange(func(cw *Worker, change string) {
		if cw != w {
			t.Errorf("change reported for %s", cw.URL())
		}
		changes = append(changes, change)
	})
	ctx := context.Background()
	steps := []struct {
		name     string
		status   int
		routable bool
		state    string
		change   string // what OnChange hears ("" = nothing)
	}{
		{"first probe admits", 200, true, "healthy", ChangeAdmitted},
		{"one failure is tolerated", 503, true, "healthy", ""},
		{"second consecutive failure ejects", 500, false, "ejected", ChangeEjected},
		{"still failing", 503, false, "ejected", ""},
		{"one success is not enough", 200, false, "ejected", ""},
		{"second success readmits", 200, true, "healthy", ChangeReadmitted},
		{"streak restarted after readmission", 503, true, "healthy", ""},
		{"success clears the streak", 200, true, "healthy", ""},
		{"single failure again tolerated", 503, true, "healthy", ""},
	}
	for _, s := range steps {
		f.status.Store(int32(s.status))
		changes = nil
		reg.ProbeAll(ctx)
		st := w.Status()
		if w.Routable() != s.routable || st.State != s.state {
			t.Fatalf("%s: routable=%v state=%s, want %v %s (status %+v)", s.name, w.Routable(), st.State, s.routable, s.state, st)
		}
		if got := strings.Join(changes, ","); got != s.change {
			t.Fatalf("%s: OnChange heard %q, want %q", s.name, got, s.change)
		}
	}
	if got := w.Status().Ejections; got != 1 {
		t.Errorf("ejections = %d, want 1", got)
	}
	if got := reg.Models(); len(got) != 2 || got[1] != "lora-a" {
		t.Errorf("models = %v, want base and lora-a from /v1/models", got)
	}
	for model, want := range map[string]int{"base": 4096, "": 4096, "lora-a": 0, "other": 0} {
		if got := reg.MaxModelLen(model); got != want {
			t.Errorf("MaxModelLen(%q) = %d, want %d", model, got, want)
		}
	}
}

func TestUnprobedWorkerEjectedOnFirstFailure(t *testing.T) {
	f := newFake(t)
	f.Close() // connection refused
	reg, err := NewRegistry(testConfig(f.URL), nil)
	if err != nil {
		t.Fatal(err)
	}
	if reg.RoutableCount() != 1 {
		t.Fatal("an unprobed worker must be routable")
	}
	reg.ProbeAll(context.Background())
	if reg.RoutableCount() != 0 {
		t.Fatalf("a worker that never answered must be ejected at once: %+v", reg.Workers()[0].Status())
	}
	if reg.Workers()[0].Status().LastError == "" {
		t.Error("no reason recorded")
	}
}

func TestPassiveFailuresEject(t *testing.T) {
	f := newFake(t)
	reg, _ := NewRegistry(testConfig(f.URL), nil)
	reg.ProbeAll(context.Background())
	w := reg.Workers()[0]
	w.ReportFailure(errors.New("connection refused"))
	w.ReportSuccess()
	w.ReportFailure(errors.New("connection refused"))
	if !w.Routable() {
		t.Fatal("a success between failures must reset the streak")
	}
	w.ReportFailure(errors.New("connection reset"))
	if w.Routable() {
		t.Fatal("two consecutive proxy failures must eject")
	}
}

func TestAcquireReleaseBalanced(t *testing.T) {
	c := testConfig("http://127.0.0.1:1")
	c.Workers[0].DPSize = 2
	reg, _ := NewRegistry(c, nil)
	w := reg.Workers()[0]
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			release := w.Acquire(i % 2)
			defer release()
			release() // double release must not double count
		})
	}
	wg.Wait()
	if w.InFlight(0) != 0 || w.InFlight(1) != 0 {
		t.Fatalf("in flight = %d/%d after all releases", w.InFlight(0), w.InFlight(1))
	}
	r1 := w.Acquire(1)
	if w.InFlight(1) != 1 || w.InFlight(0) != 0 {
		t.Fatal("acquire counted on the wrong rank")
	}
	r1()
}

func TestRoutableTargetsOrder(t *testing.T) {
	c := testConfig("http://127.0.0.1:1", "http://127.0.0.1:2")
	c.Workers[1].DPSize = 2
	reg, _ := NewRegistry(c, nil)
	release := reg.Get("http://127.0.0.1:2").Acquire(1)
	defer release()
	got := reg.Routable()
	want := []TargetLoad{
		{kvkey.Target{Worker: "http://127.0.0.1:1", DPRank: 0}, 0},
		{kvkey.Target{Worker: "http://127.0.0.1:2", DPRank: 0}, 0},
		{kvkey.Target{Worker: "http://127.0.0.1:2", DPRank: 1}, 1},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("target %d = %v, want %v", i, got[i], want[i])
		}
	}
	if e := reg.Get("http://127.0.0.1:2").Endpoint("/v1/chat/completions", "a=1"); e != "http://127.0.0.1:2/v1/chat/completions?a=1" {
		t.Errorf("endpoint = %s", e)
	}
}

func TestRunProbesPeriodically(t *testing.T) {
	f := newFake(t)
	c := testConfig(f.URL)
	c.Health.Interval = configs.Duration(10 * time.Millisecond)
	reg, _ := NewRegistry(c, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { reg.Run(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for f.probes.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if f.probes.Load() < 3 {
		t.Fatalf("only %d probes", f.probes.Load())
	}
}

// An adapter a worker lists after its admission (loaded at runtime) is known after the next
// healthy probe, with no state change.
func TestModelsRefreshedByProbes(t *testing.T) {
	f := newFake(t)
	c := testConfig(f.URL)
	c.Health.SuccessThreshold = 1
	reg, err := NewRegistry(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	reg.ProbeAll(ctx)
	if got := strings.Join(reg.Models(), ","); got != "base,lora-a" {
		t.Fatalf("models %s", got)
	}
	id := "runtime-lora"
	f.extra.Store(&id)
	var changes []string
	reg.OnChange(func(_ *Worker, change string) { changes = append(changes, change) })
	reg.ProbeAll(ctx)
	if got := strings.Join(reg.Models(), ","); got != "base,lora-a,runtime-lora" || len(changes) != 0 {
		t.Errorf("models %s, changes %v; want the runtime adapter and no change", got, changes)
	}
}
