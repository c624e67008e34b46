package router

import (
	"context"
	"math/bits"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvgate/kvgate/confval"
	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/tokenize"
)

// tierIndex is a plain linear-walk tiered block index (per block: the set of targets holding
// it in each tier, as bitsets; one walk of the prompt answers all targets, G2 extending G1 and
// G3 extending G2, docs/ARCHITECTURE.md "The tiered index"). The decision benchmark runs it beside the real
// indexers.Index as a worst-case matcher (no bisection: every block of the prompt is looked up).
type tierIndex struct {
	pos    map[kvkey.Target]int
	blocks map[kvkey.BlockHash]*tierEntry
}

type tierEntry struct{ g [3]uint64 } // bit per target position, ≤ 64 targets

func newTierIndex(targets []kvkey.Target) *tierIndex {
	ix := &tierIndex{pos: map[kvkey.Target]int{}, blocks: map[kvkey.BlockHash]*tierEntry{}}
	for i, t := range targets {
		ix.pos[t] = i
	}
	return ix
}

func (ix *tierIndex) store(t kvkey.Target, tier int, hashes []kvkey.BlockHash) {
	bit := uint64(1) << ix.pos[t]
	for _, h := range hashes {
		e := ix.blocks[h]
		if e == nil {
			e = &tierEntry{}
			ix.blocks[h] = e
		}
		e.g[tier] |= bit
	}
}

func (ix *tierIndex) MatchTiers(hashes []kvkey.BlockHash, targets []kvkey.Target, out []indexers.TierMatch) {
	var start, count [3][64]int32 // per tier and target bit: where its run began, its length
	var alive [3]uint64           // targets whose run continues in tier k
	if len(hashes) > 0 {
		if e := ix.blocks[hashes[0]]; e != nil {
			// A target starts in the highest tier holding block 0.
			alive[0] = e.g[0]
			alive[1] = e.g[1] &^ e.g[0]
			alive[2] = e.g[2] &^ e.g[1] &^ e.g[0]
		}
	}
	n := len(hashes)
	for i := 1; i < n && alive[0]|alive[1]|alive[2] != 0; i++ {
		var g [3]uint64
		if e := ix.blocks[hashes[i]]; e != nil {
			g = e.g
		}
		for k := range 3 {
			drop := alive[k] &^ g[k]
			alive[k] &^= drop
			for d := drop; d != 0; d &= d - 1 {
				b := bits.TrailingZeros64(d)
				count[k][b] = int32(i) - start[k][b]
				// The run continues in the next lower tier that holds block i, if any.
				for m := k + 1; m < 3; m++ {
					if g[m]&(1<<b) != 0 {
						alive[m] |= 1 << b
						start[m][b] = int32(i)
						break
					}
				}
			}
		}
	}
	for k := range 3 {
		for d := alive[k]; d != 0; d &= d - 1 {
			b := bits.TrailingZeros64(d)
			count[k][b] = int32(n) - start[k][b]
		}
	}
	for i, t := range targets {
		p, ok := ix.pos[t]
		if !ok {
			out[i] = indexers.TierMatch{}
			continue
		}
		out[i] = indexers.TierMatch{G1: int(count[0][p]), G2: int(count[1][p]), G3: int(count[2][p])}
	}
}

// TestTierIndex checks the benchmark's stand-in index against a per-target reference walk, so
// the benchmark measures a correct matcher.
func TestTierIndex(t *testing.T) {
	targets := make([]kvkey.Target, 6)
	for i := range targets {
		targets[i] = tgt(i)
	}
	ix := newTierIndex(targets)
	p := chain(1, 40)
	ix.store(tgt(0), 0, p[:30])
	ix.store(tgt(1), 0, p[:10])
	ix.store(tgt(1), 1, p[10:25])
	ix.store(tgt(1), 2, p[25:40])
	ix.store(tgt(2), 1, p[:12])
	ix.store(tgt(3), 2, p[:7])
	ix.store(tgt(4), 0, p[:5])
	ix.store(tgt(4), 2, p[5:9])
	ix.store(tgt(5), 0, p[1:20]) // hole at block 0: nothing matches
	out := make([]indexers.TierMatch, len(targets))
	ix.MatchTiers(p, targets, out)
	want := []indexers.TierMatch{{G1: 30}, {G1: 10, G2: 15, G3: 15}, {G2: 12}, {G3: 7}, {G1: 5, G3: 4}, {}}
	for i := range want {
		if out[i] != want[i] {
			t.Errorf("target %d: %+v, want %+v", i, out[i], want[i])
		}
	}
}

// BenchmarkKVDecision measures one routing decision (match + score + pick, no tokenization) for
// a 32k-token prompt (2,048 blocks of 16) over 64 targets, with every target holding a shared
// 512-block prefix plus prompt-specific depth (512..2024 blocks), a host-tier extension, an
// unrelated 4,096-block prompt, 4 active requests each and fresh worker metrics. Reports p50
// and p99 per decision, with the real indexers.Index, with the linear tierIndex, and in
// approximate mode (every target scored from the ApproxIndex); the "policy-only" variant uses a
// free matcher to isolate scoring and picking.
func BenchmarkKVDecision(b *testing.B) {
	const nTargets, nBlocks = 64, 2048
	cs := kvCands(nTargets)
	targets := make([]kvkey.Target, nTargets)
	for i, c := range cs {
		targets[i] = c.Target
	}
	tokens := promptTokens(1, nBlocks*16)
	local := tokenize.LocalHashes(tokens, 16, tokenize.HashOptions{})
	prompt := tokenize.SequenceHashes(local)
	ix := newTierIndex(targets)
	realIx := indexers.NewIndex(indexers.Options{BlockSize: 16})
	for i, t := range targets {
		g1, g2 := 512+i*24, min(nBlocks, 600+i*24)
		ix.store(t, 0, prompt[:g1])   // G1 depth 512..2024
		ix.store(t, 1, prompt[g1:g2]) // G2 extension
		other := promptTokens(uint32(100+i), 4096*16)
		ix.store(t, 0, tokenize.BlockHashes(other, 16, tokenize.HashOptions{})) // unrelated resident prompt
		ext := func(b int) uint64 { return uint64(i)<<32 | uint64(b) }
		storeBlocks(b, realIx, t, indexers.MediumGPU, tokens, 0, g1, ext)
		storeBlocks(b, realIx, t, indexers.MediumCPU, tokens, g1, g2, ext)
		storeBlocks(b, realIx, t, indexers.MediumGPU, other, 0, 4096, func(b int) uint64 { return 1<<63 | ext(b) })
	}
	approx := NewApproxIndex(ApproxConfig{TTL: confval.Duration(time.Hour), BlockBudget: 1 << 20})
	for i, t := range targets {
		approx.Record(t, chain(uint64(100+i), 4096))
		approx.Record(t, prompt[:512+i*24])
	}
	run := func(b *testing.B, deps KVDeps, begin bool) {
		runDecisions(b, deps, begin, false, targets, cs, prompt, local)
	}
	route := func(b *testing.B, deps KVDeps) { runDecisions(b, deps, true, true, targets, cs, prompt, local) }
	b.Run("indexers/match+score+pick", func(b *testing.B) { run(b, KVDeps{Matcher: realIx}, false) })
	b.Run("tierIndex/match+score+pick", func(b *testing.B) { run(b, KVDeps{Matcher: ix}, false) })
	b.Run("approximate/match+score+pick", func(b *testing.B) { run(b, KVDeps{Approx: approx}, false) })
	b.Run("policy-only", func(b *testing.B) { run(b, KVDeps{Matcher: fixedMatcher{}}, false) })
	// With Begin and Done: the load accounting and NoteRouted that a routed request adds.
	b.Run("indexers/match+score+pick+begin", func(b *testing.B) { run(b, KVDeps{Matcher: realIx}, true) })
	// As deployed (cmd/kvgate): the approximate index beside the event index, every target's
	// events healthy, so every target is scored from the event index.
	b.Run("indexers+approx/match+score+pick", func(b *testing.B) { run(b, KVDeps{Matcher: realIx, Approx: approx}, false) })
	b.Run("indexers+approx/match+score+pick+begin", func(b *testing.B) { run(b, KVDeps{Matcher: realIx, Approx: approx}, true) })
	// Through the Dispatcher: Route (with the hold table's claim) and the Lifecycle to Done.
	b.Run("indexers/dispatcher-route+lifecycle", func(b *testing.B) { route(b, KVDeps{Matcher: realIx}) })
}

// runDecisions times b.N decisions of the kv policy over deps (see BenchmarkKVDecision): Pick,
// Pick+Begin, or the Dispatcher's Route with the whole Lifecycle.
func runDecisions(b *testing.B, deps KVDeps, begin, dispatch bool, targets []kvkey.Target, cs []Candidate, prompt []kvkey.BlockHash, local []uint64) {
	p, err := NewKV(DefaultKVConfig(), deps)
	if err != nil {
		b.Fatal(err)
	}
	var e *Dispatcher
	if dispatch {
		if e, err = NewDispatcher(DispatcherOptions{KV: p}); err != nil {
			b.Fatal(err)
		}
	}
	now := time.Now()
	for i, t := range targets {
		for j := range 4 {
			active := append(slices.Clone(prompt[:512]), chain(uint64(1000+i*4+j), 512)...)
			h := p.Load().Begin(t, request(active), 512)
			if j%2 == 0 {
				h.FirstToken()
			}
		}
		p.Load().UpdateMetrics(t, WorkerMetrics{Running: 4, Waiting: float64(i % 3), KVUsage: 0.5, NumGPUBlocks: 8192, At: now})
	}
	req := request(prompt)
	req.LocalHashes = local
	ctx := context.Background()
	// Wall time per decision, and the thread's CPU time per decision: on a shared machine the
	// wall-clock tail is mostly time spent descheduled, which the CPU time leaves out.
	wall := make([]time.Duration, 0, b.N)
	cpu := make([]time.Duration, 0, b.N)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	runtime.GC() // setup garbage must not be collected inside the timed loop
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		c0 := threadCPU()
		start := time.Now()
		if e != nil {
			_, lc, err := e.Route(ctx, req, cs)
			if err != nil {
				b.Fatal(err)
			}
			lc.Sent()
			lc.FirstToken()
			lc.Done()
		} else {
			d, err := p.Pick(ctx, req, cs)
			if err != nil {
				b.Fatal(err)
			}
			if begin {
				p.Begin(d, req).Done()
			}
		}
		wall = append(wall, time.Since(start))
		cpu = append(cpu, threadCPU()-c0)
	}
	b.StopTimer()
	slices.Sort(wall)
	slices.Sort(cpu)
	b.ReportMetric(float64(wall[len(wall)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(wall[len(wall)*99/100].Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(cpu[len(cpu)/2].Nanoseconds()), "cpu-p50-ns")
	b.ReportMetric(float64(cpu[len(cpu)*99/100].Nanoseconds()), "cpu-p99-ns")
}

// threadCPU is the calling OS thread's CPU time (the goroutine is locked to its thread).
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
