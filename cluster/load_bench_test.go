package cluster

import (
	"context"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvgate/kvgate/cluster/clusterconfig"
	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/sessions"
)

// depthMatcher answers every match with a fixed per-target overlap (the matcher is the same
// on both sides of the comparison, so it only has to be realistic in shape).
type depthMatcher map[kvkey.Target]indexers.TierMatch

func (m depthMatcher) MatchTiers(_ []kvkey.BlockHash, targets []kvkey.Target, out []indexers.TierMatch) {
	for i, t := range targets {
		out[i] = m[t]
	}
}

// BenchmarkKVDecisionCluster measures the routing overhead of the cluster: one request routed
// through the Dispatcher (Route, the hold table's claim, the Lifecycle to Done) under the kv
// policy, for a 2,048-block prompt over 64 targets with 4 own requests in flight on each, by
// two dispatchers in the same loop, alternating: "off" is one replica, "on" has the load sync
// running against an embedded NATS server (two peers with load on every target, every
// Begin/FirstToken/Done published as deltas, snapshots every 100 ms). Alternating keeps the
// two comparable on a shared machine. Reports p50 and p99 per decision of each (wall, and the
// thread's CPU time, which leaves out time spent descheduled). Run with make bench-router.
func BenchmarkKVDecisionCluster(b *testing.B) { benchKVDecisionCluster(b, false) }

// BenchmarkKVDecisionClusterAll is BenchmarkKVDecisionCluster with everything the cluster
// shares wired as cmd/kvgate wires it: both dispatchers track sessions (256 sessions, one
// request in four a subagent of another), and "on" also has the session bindings
// (cluster.Bindings as the tracker's SharedBindings, with its per-turn Sync, Routed and
// Released) and the shared Responses pins (DispatcherOptions.SharedPins).
func BenchmarkKVDecisionClusterAll(b *testing.B) { benchKVDecisionCluster(b, true) }

func benchKVDecisionCluster(b *testing.B, all bool) {
	const nTargets, nBlocks, nSessions = 64, 2048, 256
	targets := make([]kvkey.Target, nTargets)
	cands := make([]router.Candidate, nTargets)
	m := depthMatcher{}
	for i := range targets {
		targets[i] = kvkey.Target{Worker: "http://127.0.0.1:" + strconv.Itoa(8100+i)}
		cands[i] = router.Candidate{Target: targets[i]}
		m[targets[i]] = indexers.TierMatch{G1: 512 + i*24, G2: 88}
	}
	prompt := make([]kvkey.BlockHash, nBlocks)
	for i := range prompt {
		prompt[i] = kvkey.BlockHash(0x9e3779b97f4a7c15 * uint64(i+1))
	}
	cfg := clusterconfig.Default()
	cfg.ReplicaID = "bench-nats"
	cfg.EmbeddedNATS.Listen = benchListen(b)
	cfg.EmbeddedNATS.StoreDir = b.TempDir()
	server := startNodeB(b, cfg)
	sync := func(id string) *LoadSync {
		n := startNodeB(b, clientConfig(server, id, 100*time.Millisecond, 3*time.Second))
		ls, err := StartLoadSync(context.Background(), n, LoadSyncOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(ls.Close)
		return ls
	}
	own := sync("bench-own")
	for _, id := range []string{"bench-peer-1", "bench-peer-2"} {
		peer := sync(id)
		for _, t := range targets {
			peer.LoadDelta(t, router.LoadVector{Requests: 3, PrefillRequests: 1, PrefillTokens: 4096, Blocks: 700,
				AheadTokens: 4096, AheadPairs: 1 << 24, Decodes: 2, DecodeKV: 16384})
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for own.Peers().Len() < 2 || own.Peers().Sum(targets[nTargets-1]).Requests != 6 {
		if time.Now().After(deadline) {
			b.Fatalf("peers' load not seen: %d peers", own.Peers().Len())
		}
		time.Sleep(5 * time.Millisecond)
	}
	var offSess, onSess *sessions.Tracker
	var pins router.SharedPins
	if all {
		offSess, onSess = benchTracker(b), benchTracker(b)
		bn := startNodeB(b, clientConfig(server, "bench-own-bindings", 100*time.Millisecond, 3*time.Second))
		bs, err := NewBindings(bn, BindingsOptions{})
		if err != nil {
			b.Fatal(err)
		}
		bs.Start(context.Background())
		b.Cleanup(bs.Close)
		for deadline := time.Now().Add(5 * time.Second); !bs.Ready() || bs.Behind(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatal("bindings not ready")
			}
		}
		onSess.SetShared(bs)
		pins = bs
	}
	off := benchDispatcher(b, m, targets, prompt, nil, offSess, nil)
	on := benchDispatcher(b, m, targets, prompt, own, onSess, pins)
	reqs := []*router.Request{{Model: "m", PromptTokens: len(prompt) * 16, BlockSize: 16, BlockHashes: prompt, Stream: true}}
	if all {
		reqs = reqs[:0]
		for i := range nSessions {
			r := &router.Request{Model: "m", PromptTokens: len(prompt) * 16, BlockSize: 16, BlockHashes: prompt, Stream: true,
				SessionID: "bench-session-" + strconv.Itoa(i)}
			if i%4 == 3 {
				r.ParentSessionID = "bench-session-" + strconv.Itoa(i-3)
			}
			reqs = append(reqs, r)
		}
	}
	ctx := context.Background()
	var wall, cpu [2][]time.Duration
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		k := i % 2
		e := off
		if k == 1 {
			e = on
		}
		req := reqs[(i/2)%len(reqs)]
		c0 := threadCPU()
		start := time.Now()
		end := e.Start(req)
		_, lc, err := e.Route(ctx, req, cands)
		if err != nil {
			b.Fatal(err)
		}
		lc.Sent()
		lc.FirstToken()
		lc.Done()
		end()
		wall[k] = append(wall[k], time.Since(start))
		cpu[k] = append(cpu[k], threadCPU()-c0)
	}
	b.StopTimer()
	for k, name := range []string{"off", "on"} {
		if len(wall[k]) == 0 {
			continue
		}
		slices.Sort(wall[k])
		slices.Sort(cpu[k])
		n := len(wall[k])
		b.ReportMetric(float64(wall[k][n/2].Nanoseconds()), name+"-p50-ns")
		b.ReportMetric(float64(wall[k][n*99/100].Nanoseconds()), name+"-p99-ns")
		b.ReportMetric(float64(cpu[k][n/2].Nanoseconds()), name+"-cpu-p50-ns")
		b.ReportMetric(float64(cpu[k][n*99/100].Nanoseconds()), name+"-cpu-p99-ns")
	}
}

// benchTracker is a session tracker with the default configuration and no index.
func benchTracker(b *testing.B) *sessions.Tracker {
	t, err := sessions.New(sessions.Defaults(), nil, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	return t
}

// benchDispatcher is a kv Dispatcher over m with 4 requests of its own in flight on every
// target and fresh worker metrics, sharing its load through ls (nil: not clustered), tracking
// sessions in st (nil: none) and sharing pins through pins (nil: not shared).
func benchDispatcher(b *testing.B, m indexers.Matcher, targets []kvkey.Target, prompt []kvkey.BlockHash, ls *LoadSync,
	st *sessions.Tracker, pins router.SharedPins) *router.Dispatcher {
	deps := router.KVDeps{Matcher: m}
	if st != nil {
		deps.Hints = st
	}
	p, err := router.NewKV(router.DefaultKVConfig(), deps)
	if err != nil {
		b.Fatal(err)
	}
	e, err := router.NewDispatcher(router.DispatcherOptions{KV: p, Sessions: st, SharedPins: pins})
	if err != nil {
		b.Fatal(err)
	}
	if ls != nil {
		e.SetFleet(ls.Fleet())
	}
	now := time.Now()
	for i, t := range targets {
		for j := range 4 {
			active := slices.Clone(prompt[:512])
			for k := range 512 {
				active = append(active, kvkey.BlockHash(uint64(1000+i*4+j)<<32|uint64(k)))
			}
			h := p.Load().Begin(t, &router.Request{PromptTokens: len(active) * 16, BlockSize: 16, BlockHashes: active}, 512)
			if j%2 == 0 {
				h.FirstToken()
			}
		}
		p.Load().UpdateMetrics(t, router.WorkerMetrics{Running: 4, Waiting: float64(i % 3), KVUsage: 0.5, NumGPUBlocks: 8192, At: now})
	}
	return e
}

// benchListen is a free loopback address for the benchmark's embedded server.
func benchListen(b *testing.B) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startNodeB starts a node for a benchmark and waits until it is connected.
func startNodeB(b *testing.B, c clusterconfig.Config) *Node {
	b.Helper()
	n, err := Start(context.Background(), c, Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(n.Close)
	deadline := time.Now().Add(5 * time.Second)
	for !n.Connected() {
		if time.Now().After(deadline) {
			b.Fatal("node not connected")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return n
}

// threadCPU is the calling OS thread's CPU time (the goroutine is locked to its thread).
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
