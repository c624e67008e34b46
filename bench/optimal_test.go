package bench

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestBeladyHits: the clairvoyant cache keeps the block wanted soonest, counts leading blocks
// only, skips dropped requests and never keeps fewer blocks for later than the pooled LRU.
func TestBeladyHits(t *testing.T) {
	acc := func(ids ...int64) access { return access{ns: "a", ids: ids} }
	tests := []struct {
		name     string
		capacity int
		accs     []access
		want     []int
	}{
		// LRU evicts 1 for 3 and misses 1; MIN drops 2 or 3 (neither comes back) and keeps 1.
		{"keeps the block wanted again", 2, []access{acc(1), acc(2), acc(3), acc(1)}, []int{0, 0, 0, 1}},
		{"leading blocks only", 4, []access{acc(1, 2), acc(3, 2)}, []int{0, 0}},
		{"a dropped request computes nothing", 4, []access{acc(1), {ns: "a", ids: []int64{2}, dropped: true}, acc(1, 2)}, []int{0, 0, 1}},
		{"namespaces never share", 4, []access{acc(1), {ns: "b", ids: []int64{1}}}, []int{0, 0}},
		{"no capacity", 0, []access{acc(1), acc(1)}, []int{0, 0}},
		// A long prefix reused once beats a hot one-block loop: MIN keeps 1..3 while 9 cycles.
		{"a prefix outlives a loop", 4, []access{acc(1, 2, 3), acc(9), acc(8), acc(9), acc(1, 2, 3)}, []int{0, 0, 0, 1, 3}},
	}
	for _, tc := range tests {
		if got := beladyHits(tc.accs, tc.capacity); !slices.Equal(got, tc.want) {
			t.Errorf("%s: hits %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestBeladyAtLeastLRU: on random prefix-sharing requests the clairvoyant cache's total hit is
// never under the pooled LRU's (what makes it the reference above it).
func TestBeladyAtLeastLRU(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		var accs []access
		lru := newPooledLRU(8 + round%8)
		lruHit := 0
		for range 60 {
			n := 1 + rng.IntN(6)
			base := int64(rng.IntN(5) * 100)
			ids := make([]int64, n)
			for j := range ids {
				ids[j] = base + int64(j)
			}
			accs = append(accs, access{ns: "a", ids: ids})
			h, _ := lru.touch("a", ids)
			lruHit += h
		}
		opt := 0
		for _, h := range beladyHits(accs, lru.capacity) {
			opt += h
		}
		if opt < lruHit {
			t.Fatalf("round %d: clairvoyant hit %d under the pooled LRU's %d", round, opt, lruHit)
		}
	}
}
