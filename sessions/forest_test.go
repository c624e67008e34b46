package sessions

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/kvkey"
)

// chain returns n distinct fake block hashes starting at base (tests only need distinctness).
func chain(base kvkey.BlockHash, n int) []kvkey.BlockHash {
	hs := make([]kvkey.BlockHash, n)
	for i := range hs {
		hs[i] = base + kvkey.BlockHash(i)
	}
	return hs
}

// parentHash returns the hash of slot's parent, or 0 for a root.
func parentHash(f *forest, h kvkey.BlockHash) (kvkey.BlockHash, bool) {
	s, ok := f.byHash[h]
	if !ok {
		return 0, false
	}
	p := f.nodes[s].parent
	if p == nilSlot {
		return 0, true
	}
	return f.nodes[p].hash, true
}

func TestForestLinkAndLineage(t *testing.T) {
	f := newForest(100)
	tip, err := f.link(chain(100, 5), ParentNone, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.addRef(tip)
	if d, rooted := f.depth(tip); d != 5 || !rooted {
		t.Fatalf("depth = %d rooted=%v, want 5 true", d, rooted)
	}
	hs, ok := f.lineage(tip, 0, false)
	if !ok || !slices.Equal(hs, chain(100, 5)) {
		t.Fatalf("lineage = %v", hs)
	}
	hs, ok = f.lineage(tip, 102, true)
	if !ok || !slices.Equal(hs, []kvkey.BlockHash{102, 103, 104}) {
		t.Fatalf("anchored lineage = %v ok=%v", hs, ok)
	}
	if _, ok := f.lineage(tip, 999, true); ok {
		t.Fatal("anchor not on path must not yield a lineage")
	}
	// A branch sharing 3 blocks adds only its own 2.
	b, err := f.link([]kvkey.BlockHash{100, 101, 102, 900, 901}, ParentNone, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.addRef(b)
	if f.live() != 7 {
		t.Fatalf("live = %d, want 7", f.live())
	}
	if n := f.nodes[f.byHash[102]].children; n != 2 {
		t.Fatalf("children of the fork = %d, want 2", n)
	}
}

// A block first seen without its parent is a temporary root; a later update naming the parent
// grafts it, and the lineage becomes rooted (docs/ARCHITECTURE.md, "Sessions and frontiers").
func TestForestGraftsTemporaryRoot(t *testing.T) {
	f := newForest(100)
	tip, err := f.link([]kvkey.BlockHash{13, 14, 15}, ParentUnknown, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.addRef(tip)
	if d, rooted := f.depth(tip); d != 3 || rooted {
		t.Fatalf("before graft: depth %d rooted %v, want 3 false", d, rooted)
	}
	// A stored event for blocks 11,12 under 10, then 13 under 12 (the chain carries 13 again).
	if _, err := f.link([]kvkey.BlockHash{11, 12, 13}, ParentHash, 10); err != nil {
		t.Fatal(err)
	}
	if p, _ := parentHash(f, 13); p != 12 {
		t.Fatalf("13 grafted under %d, want 12", p)
	}
	// 10 is now the temporary root; naming it as block 0 roots the whole lineage.
	if _, err := f.link([]kvkey.BlockHash{10}, ParentNone, 0); err != nil {
		t.Fatal(err)
	}
	d, rooted := f.depth(tip)
	if d != 6 || !rooted {
		t.Fatalf("after graft: depth %d rooted %v, want 6 true", d, rooted)
	}
	hs, _ := f.lineage(tip, 0, false)
	if !slices.Equal(hs, chain(10, 6)) {
		t.Fatalf("lineage %v", hs)
	}
}

func TestForestRejectsConflictingAndCyclicParents(t *testing.T) {
	type step struct {
		chain  []kvkey.BlockHash
		kind   ParentKind
		parent kvkey.BlockHash
	}
	cases := []struct {
		name  string
		setup []step
		bad   step
		want  error
	}{
		{"existing block under another parent",
			[]step{{[]kvkey.BlockHash{1, 2, 3}, ParentNone, 0}},
			step{[]kvkey.BlockHash{9, 3}, ParentNone, 0}, ErrConflictingParent},
		{"true root claimed under a parent",
			[]step{{[]kvkey.BlockHash{1, 2}, ParentNone, 0}},
			step{[]kvkey.BlockHash{1}, ParentHash, 7}, ErrConflictingParent},
		{"child claimed as a root",
			[]step{{[]kvkey.BlockHash{1, 2}, ParentNone, 0}},
			step{[]kvkey.BlockHash{2}, ParentNone, 0}, ErrConflictingParent},
		{"existing block under a different existing parent",
			[]step{{[]kvkey.BlockHash{1, 2, 3}, ParentNone, 0}, {[]kvkey.BlockHash{5}, ParentNone, 0}},
			step{[]kvkey.BlockHash{3}, ParentHash, 5}, ErrConflictingParent},
		{"block repeated in its own chain",
			nil,
			step{[]kvkey.BlockHash{1, 2, 1}, ParentNone, 0}, ErrCyclicParent},
		{"parent repeated in the chain",
			nil,
			step{[]kvkey.BlockHash{4, 3}, ParentHash, 3}, ErrCyclicParent},
		{"temporary root grafted under its own descendant",
			[]step{{[]kvkey.BlockHash{1, 2, 3}, ParentUnknown, 0}},
			step{[]kvkey.BlockHash{1}, ParentHash, 3}, ErrCyclicParent},
		{"graft through an unknown-parent chain that loops",
			[]step{{[]kvkey.BlockHash{1, 2, 3}, ParentUnknown, 0}},
			step{[]kvkey.BlockHash{2, 3, 9, 1}, ParentUnknown, 0}, ErrCyclicParent},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newForest(100)
			for _, s := range tc.setup {
				tip, err := f.link(s.chain, s.kind, s.parent)
				if err != nil {
					t.Fatalf("setup: %v", err)
				}
				f.addRef(tip)
			}
			before := snapshotForest(f)
			_, err := f.link(tc.bad.chain, tc.bad.kind, tc.bad.parent)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if after := snapshotForest(f); !mapsEqual(before, after) {
				t.Fatalf("rejected update mutated the forest:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

// snapshotForest maps each live hash to its parent hash (0 for roots) and flags.
func snapshotForest(f *forest) map[kvkey.BlockHash][2]kvkey.BlockHash {
	out := map[kvkey.BlockHash][2]kvkey.BlockHash{}
	for h, s := range f.byHash {
		p, _ := parentHash(f, h)
		out[h] = [2]kvkey.BlockHash{p, kvkey.BlockHash(uint64(f.nodes[s].flags)<<32 | uint64(f.nodes[s].children))}
	}
	return out
}

func mapsEqual(a, b map[kvkey.BlockHash][2]kvkey.BlockHash) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestForestReclaimsUnreferencedLeaves(t *testing.T) {
	f := newForest(100)
	a, _ := f.link(chain(1, 4), ParentNone, 0)
	f.addRef(a)
	b, _ := f.link([]kvkey.BlockHash{1, 2, 50, 51}, ParentNone, 0)
	f.addRef(b)
	if f.live() != 6 {
		t.Fatalf("live = %d, want 6", f.live())
	}
	f.dropRef(b) // 51, 50 go; 1, 2 stay for a
	if f.live() != 4 {
		t.Fatalf("after dropping b: live = %d, want 4", f.live())
	}
	if _, ok := f.byHash[50]; ok {
		t.Fatal("50 must be reclaimed")
	}
	f.dropRef(a)
	if f.live() != 0 || len(f.byHash) != 0 {
		t.Fatalf("after dropping a: live = %d, map %d", f.live(), len(f.byHash))
	}
}

// A NodeRef taken before its node was reclaimed must never resolve to the node that later
// reuses the slot.
func TestForestSlotReuseDoesNotAlias(t *testing.T) {
	f := newForest(4)
	a, _ := f.link([]kvkey.BlockHash{1, 2}, ParentNone, 0)
	f.addRef(a)
	old := f.ref(a)
	f.dropRef(a)
	b, _ := f.link([]kvkey.BlockHash{7, 8}, ParentNone, 0)
	f.addRef(b)
	if n := f.nodes[old.Slot]; n.flags&flagLive == 0 || n.hash == 2 {
		t.Fatalf("slot %d not reused by another block: the test needs reuse", old.Slot)
	}
	if s, ok := f.resolve(old); ok {
		t.Fatalf("stale ref resolved to slot %d (hash %d)", s, f.nodes[s].hash)
	}
	if _, ok := f.resolve(f.ref(b)); !ok {
		t.Fatal("fresh ref must resolve")
	}
}

func TestForestCapacity(t *testing.T) {
	f := newForest(3)
	if _, err := f.link(chain(1, 4), ParentNone, 0); !errors.Is(err, ErrForestFull) {
		t.Fatalf("err = %v, want ErrForestFull", err)
	}
	if f.live() != 0 {
		t.Fatalf("a rejected link left %d nodes", f.live())
	}
	tip, err := f.link(chain(1, 3), ParentNone, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.addRef(tip)
	// Re-linking an existing chain needs no capacity.
	if _, err := f.link(chain(1, 3), ParentNone, 0); err != nil {
		t.Fatal(err)
	}
}
