package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/kubefake"
)

// TestDiscoveryChurnSoak is a soak, not part of `make test`: it runs only with
// KVGATE_SOAK_MINUTES set. A fake Kubernetes API lists KVGATE_SOAK_ENDPOINTS endpoints
// (default 500, in slices of 50, every one with http, kv-events and kv-replay ports on a
// loopback address where nothing listens: probes fail, ZMQ keeps reconnecting, exactly the
// sockets and goroutines a dead fleet costs) and replaces KVGATE_SOAK_PER_MINUTE of them
// (default 50) every minute: each is first marked terminating, then removed as its
// replacement appears. Each minute it logs goroutines, open fds, the live heap (after a GC)
// and the worker label values on /metrics; at the end the fleet must match the slices and
// every per-worker series must belong to a live worker.
//
//	KVGATE_SOAK_MINUTES=10 go test ./cmd/kvgate/ -run TestDiscoveryChurnSoak -v -timeout 40m
func TestDiscoveryChurnSoak(t *testing.T) {
	minutes, _ := strconv.Atoi(os.Getenv("KVGATE_SOAK_MINUTES"))
	if minutes <= 0 {
		t.Skip("a soak: set KVGATE_SOAK_MINUTES to run it")
	}
	endpoints, perMinute := envInt("KVGATE_SOAK_ENDPOINTS", 500), envInt("KVGATE_SOAK_PER_MINUTE", 50)
	needModel(t)
	api := kubefake.New("llm", "vllm")
	t.Cleanup(api.Shutdown)
	const perSlice = 50
	ports := map[string]int32{"http": 9, "kv-events": 9, "kv-replay": 9} // discard port: refused on loopback
	next := 0
	addr := func() string { next++; return fmt.Sprintf("127.1.%d.%d", next/250, next%250+1) }
	slices := make([][]string, (endpoints+perSlice-1)/perSlice)
	for i := range endpoints {
		slices[i/perSlice] = append(slices[i/perSlice], addr())
	}
	put := func(i int, terminating string) {
		sl := kubefake.Slice{Name: fmt.Sprintf("vllm-%02d", i), Ports: ports}
		for _, a := range slices[i] {
			ep := kubefake.Endpoint{Addresses: []string{a}, Ready: kubefake.Bool(a != terminating)}
			if a == terminating {
				ep.Terminating = kubefake.Bool(true)
			}
			sl.Endpoints = append(sl.Endpoints, ep)
		}
		api.Put(sl)
	}
	for i := range slices {
		put(i, "")
	}
	g := startDiscoveredGateway(t, api, nil)
	deadline := time.Now().Add(time.Minute)
	for g.reg.Len() != endpoints {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers after a minute, want %d", g.reg.Len(), endpoints)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(20 * time.Second) // probes, scrapes and subscriptions reach their steady state
	sample := func(label string) soakSample {
		s := takeSoakSample(t, g)
		t.Logf("%-9s goroutines %5d  fds %5d  heap live %5.1f MiB (in use %5.1f)  workers %d  worker label values %d (stale %d)",
			label, s.goroutines, s.fds, float64(s.live)/(1<<20), float64(s.heap)/(1<<20), s.workers, s.labelled, s.stale)
		return s
	}
	base := sample("baseline")
	heapProfile(t, "baseline")
	tick := time.Minute / time.Duration(perMinute*2) // mark terminating, then replace
	end := time.Now().Add(time.Duration(minutes) * time.Minute)
	nextSample := time.Now().Add(time.Minute)
	replaced, minute := 0, 0
	for time.Now().Before(end) {
		i := replaced % len(slices)
		j := (replaced / len(slices)) % len(slices[i])
		put(i, slices[i][j])
		time.Sleep(tick)
		slices[i][j] = addr()
		put(i, "")
		replaced++
		time.Sleep(tick)
		if time.Now().After(nextSample) {
			minute++
			sample(fmt.Sprintf("minute %d", minute))
			nextSample = nextSample.Add(time.Minute)
		}
	}
	time.Sleep(20 * time.Second) // the last removals' in-flight probes and subscriptions wind down
	final := sample("final")
	heapProfile(t, "final")
	t.Logf("replaced %d endpoints in %d minutes", replaced, minutes)
	if final.workers != endpoints {
		t.Errorf("%d workers at the end, want %d", final.workers, endpoints)
	}
	if final.stale != 0 {
		t.Errorf("%d worker label values on /metrics belong to removed workers", final.stale)
	}
	// Flat: within 10% of the baseline taken before any churn, plus a small absolute slack (the
	// probes and scrapes in flight at the sample; the fake API's bounded watch history).
	for _, c := range []struct {
		name               string
		base, final, slack int
	}{{"goroutines", base.goroutines, final.goroutines, 20}, {"fds", base.fds, final.fds, 20},
		{"live heap KiB", int(base.live >> 10), int(final.live >> 10), 4096}} {
		if float64(c.final) > float64(c.base)*1.1+float64(c.slack) {
			t.Errorf("%s grew from %d to %d over the churn", c.name, c.base, c.final)
		}
	}
}

type soakSample struct {
	goroutines, fds int
	heap, live      uint64 // HeapInuse and HeapAlloc after a GC
	workers         int
	labelled, stale int // distinct worker label values on /metrics; those of no live worker
}

func takeSoakSample(t *testing.T, g *discoveredGateway) soakSample {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fds, _ := os.ReadDir("/proc/self/fd")
	s := soakSample{goroutines: runtime.NumGoroutine(), fds: len(fds), heap: ms.HeapInuse, live: ms.HeapAlloc, workers: g.reg.Len()}
	families, err := g.prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "worker" {
					seen[l.GetValue()] = true
				}
			}
		}
	}
	for v := range seen {
		s.labelled++
		if g.reg.Get(v) == nil && g.reg.Get(trimRank(v)) == nil {
			s.stale++
		}
	}
	return s
}

// trimRank turns a target label ("url#rank") into its worker URL.
func trimRank(v string) string {
	for i := len(v) - 1; i >= 0; i-- {
		if v[i] == '#' {
			return v[:i]
		}
	}
	return v
}

// heapProfile writes a heap profile to $KVGATE_SOAK_PROFILE_DIR/heap-<label>.pb.gz when that
// is set (compare with go tool pprof -base).
func heapProfile(t *testing.T, label string) {
	dir := os.Getenv("KVGATE_SOAK_PROFILE_DIR")
	if dir == "" {
		return
	}
	f, err := os.Create(filepath.Join(dir, "heap-"+label+".pb.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		t.Fatal(err)
	}
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}
