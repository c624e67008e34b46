package indexers

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvgate/kvgate/kvkey"
)

const benchBS = 16

// churn is a pre-decoded, steady-state event stream for one worker: a shared system prompt stays
// resident; each request stores its own blocks after it (prefill run + decode blocks) and later
// evicts them one BlockRemoved per block, like vLLM (vllm/v1/core/block_pool.py). Cycling the
// stream returns the index to the same state, so it can be replayed for any b.N.
type churn struct {
	target  kvkey.Target
	batches []*EventBatch
	blocks  int // blocks per cycle (stored + removed)
}

func randTokens(r *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(r.IntN(150_000))
	}
	return t
}

func extHashes(r *rand.Rand, n int) []WireHash {
	out := make([]WireHash, n)
	for i := range out {
		out[i] = IntHash(r.Uint64())
	}
	return out
}

func newChurn(r *rand.Rand, t kvkey.Target, system []uint32, requests, uniqueBlocks, decodeBlocks int) (*churn, []*EventBatch) {
	c := &churn{target: t}
	sysHashes := extHashes(r, len(system)/benchBS)
	setup := []*EventBatch{{Events: []Event{&BlockStored{BlockHashes: sysHashes, TokenIDs: system,
		BlockSize: benchBS, Medium: Some(MediumGPU), GroupIdx: Some[int64](0)}}}}
	for range requests {
		parent := sysHashes[len(sysHashes)-1]
		hs := extHashes(r, uniqueBlocks+decodeBlocks)
		toks := randTokens(r, (uniqueBlocks+decodeBlocks)*benchBS)
		c.batches = append(c.batches, &EventBatch{Events: []Event{&BlockStored{BlockHashes: hs[:uniqueBlocks],
			ParentBlockHash: Some(parent), TokenIDs: toks[:uniqueBlocks*benchBS], BlockSize: benchBS,
			Medium: Some(MediumGPU), GroupIdx: Some[int64](0)}}})
		for d := range decodeBlocks {
			i := uniqueBlocks + d
			c.batches = append(c.batches, &EventBatch{Events: []Event{&BlockStored{BlockHashes: hs[i : i+1],
				ParentBlockHash: Some(hs[i-1]), TokenIDs: toks[i*benchBS : (i+1)*benchBS], BlockSize: benchBS,
				Medium: Some(MediumGPU), GroupIdx: Some[int64](0)}}})
		}
		ev := &EventBatch{}
		for i := len(hs) - 1; i >= 0; i-- { // tail first, as vLLM's free queue evicts
			ev.Events = append(ev.Events, &BlockRemoved{BlockHashes: hs[i : i+1], Medium: Some(MediumGPU), GroupIdx: Some[int64](0)})
		}
		c.batches = append(c.batches, ev)
		c.blocks += 2 * len(hs)
	}
	return c, setup
}

// benchFleet is 64 workers sharing a 2k-token system prompt, each holding a prefix of one
// 8,192-block (128k-token) query at a different depth, plus a churn stream each.
type benchFleet struct {
	ix     *Index
	query  []kvkey.BlockHash
	churns []*churn
}

func newBenchFleet(tb testing.TB, workersN int) *benchFleet {
	return newBenchFleetDepths(tb, workersN, func(w int) int { return (w * 8192) / workersN })
}

// newBenchFleetDepths builds the fleet with worker w holding depth(w) leading query blocks (at
// least the 128-block system prompt).
func newBenchFleetDepths(tb testing.TB, workersN int, depthOf func(int) int) *benchFleet {
	r := rand.New(rand.NewPCG(1, 2))
	f := &benchFleet{ix: NewIndex(Options{BlockSize: benchBS})}
	system := randTokens(r, 128*benchBS)
	qtoks := append(slices.Clone(system), randTokens(r, (8192-128)*benchBS)...)
	f.query = kvkey.BlockHashes(qtoks, benchBS, kvkey.HashOptions{})
	qext := extHashes(r, 8192)
	for w := range workersN {
		t := kvkey.Target{Worker: fmt.Sprintf("http://worker-%02d:8000", w/2), DPRank: w % 2}
		c, setup := newChurn(r, t, system, 8, 32, 4)
		// Query prefix: depth from 0 to 8192 in steps; stored as prefill chunks of 512 blocks.
		depth := depthOf(w)
		for _, b := range setup {
			if err := f.ix.Apply(t, b); err != nil {
				tb.Fatal(err)
			}
		}
		// Store the query chain after the system prompt (whose ext hashes come from setup).
		sys := setup[0].Events[0].(*BlockStored).BlockHashes
		parent := Some(sys[len(sys)-1])
		for s := 128; s < depth; s += 512 {
			e := min(depth, s+512)
			b := &EventBatch{Events: []Event{&BlockStored{BlockHashes: qext[s:e], ParentBlockHash: parent,
				TokenIDs: qtoks[s*benchBS : e*benchBS], BlockSize: benchBS, Medium: Some(MediumGPU)}}}
			if err := f.ix.Apply(t, b); err != nil {
				tb.Fatal(err)
			}
			parent = Some(qext[e-1])
		}
		f.churns = append(f.churns, c)
	}
	return f
}

// applyCycle applies one cycle of every worker's churn, recording change sets into cs as the
// subscribers do (nil: not recorded), and returns the blocks in it.
func (f *benchFleet) applyCycle(tb testing.TB, cs *ChangeSet) int {
	n := 0
	for _, c := range f.churns {
		for _, b := range c.batches {
			if err := f.ix.ApplyTo(c.target, b, cs); err != nil {
				tb.Error(err) // may run on a helper goroutine: no Fatal
				return n
			}
		}
		n += c.blocks
	}
	return n
}

// BenchmarkApply: single-goroutine event application (blocks stored + removed per second),
// alone and while another goroutine runs 8,192-block Matches.
func BenchmarkApply(b *testing.B) {
	b.ReportAllocs()
	for _, tc := range benchCases() {
		if tc.grouped {
			continue // the query depths do not matter for application
		}
		f := newBenchFleet(b, 64)
		b.Run(fmt.Sprintf("readers=%d", tc.n), func(b *testing.B) {
			readers := tc.n
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range readers {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
							f.ix.Match(f.query)
						}
					}
				})
			}
			blocks := 0
			var cs ChangeSet // reused, as each subscriber reuses its own
			start := time.Now()
			for b.Loop() {
				blocks += f.applyCycle(b, &cs)
			}
			el := time.Since(start)
			close(stop)
			wg.Wait()
			b.ReportMetric(float64(blocks)/el.Seconds(), "blocks/s")
		})
	}
}

// BenchmarkMatch: latency percentiles of an 8,192-block Match over 64 workers, alone and while
// another goroutine applies the churn stream.
func BenchmarkMatch(b *testing.B) {
	for _, tc := range benchCases() {
		f := newBenchFleet(b, 64)
		if tc.grouped {
			// The common shape: a few distinct depths (system prompt only, half, all of it).
			f = newBenchFleetDepths(b, 64, func(w int) int { return []int{128, 128, 4096, 8192}[w%4] })
		}
		if got := f.ix.Match(f.query); len(got) != 64 {
			b.Fatalf("fixture: %d targets matched", len(got))
		}
		b.Run(fmt.Sprintf("depths=%s/writers=%d", map[bool]string{false: "64", true: "3"}[tc.grouped], tc.n), func(b *testing.B) {
			writers := tc.n
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var applied atomic.Int64
			for range writers {
				wg.Go(func() {
					var cs ChangeSet
					for {
						select {
						case <-stop:
							return
						default:
							applied.Add(int64(f.applyCycle(b, &cs)))
						}
					}
				})
			}
			var lat []time.Duration
			for b.Loop() {
				t0 := time.Now()
				f.ix.Match(f.query)
				lat = append(lat, time.Since(t0))
			}
			close(stop)
			wg.Wait()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}

type benchCase struct {
	n       int  // concurrent readers (Apply) or writers (Match)
	grouped bool // Match: 3 distinct worker depths instead of 64
}

func benchCases() []benchCase {
	return []benchCase{{0, false}, {1, false}, {0, true}, {1, true}}
}

// BenchmarkMemoryPerBlock reports heap bytes per resident block for one target.
func BenchmarkMemoryPerBlock(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	const n = 200_000
	toks := randTokens(r, n*benchBS)
	hs := extHashes(r, n)
	for b.Loop() {
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		ix := NewIndex(Options{BlockSize: benchBS})
		t := kvkey.Target{Worker: "w"}
		var parent Opt[WireHash]
		for s := 0; s < n; s += 1000 {
			_ = ix.Apply(t, &EventBatch{Events: []Event{&BlockStored{BlockHashes: hs[s : s+1000], ParentBlockHash: parent,
				TokenIDs: toks[s*benchBS : (s+1000)*benchBS], BlockSize: benchBS}}})
			parent = Some(hs[s+999])
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/n, "B/block")
		runtime.KeepAlive(ix)
	}
}

// BenchmarkDecode compares the hand-rolled decoder with vmihailenco/msgpack's generic decode
// (which only builds interface values and would still need a conversion pass) on a batch of
// realistic prefill events (4 × 32 blocks of 16 tokens, map layout).
func BenchmarkDecode(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	batch := &EventBatch{TS: 1.5, DPRank: Some[int64](0)}
	for range 4 {
		batch.Events = append(batch.Events, &BlockStored{BlockHashes: extHashes(r, 32), TokenIDs: randTokens(r, 32*benchBS),
			BlockSize: benchBS, Medium: Some(MediumGPU), ExtraKeys: make([][]any, 32), GroupIdx: Some[int64](0),
			KVCacheSpecKind: Some("full_attention")})
	}
	payload, err := EncodeBatch(batch, EncodeOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("handrolled", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		for b.Loop() {
			if _, err := DecodeBatch(payload); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(128*b.N)/b.Elapsed().Seconds(), "blocks/s")
	})
	b.Run("vmihailenco-generic", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		for b.Loop() {
			var v any
			if err := msgpack.Unmarshal(payload, &v); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(128*b.N)/b.Elapsed().Seconds(), "blocks/s")
	})
}
