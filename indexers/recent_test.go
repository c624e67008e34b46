package indexers

import (
	"testing"

	"github.com/kvgate/kvgate/kvkey"
)

// TestRecentRemoved: with one slot pair the memory is an exact LRU of two; larger memories keep
// at most their capacity (rounded up to a power of two), always keep the newest entry of every
// pair, and forget what was taken or reset.
func TestRecentRemoved(t *testing.T) {
	var r recentRemoved
	r.record(2, 10, removedBlock{our: 110})
	r.record(2, 11, removedBlock{our: 111, parentOur: 110, hasParent: true})
	r.record(2, 10, removedBlock{our: 210}) // re-recorded: updated in place, now the newest
	r.record(2, 12, removedBlock{our: 112}) // evicts 11, the least recent
	if _, ok := r.take(11); ok {
		t.Fatal("least recent entry not evicted")
	}
	if b, ok := r.take(10); !ok || b.our != 210 || b.hasParent {
		t.Fatalf("re-recorded entry: %+v %v", b, ok)
	}
	if _, ok := r.take(10); ok {
		t.Fatal("take does not forget")
	}
	if b, ok := r.take(12); !ok || b.our != 112 {
		t.Fatalf("newest entry lost: %+v %v", b, ok)
	}

	tests := []struct{ capacity, slots int }{{1, 2}, {3, 4}, {4096, 4096}, {5000, 8192}}
	for _, tc := range tests {
		var r recentRemoved
		for h := range uint64(3 * tc.slots) {
			r.record(tc.capacity, kvkey.EngineHash(h*7919), removedBlock{our: kvkey.BlockHash(h), parentOur: kvkey.BlockHash(h - 1), hasParent: h > 0})
		}
		if len(r.slots) != tc.slots || r.len() > tc.slots {
			t.Fatalf("capacity %d: %d slots, %d remembered; want %d slots", tc.capacity, len(r.slots), r.len(), tc.slots)
		}
		last := uint64(3*tc.slots - 1)
		if b, ok := r.take(kvkey.EngineHash(last * 7919)); !ok || b.our != kvkey.BlockHash(last) || b.parentOur != kvkey.BlockHash(last-1) || !b.hasParent {
			t.Fatalf("capacity %d: newest entry %+v %v", tc.capacity, b, ok)
		}
		r.reset()
		if r.len() != 0 {
			t.Fatal("reset kept entries")
		}
	}
	r.record(0, 9, removedBlock{})
	if _, ok := r.take(9); ok {
		t.Fatal("capacity 0 must remember nothing")
	}
}
