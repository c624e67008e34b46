package indexers

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// The global block table maps our block hash → gentry (target bitsets per nested set), split
// into shards so writers of different targets rarely meet. The index uses rwTable: a Go map
// per shard under an RWMutex (a writer holds it for one map update).
//
// seqTable is the measured alternative: an open-addressing table per shard under a sequence
// lock, so readers never lock and retry when a writer moved the sequence (all words atomic).
// On the shared 2-core test machine it had the same median Match latency but a far worse tail
// under concurrent writes (a writer preempted mid-update makes readers spin: p99 ≈ 4 ms vs
// ≈ 0.24 ms), so it is kept only for BenchmarkMatch/BenchmarkApply comparisons.

const words = numTiers * len(tset{}) // uint64 words per entry

type slot struct {
	key atomic.Uint64 // 0 = never used
	w   [words]atomic.Uint64
}

type seqShard struct {
	mu   sync.Mutex // writers only
	seq  atomic.Uint64
	tab  atomic.Pointer[[]slot]
	used int // slots with a key (live or dead), writer-owned
	live int // slots with a non-empty entry
	_    [16]byte
}

// seqTable is the seqlock table (see the comment at the top of this file).
type seqTable struct{ shards [numShards]seqShard }

func newSeqTable() *seqTable {
	t := &seqTable{}
	for i := range t.shards {
		tab := make([]slot, 64)
		t.shards[i].tab.Store(&tab)
	}
	return t
}

func tableKey(h uint64) uint64 {
	if h == 0 { // 0 marks an empty slot
		return 1
	}
	return h
}

func (t *seqTable) shard(h uint64) *seqShard { return &t.shards[(h>>32^h)&(numShards-1)] }

// get returns a block's residency without locking.
func (t *seqTable) get(h uint64) gentry {
	k := tableKey(h)
	sh := t.shard(h)
	for spins := 0; ; spins++ {
		s1 := sh.seq.Load()
		if s1&1 != 0 {
			if spins > 64 {
				runtime.Gosched()
			}
			continue
		}
		e := probeRead(*sh.tab.Load(), k)
		if sh.seq.Load() == s1 {
			return e
		}
	}
}

func probeRead(tab []slot, k uint64) gentry {
	mask := uint64(len(tab) - 1)
	i := mix(k) & mask
	var e gentry
	for range tab { // bounded even if a concurrent writer left the table inconsistent
		switch tab[i].key.Load() {
		case k:
			for j := range words {
				e.in[j/2][j%2] = tab[i].w[j].Load()
			}
			return e
		case 0:
			return e
		}
		i = (i + 1) & mask
	}
	return e
}

// mix spreads the shard-selecting bits away from the probe start.
func mix(k uint64) uint64 { return (k ^ k>>29) * 0xbf58476d1ce4e5b9 >> 7 }

// apply sets (on) or clears target slot in the nested sets of mask.
func (e *gentry) apply(slot int, mask uint8, on bool) {
	for k := range numTiers {
		if mask&(1<<k) == 0 {
			continue
		}
		if on {
			e.in[k].set(slot)
		} else {
			e.in[k].clear(slot)
		}
	}
}

// update changes h's entry under the shard's writer lock and sequence.
func (t *seqTable) update(h uint64, slot int, mask uint8, on bool) {
	k := tableKey(h)
	sh := t.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	tab := *sh.tab.Load()
	tm := uint64(len(tab) - 1)
	i := mix(k) & tm
	free := -1
	for {
		kk := tab[i].key.Load()
		if kk == k {
			break
		}
		if kk == 0 {
			if free >= 0 {
				i = uint64(free)
			}
			break
		}
		if free < 0 && isEmptySlot(&tab[i]) {
			free = int(i) // a dead slot we may reuse if k is not further along
		}
		i = (i + 1) & tm
	}
	var e gentry
	found := tab[i].key.Load() == k
	if found {
		for j := range words {
			e.in[j/2][j%2] = tab[i].w[j].Load()
		}
	}
	wasLive := found && !e.isEmpty()
	e.apply(slot, mask, on)
	isLive := !e.isEmpty()
	if !found && !isLive {
		return
	}
	sh.seq.Add(1) // odd: readers retry
	if !found {
		if tab[i].key.Load() == 0 {
			sh.used++
		}
		tab[i].key.Store(k)
	}
	for j := range words {
		tab[i].w[j].Store(e.in[j/2][j%2])
	}
	switch {
	case isLive && !wasLive:
		sh.live++
	case !isLive && wasLive:
		sh.live--
	}
	if sh.used*8 >= len(tab)*7 {
		sh.rehash(tab)
	}
	sh.seq.Add(1)
}

func (e *gentry) isEmpty() bool { return e.in[0].empty() && e.in[1].empty() && e.in[2].empty() }

func isEmptySlot(s *slot) bool {
	for j := range words {
		if s.w[j].Load() != 0 {
			return false
		}
	}
	return true
}

// rehash rebuilds the shard without dead slots, growing it when mostly live. Called inside
// the writer's odd sequence.
func (sh *seqShard) rehash(old []slot) {
	size := len(old)
	if sh.live*2 >= size {
		size *= 2
	}
	for size > 64 && sh.live*4 < size {
		size /= 2
	}
	tab := make([]slot, size)
	mask := uint64(size - 1)
	for i := range old {
		k := old[i].key.Load()
		if k == 0 || isEmptySlot(&old[i]) {
			continue
		}
		j := mix(k) & mask
		for tab[j].key.Load() != 0 {
			j = (j + 1) & mask
		}
		tab[j].key.Store(k)
		for w := range words {
			tab[j].w[w].Store(old[i].w[w].Load())
		}
	}
	sh.used = sh.live
	sh.tab.Store(&tab)
}

// rwTable is the table the index uses: a Go map per shard under an RWMutex.
type rwTable struct {
	shards [numShards]struct {
		mu sync.RWMutex
		m  map[uint64]gentry
		_  [40]byte
	}
}

func newRWTable() *rwTable {
	t := &rwTable{}
	for i := range t.shards {
		t.shards[i].m = map[uint64]gentry{}
	}
	return t
}

func (t *rwTable) get(h uint64) gentry {
	s := &t.shards[(h>>32^h)&(numShards-1)]
	s.mu.RLock()
	e := s.m[h]
	s.mu.RUnlock()
	return e
}

func (t *rwTable) update(h uint64, slot int, mask uint8, on bool) {
	s := &t.shards[(h>>32^h)&(numShards-1)]
	s.mu.Lock()
	e := s.m[h]
	e.apply(slot, mask, on)
	if e.isEmpty() {
		delete(s.m, h)
	} else {
		s.m[h] = e
	}
	s.mu.Unlock()
}

// blockTable is what the index needs from the global table.
type blockTable interface {
	get(h uint64) gentry
	update(h uint64, slot int, mask uint8, on bool)
}
