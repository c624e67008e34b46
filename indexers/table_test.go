package indexers

import (
	"testing"

	"github.com/kvgate/kvgate/kvkey"
)

// countingTable counts the lookups Match makes.
type countingTable struct {
	blockTable
	gets int
}

func (c *countingTable) get(h kvkey.BlockHash) gentry { c.gets++; return c.blockTable.get(h) }

// Match resolves orphan-free targets by bisection and exits early: one lookup when nobody
// holds block 0, O(targets × log n) otherwise, a linear walk only for targets with orphans.
func TestMatchLookupBudget(t *testing.T) {
	ix := NewIndex(Options{BlockSize: 4})
	ct := &countingTable{blockTable: ix.table}
	ix.table = ct
	toks := seqTokens(4*8192, 7)
	q := kvkey.BlockHashes(toks, 4, kvkey.HashOptions{})
	a, b := kvkey.Target{Worker: "a"}, kvkey.Target{Worker: "b"}
	store := func(tg kvkey.Target, n int, base uint64) {
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
	other := kvkey.BlockHashes(seqTokens(4*8192, 9999), 4, kvkey.HashOptions{})
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
