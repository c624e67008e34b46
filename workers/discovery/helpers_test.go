package discovery

import (
	"bytes"
	"context"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/workers"
)

// lockedBuffer is a log sink safe for the source's goroutine and the test's reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// fixture is an empty discovered fleet with its metrics and log.
type fixture struct {
	reg  *workers.Registry
	m    *Metrics
	log  *lockedBuffer
	opts Options
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	cfg := configs.Default()
	cfg.Discovery.DNS.Name = "vllm" // any source: lets the registry start empty
	reg, err := workers.NewRegistry(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	lb := &lockedBuffer{}
	return &fixture{reg: reg, m: m, log: lb, opts: Options{Metrics: m, Log: slog.New(slog.NewTextHandler(lb, nil)),
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}}
}

// run starts src until the test ends.
func run(t *testing.T, src Source) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); src.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// fleet describes the registry: each worker's URL with " draining" when it is.
func (f *fixture) fleet() []string {
	var out []string
	for _, w := range f.reg.Workers() {
		s := w.URL()
		if w.Draining() {
			s += " draining"
		}
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

func (f *fixture) events(source, typ string) float64 {
	return counterValue(f.m.events.WithLabelValues(source, typ))
}

func (f *fixture) errors(source, reason string) float64 {
	return counterValue(f.m.errors.WithLabelValues(source, reason))
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// eventually polls cond every 10 ms for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
