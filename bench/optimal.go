package bench

import "container/heap"

// access is one request's blocks as kvbench sent them, for the clairvoyant reference
// (beladyHits); dropped marks a request that failed before any content (runner.unsee), whose
// blocks no worker computed.
type access struct {
	ns      string
	ids     []int64
	dropped bool
}

// beladyHits is the clairvoyant reference beside the pooled LRU: one cache of the fleet's whole
// capacity that, when full, evicts the block used again furthest in the future, or does not
// keep a block it just used if that one is (Belady's MIN; L. A. Belady, "A study of replacement
// algorithms for a virtual-storage computer", IBM Systems Journal 5(2), 1966). It returns each
// access's leading blocks the cache held (0 for a dropped one). No eviction policy keeps more
// blocks for later use, so the gap between it and the pooled LRU is what least-recently-used
// eviction loses on this order of requests, which no router's choice of worker recovers.
func beladyHits(accs []access, capacity int) []int {
	hits := make([]int, len(accs))
	if capacity <= 0 {
		return hits
	}
	// next[i][j]: when accs[i].ids[j] is used next, as a count of blocks from the end of the
	// requests (larger is sooner); -1 is never.
	next := make([][]int, len(accs))
	later := map[blockKey]int{}
	pos := 0
	for i := len(accs) - 1; i >= 0; i-- {
		a := &accs[i]
		if a.dropped {
			continue
		}
		next[i] = make([]int, len(a.ids))
		for j := len(a.ids) - 1; j >= 0; j-- {
			k := blockKey{a.ns, a.ids[j]}
			if p, ok := later[k]; ok {
				next[i][j] = p
			} else {
				next[i][j] = -1
			}
			pos++
			later[k] = pos
		}
	}
	resident := map[blockKey]int{} // block → the position of its next use
	h := &byNextUse{}
	for i := range accs {
		a := &accs[i]
		if a.dropped {
			continue
		}
		leading := true
		for j, id := range a.ids {
			k := blockKey{a.ns, id}
			if _, ok := resident[k]; ok && leading {
				hits[i]++
			} else {
				leading = false
			}
			resident[k] = next[i][j]
			heap.Push(h, residentBlock{k, next[i][j]})
			for len(resident) > capacity {
				// Entries whose block was used again since are stale: skip them.
				b := heap.Pop(h).(residentBlock)
				if at, ok := resident[b.key]; ok && at == b.next {
					delete(resident, b.key)
				}
			}
		}
	}
	return hits
}

// residentBlock is a heap entry: a block and the next use it had when pushed.
type residentBlock struct {
	key  blockKey
	next int
}

// byNextUse is a heap with the block wanted last at the root (the smallest next, -1 for
// never: next counts from the end).
type byNextUse []residentBlock

func (h byNextUse) Len() int           { return len(h) }
func (h byNextUse) Less(i, j int) bool { return h[i].next < h[j].next }
func (h byNextUse) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *byNextUse) Push(x any)        { *h = append(*h, x.(residentBlock)) }
func (h *byNextUse) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
