package indexers

import (
	"math/rand/v2"
	"testing"

	"github.com/kvgate/kvgate/tokenize"
	"github.com/kvgate/kvgate/workers"
)

// The seqlock table must behave like a map under inserts, updates, deletes (dead slots),
// growth and shrinking; rwTable serves as the reference.
func TestSeqTableAgainstMap(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	seq, ref := newSeqTable(), newRWTable()
	keys := make([]uint64, 20_000)
	for i := range keys {
		keys[i] = r.Uint64()
	}
	keys[0] = 0 // the empty-slot marker must still work as a key
	for round := range 4 {
		n := 60_000
		if round%2 == 1 {
			n = 30_000
		}
		for range n {
			k := keys[r.IntN(len(keys))]
			slot, mask, on := r.IntN(MaxTargets), uint8(1+r.IntN(7)), r.IntN(3) > 0 || round%2 == 1 && r.IntN(2) == 0
			if round%2 == 1 {
				on = false // drain rounds shrink the tables
			}
			seq.update(k, slot, mask, on)
			ref.update(k, slot, mask, on)
		}
		for _, k := range keys {
			if seq.get(k) != ref.get(k) {
				t.Fatalf("round %d: key %x differs", round, k)
			}
		}
	}
}

type countingTable struct {
	blockTable
	gets int
}

func (c *countingTable) get(h uint64) gentry { c.gets++; return c.blockTable.get(h) }

// Match resolves orphan-free targets by bisection and exits early: one lookup when nobody
// holds block 0, O(targets × log n) otherwise, a linear walk only for targets with orphans.
func TestMatchLookupBudget(t *testing.T) {
	ix := NewIndex(Options{BlockSize: 4})
	ct := &countingTable{blockTable: ix.table}
	ix.table = ct
	toks := seqTokens(4*8192, 7)
	q := tokenize.BlockHashes(toks, 4, tokenize.HashOptions{})
	a, b := workers.Target{Worker: "a"}, workers.Target{Worker: "b"}
	store := func(tg workers.Target, n int, base uint64) {
		hs := make([]uint64, n)
		for i := range hs {
			hs[i] = base + uint64(i)
		}
		apply(t, ix, tg, &BlockStored{BlockHashes: exts(hs...), TokenIDs: toks[:4*n], BlockSize: 4})
	}
	store(a, 100, 1000)
	store(b, 5000, 100000)
	ct.gets = 0
	got := ix.Match(q)
	if bound := 2 * (14 + 2); ct.gets > bound {
		t.Fatalf("bisection used %d lookups, want ≤ %d", ct.gets, bound)
	}
	if len(got) != 2 || overlapOf(ix, a, q).G1 != 100 || overlapOf(ix, b, q).G1 != 5000 {
		t.Fatalf("match %+v", got)
	}
	ct.gets = 0
	other := tokenize.BlockHashes(seqTokens(4*8192, 9999), 4, tokenize.HashOptions{})
	if got := ix.Match(other); len(got) != 0 || ct.gets != 1 {
		t.Fatalf("no-overlap query: %d results, %d lookups (want 0, 1)", len(got), ct.gets)
	}
	// Evicting a's block 50 makes blocks 51..99 orphans: a is scanned (51 lookups), b bisected.
	apply(t, ix, a, &BlockRemoved{BlockHashes: exts(1050)})
	ct.gets = 0
	got = ix.Match(q)
	if ct.gets > 51+2*(14+2) {
		t.Fatalf("scan used %d lookups", ct.gets)
	}
	if o := overlapOf(ix, a, q); o.G1 != 50 || len(got) != 2 {
		t.Fatalf("a after mid eviction: %+v", o)
	}
}
