package indexers

import (
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/kvkey"
)

// TestParentZeroIsRoot: llm-d-inference-sim writes the root block's parent_block_hash as integer
// 0 instead of nil. Decoded in either event layout, such a store must index as a root (and its
// children chain under it), not be dropped as parent_not_found.
func TestParentZeroIsRoot(t *testing.T) {
	toks := seqTokens(3*4, 10)
	storedArr := func(hs []uint64, parent any, tk []uint32) []any {
		return arr("BlockStored", hs, parent, tk, 4, nil, "GPU", nil, nil, 0, "full_attention", nil)
	}
	storedMap := func(hs []uint64, parent any, tk []uint32) omap {
		return mapv("type", "BlockStored", "block_hashes", hs, "parent_block_hash", parent,
			"token_ids", tk, "block_size", 4, "medium", "GPU")
	}
	tests := []struct {
		name    string
		payload func(t *testing.T) []byte
	}{
		{"array layout", func(t *testing.T) []byte {
			return mp(t, arr(1.5, arr(storedArr([]uint64{501, 502}, 0, toks[:8]),
				storedArr([]uint64{503}, 502, toks[8:])), 0))
		}},
		{"map layout", func(t *testing.T) []byte {
			return mp(t, arr(1.5, arr(storedMap([]uint64{501, 502}, 0, toks[:8]),
				storedMap([]uint64{503}, 502, toks[8:])), 0))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := DecodeBatch(tc.payload(t))
			if err != nil {
				t.Fatal(err)
			}
			if p := b.Events[0].(*BlockStored).ParentBlockHash; p.Set {
				t.Fatalf("parent 0 decoded as set (%d)", p.V.U)
			}
			ix := NewIndex(Options{BlockSize: 4})
			tg := kvkey.Target{Worker: "sim"}
			if err := ix.Apply(tg, b); err != nil {
				t.Fatal(err)
			}
			ts := ix.reg.Load().byTarget[tg]
			if n := ts.stats.drops[dropParentNotFound].Load(); n != 0 {
				t.Fatalf("%d blocks dropped as parent_not_found", n)
			}
			if got := overlapOf(ix, tg, kvkey.BlockHashes(toks, 4, kvkey.HashOptions{})); got.G1 != 3 {
				t.Fatalf("matched %d of 3 blocks", got.G1)
			}
		})
	}
}

// routedPromptOf returns the local and sequence hashes of toks in blocks of 4.
func routedPromptOf(toks []uint32) (local []uint64, seq []kvkey.BlockHash) {
	local = kvkey.LocalHashes(toks, 4, kvkey.HashOptions{})
	return local, kvkey.SequenceHashes(local)
}

func noteRouted(ix *Index, tg kvkey.Target, toks []uint32) {
	local, seq := routedPromptOf(toks)
	ix.NoteRouted(tg, local, seq)
}

// withBlock returns a copy of toks whose block b (of 4 tokens) holds other content.
func withBlock(toks []uint32, b int, base uint32) []uint32 {
	out := append([]uint32(nil), toks...)
	copy(out[b*4:(b+1)*4], seqTokens(4, base))
	return out
}

// TestChainRecovery: after a reset, a store extending a prefix the index never saw (its
// parent's worker hash unknown) is placed under a recently routed prompt of the same target
// that holds its blocks, and dropped when none does.
func TestChainRecovery(t *testing.T) {
	p := seqTokens(6*4, 100)  // blocks 0..5
	q := withBlock(p, 4, 900) // same blocks 0..3 as p, different block 4
	sys := seqTokens(4, 5000)
	a := append(append(seqTokens(4, 7000), sys...), seqTokens(4, 100)...) // [A0, sys, p0]
	b := append(append(seqTokens(4, 8000), sys...), seqTokens(4, 200)...) // [B0, sys, x]
	tg := kvkey.Target{Worker: "w"}
	other := kvkey.Target{Worker: "other"}
	// The store: blocks 3 and 4 of p, parent = block 2 under a worker hash the index never saw.
	storeP34 := &BlockStored{BlockHashes: exts(9003, 9004), ParentBlockHash: Some(IntHash(9002)),
		TokenIDs: p[12:20], BlockSize: 4, Medium: Some(MediumGPU)}
	tests := []struct {
		name      string
		routed    [][]uint32 // prompts routed to tg, in order
		elsewhere [][]uint32 // prompts routed to another target
		store     *BlockStored
		matchOf   []uint32 // prompt whose match is checked
		wantG1    int
		recovered bool
	}{
		{"no routed prompt", nil, nil, storeP34, p, 0, false},
		{"routed prompt holds the run", [][]uint32{p}, nil, storeP34, p, 5, true},
		{"routed prompt shorter than the run", [][]uint32{p[:16]}, nil, storeP34, p, 5, true},
		{"wrong content after the first block", [][]uint32{q}, nil, storeP34, p, 0, false},
		{"wrong content prompt ignored, right one used", [][]uint32{p, q}, nil, storeP34, p, 5, true},
		{"prompt routed to another target", nil, [][]uint32{p}, storeP34, p, 0, false},
		{"first block at position 0 is no parent", [][]uint32{p[12:]}, nil, storeP34, p, 0, false},
		{"most recent of two prefixes wins (newest)", [][]uint32{a, b},
			nil, &BlockStored{BlockHashes: exts(9101), ParentBlockHash: Some(IntHash(9100)), TokenIDs: sys,
				BlockSize: 4, Medium: Some(MediumGPU)}, b[:8], 2, true},
		{"most recent of two prefixes wins (older loses)", [][]uint32{a, b},
			nil, &BlockStored{BlockHashes: exts(9101), ParentBlockHash: Some(IntHash(9100)), TokenIDs: sys,
				BlockSize: 4, Medium: Some(MediumGPU)}, a[:8], 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := NewIndex(Options{BlockSize: 4})
			for _, x := range []kvkey.Target{tg, other} {
				if err := ix.AddTarget(x); err != nil {
					t.Fatal(err)
				}
			}
			for _, r := range tc.routed {
				noteRouted(ix, tg, r)
			}
			for _, r := range tc.elsewhere {
				noteRouted(ix, other, r)
			}
			ix.Reset(tg) // the routed memory survives the reset: that is when it is needed
			apply(t, ix, tg, tc.store)
			_, seq := routedPromptOf(tc.matchOf)
			if got := overlapOf(ix, tg, seq); got.G1 != tc.wantG1 {
				t.Fatalf("G1 %d, want %d", got.G1, tc.wantG1)
			}
			rec, failed := ix.ChainRecoveries(tg)
			ts := ix.reg.Load().byTarget[tg]
			dropped := ts.stats.drops[dropParentNotFound].Load()
			if tc.recovered != (rec == 1) || tc.recovered == (failed == 1) || tc.recovered != (dropped == 0) {
				t.Fatalf("recovered %d, failed %d, dropped %d; want recovered=%v", rec, failed, dropped, tc.recovered)
			}
			if !tc.recovered {
				return
			}
			// A later store under the run's last block chains on without recovery.
			if tc.store == storeP34 {
				apply(t, ix, tg, &BlockStored{BlockHashes: exts(9005), ParentBlockHash: Some(IntHash(9004)),
					TokenIDs: p[20:24], BlockSize: 4, Medium: Some(MediumGPU)})
				if got := overlapOf(ix, tg, seq); len(seq) == 6 && got.G1 != 6 {
					t.Fatalf("after the child store G1 %d, want 6", got.G1)
				}
				if rec, _ := ix.ChainRecoveries(tg); rec != 1 {
					t.Fatalf("%d recoveries, want 1", rec)
				}
			}
		})
	}
}

// TestRecoveredPrefixIsRemovable: the blocks before a recovered parent (their worker hashes
// unknown) are resident only as long as the parent is; its removal, a clear or a reset takes
// them away, so no residency is left that no event could remove.
func TestRecoveredPrefixIsRemovable(t *testing.T) {
	p := seqTokens(5*4, 300)
	_, seq := routedPromptOf(p)
	tg := kvkey.Target{Worker: "w"}
	tests := []struct {
		name           string
		remove         func(ix *Index)
		wantG1         int
		wantG1Resident int64
	}{
		{"parent removed", func(ix *Index) {
			apply(t, ix, tg, &BlockRemoved{BlockHashes: exts(8002), Medium: Some(MediumGPU)})
		}, 0, 2},
		{"run removed, parent stays", func(ix *Index) {
			apply(t, ix, tg, &BlockRemoved{BlockHashes: exts(8003, 8004), Medium: Some(MediumGPU)})
		}, 3, 3},
		{"all blocks cleared", func(ix *Index) { apply(t, ix, tg, &AllBlocksCleared{}) }, 0, 0},
		{"reset", func(ix *Index) { ix.Reset(tg) }, 0, 0},
		{"parent re-stored with other content", func(ix *Index) {
			apply(t, ix, tg, &BlockStored{BlockHashes: exts(8002), TokenIDs: seqTokens(4, 60000), BlockSize: 4,
				Medium: Some(MediumGPU)})
		}, 0, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := &recChanges{}
			ix := NewIndex(Options{BlockSize: 4})
			if err := ix.AddTarget(tg); err != nil {
				t.Fatal(err)
			}
			noteRouted(ix, tg, p)
			l.apply(t, ix, tg, &BlockStored{BlockHashes: exts(8003, 8004), ParentBlockHash: Some(IntHash(8002)),
				TokenIDs: p[12:20], BlockSize: 4, Medium: Some(MediumGPU)})
			ts := ix.reg.Load().byTarget[tg]
			if got := overlapOf(ix, tg, seq); got.G1 != 5 {
				t.Fatalf("after recovery G1 %d, want 5", got.G1)
			}
			if n := ts.resident[G1].Load(); n != 5 {
				t.Fatalf("%d resident blocks after recovery, want 5", n)
			}
			if got := l.log[0]; got != "stored G1 5" {
				t.Fatalf("change set held %q, want the prefix, the parent and the run stored", got)
			}
			tc.remove(ix)
			if got := overlapOf(ix, tg, seq); got.G1 != tc.wantG1 {
				t.Fatalf("G1 %d, want %d", got.G1, tc.wantG1)
			}
			if n := ts.resident[G1].Load(); n != tc.wantG1Resident {
				t.Fatalf("%d resident blocks, want %d", n, tc.wantG1Resident)
			}
			if len(ts.anchors) != 0 && tc.wantG1Resident != 3 {
				t.Fatalf("%d anchors left", len(ts.anchors))
			}
			ts.mu.Lock()
			checkOrphans(t, ts)
			ts.mu.Unlock()
		})
	}
}

// checkOrphans recomputes the orphan counts from the slab.
func checkOrphans(t *testing.T, ts *targetState) {
	t.Helper()
	for k := range numTiers {
		var want int64
		for _, i := range ts.byOur {
			n := &ts.slab[i]
			if n.member(k) && n.parent >= 0 && !ts.slab[n.parent].member(k) {
				want++
			}
		}
		if got := ts.orphans[k].Load(); got != want {
			t.Fatalf("orphans[%d] = %d, want %d", k, got, want)
		}
	}
}

// TestRoutedMemoryBound: the memory keeps at most RoutedBlocks blocks per target (the request
// queue and the indexed memory alike), whole prompts least recently routed out first, with one
// map entry per remembered block at most; a prompt routed again is kept.
func TestRoutedMemoryBound(t *testing.T) {
	const budget = 12 // three prompts of 4 blocks
	tg := kvkey.Target{Worker: "w"}
	prompts := make([][]uint32, 10)
	for i := range prompts {
		prompts[i] = seqTokens(4*4, uint32(1000*(i+1)))
	}
	tests := []struct {
		name      string
		order     []int // prompts routed, in order, synced after each when sync is set
		sync      bool
		kept      []int
		forgotten []int
	}{
		{"queue only", []int{0, 1, 2, 3, 4, 5}, false, []int{3, 4, 5}, []int{0, 1, 2}},
		{"indexed", []int{0, 1, 2, 3, 4, 5}, true, []int{3, 4, 5}, []int{0, 1, 2}},
		{"routed again stays", []int{0, 1, 2, 0, 3, 4}, true, []int{0, 3, 4}, []int{1, 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := NewIndex(Options{BlockSize: 4, RoutedBlocks: budget})
			if err := ix.AddTarget(tg); err != nil {
				t.Fatal(err)
			}
			ts := ix.reg.Load().byTarget[tg]
			for _, i := range tc.order {
				noteRouted(ix, tg, prompts[i])
				if tc.sync {
					ts.mu.Lock()
					ts.routed.sync(&ts.routedQ, budget)
					ts.mu.Unlock()
				}
				if ts.routedQ.blocks > budget {
					t.Fatalf("queue holds %d blocks", ts.routedQ.blocks)
				}
			}
			ts.mu.Lock()
			defer ts.mu.Unlock()
			ts.routed.sync(&ts.routedQ, budget)
			m := &ts.routed
			if m.blocks > budget || len(m.byLocal) > budget || m.len() != len(tc.kept) {
				t.Fatalf("%d blocks, %d map entries, %d prompts remembered", m.blocks, len(m.byLocal), m.len())
			}
			for _, i := range tc.kept {
				local, seq := routedPromptOf(prompts[i])
				if pre, ok := m.find(local[2:]); !ok || pre[len(pre)-1] != seq[1] {
					t.Errorf("prompt %d forgotten", i)
				}
			}
			for _, i := range tc.forgotten {
				local, _ := routedPromptOf(prompts[i])
				if _, ok := m.find(local[2:]); ok {
					t.Errorf("prompt %d still remembered", i)
				}
			}
		})
	}
}

// TestNoteRoutedConcurrentWithApply: request goroutines note routed prompts while the event
// goroutine applies stores that need recovery and removals (run with -race).
func TestNoteRoutedConcurrentWithApply(t *testing.T) {
	tg := kvkey.Target{Worker: "w"}
	ix := NewIndex(Options{BlockSize: 4, RoutedBlocks: 256})
	if err := ix.AddTarget(tg); err != nil {
		t.Fatal(err)
	}
	const n = 200
	prompts := make([][]uint32, n)
	for i := range prompts {
		prompts[i] = append(seqTokens(8, 1), seqTokens(8, uint32(10000+100*i))...) // shared 2-block prefix
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 4 {
				noteRouted(ix, tg, prompts[i])
			}
		}()
	}
	go func() {
		defer close(done)
		for i := range n {
			ext := uint64(1000 + 10*i)
			apply(t, ix, tg, &BlockStored{BlockHashes: exts(ext + 3), ParentBlockHash: Some(IntHash(ext + 2)),
				TokenIDs: prompts[i][12:16], BlockSize: 4, Medium: Some(MediumGPU)})
			if i%3 == 0 {
				apply(t, ix, tg, &BlockRemoved{BlockHashes: exts(ext+2, ext+3), Medium: Some(MediumGPU)})
			}
		}
	}()
	wg.Wait()
	<-done
	rec, failed := ix.ChainRecoveries(tg)
	if rec+failed != n {
		t.Fatalf("recovered %d + failed %d != %d stores", rec, failed, n)
	}
	// A store of a prompt noted once the writers are done recovers.
	i := n - 1
	noteRouted(ix, tg, prompts[i])
	apply(t, ix, tg, &BlockStored{BlockHashes: exts(99), ParentBlockHash: Some(IntHash(98)),
		TokenIDs: prompts[i][12:16], BlockSize: 4, Medium: Some(MediumGPU)})
	if r2, _ := ix.ChainRecoveries(tg); r2 != rec+1 {
		t.Fatalf("late store not recovered")
	}
	ts := ix.reg.Load().byTarget[tg]
	ts.mu.Lock()
	checkOrphans(t, ts)
	ts.mu.Unlock()
}

// TestRecoveryMetrics: recoveries and failures are exported per target.
func TestRecoveryMetrics(t *testing.T) {
	ix := NewIndex(Options{BlockSize: 4})
	m, err := NewSubscribers(ix, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tg := kvkey.Target{Worker: "http://w:8000"}
	if err := ix.AddTarget(tg); err != nil {
		t.Fatal(err)
	}
	p := seqTokens(3*4, 40)
	noteRouted(ix, tg, p)
	apply(t, ix, tg,
		&BlockStored{BlockHashes: exts(3), ParentBlockHash: Some(IntHash(2)), TokenIDs: p[8:], BlockSize: 4},
		&BlockStored{BlockHashes: exts(13), ParentBlockHash: Some(IntHash(12)), TokenIDs: seqTokens(4, 9000), BlockSize: 4},
		&BlockStored{BlockHashes: exts(23), ParentBlockHash: Some(IntHash(22)), TokenIDs: seqTokens(4, 9100), BlockSize: 4})
	reg := prometheus.NewPedanticRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_kv_parent_recoveries_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == "result" {
					got[lp.GetValue()] = mt.GetCounter().GetValue()
				}
			}
		}
	}
	if got["recovered"] != 1 || got["failed"] != 2 {
		t.Fatalf("parent recoveries %v, want recovered 1, failed 2", got)
	}
}

// BenchmarkNoteRouted measures the request-side cost of remembering a routed 2,048-block prompt.
func BenchmarkNoteRouted(b *testing.B) {
	ix := NewIndex(Options{BlockSize: 16})
	tg := kvkey.Target{Worker: "w"}
	if err := ix.AddTarget(tg); err != nil {
		b.Fatal(err)
	}
	type prompt struct {
		local []uint64
		seq   []kvkey.BlockHash
	}
	prompts := make([]prompt, 16)
	for i := range prompts {
		l := kvkey.LocalHashes(seqTokens(2048*16, uint32(i)<<20), 16, kvkey.HashOptions{})
		prompts[i] = prompt{l, kvkey.SequenceHashes(l)}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		p := prompts[i%len(prompts)]
		ix.NoteRouted(tg, p.local, p.seq)
	}
}
