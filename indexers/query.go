package indexers

import (
	"math/bits"

	"github.com/kvgate/kvgate/kvkey"
)

// Overlap is one target's match for a query of chained block hashes.
//
// Let D1 be the number of leading query blocks that are all resident in G1 on the target, D2
// the number of leading blocks each resident in G1 or G2, and D3 the number each resident in
// any tier (so D1 ≤ D2 ≤ D3). Then G1 = D1, G2 = D2 − D1 (blocks beyond the GPU prefix that
// host memory can supply, possibly interleaved with GPU blocks), and G3 = D3 − D2 (the further
// blocks disk can supply). G1+G2+G3 is the prefix the worker can serve without recompute.
type Overlap struct {
	Target kvkey.Target `json:"target"`
	G1     int          `json:"g1"`
	G2     int          `json:"g2"`
	G3     int          `json:"g3"`
}

// Match returns, for every target with at least one leading block resident in some tier, its
// Overlap with hashes (kvkey.BlockHashes of the request). Targets absent from the result
// have no overlap. Each table read takes one shard's read lock, which a writer holds only for
// a single entry update.
//
// For a target whose nested sets are orphan-free (every member's parent is a member, the normal
// state), membership along the query is monotone, so all such targets are resolved together by
// bisection: O(distinct depths × log n) lookups, and one lookup when nobody holds block 0.
// Targets with orphans (a middle block evicted, or events lost) are scanned linearly.
func (ix *Index) Match(hashes []kvkey.BlockHash) []Overlap { return ix.MatchInto(hashes, nil) }

// MatchInto is Match appending to out[:0], so that a caller reusing the slice makes queries
// allocation-free (a Match of many targets otherwise allocates its result).
func (ix *Index) MatchInto(hashes []kvkey.BlockHash, out []Overlap) []Overlap {
	out = out[:0]
	reg := ix.reg.Load()
	n := len(hashes)
	if n == 0 || reg.live.empty() {
		return out
	}
	if out == nil {
		out = make([]Overlap, 0, bits.OnesCount64(reg.live[0])+bits.OnesCount64(reg.live[1]))
	}
	var m matcher
	m.ix, m.h = ix, hashes
	var dirty tset
	for k := range numTiers {
		m.all[k] = reg.live
	}
	reg.live.each(func(s int) {
		ts := reg.bySlot[s]
		for k := range numTiers {
			if ts.orphans[k].Load() != 0 {
				m.all[k].clear(s)
				dirty.set(s)
			}
		}
	})
	// Clean targets: bisection between f(-1) = everyone and f(n) = no one.
	var f0, none tiers
	m.f(0, &m.all, &f0)
	m.split(-1, &m.all, 0, &f0)
	m.split(0, &f0, n, &none)
	// Dirty targets (in any set): walk from block 0 until they all dropped out.
	if !dirty.empty() {
		m.scan(reg, dirty)
	}
	reg.live.each(func(s int) {
		d1, d2, d3 := int(m.depth[0][s]), int(m.depth[1][s]), int(m.depth[2][s])
		if d3 == 0 {
			return
		}
		// Under a concurrent write the three sets may be read at different instants; keep the
		// result well-formed.
		d2 = max(d2, d1)
		d3 = max(d3, d2)
		out = append(out, Overlap{Target: reg.bySlot[s].target, G1: d1, G2: d2 - d1, G3: d3 - d2})
	})
	return out
}

type matcher struct {
	ix    *Index
	h     []kvkey.BlockHash
	all   tiers // clean targets per set
	depth [numTiers][MaxTargets]int32
}

// tiers holds one bitset per nested set (G1, G1∪G2, any tier).
type tiers [numTiers]tset

// eq compares word by word: cheaper than the generic array comparison (a memequal call) on
// the bisection's hot path.
func (a *tiers) eq(b *tiers) bool {
	for k := range numTiers {
		if a[k][0] != b[k][0] || a[k][1] != b[k][1] {
			return false
		}
	}
	return true
}

// f sets out to the clean targets holding block i, per nested set, restricted to within (the
// members at an earlier position: monotonicity, enforced against racing writers).
func (m *matcher) f(i int, within, out *tiers) {
	e := m.ix.lookup(m.h[i])
	for k := range numTiers {
		for w := range len(tset{}) {
			out[k][w] = e.in[k][w] & m.all[k][w] & within[k][w]
		}
	}
}

// split assigns depths to targets that drop out between positions lo and hi, given the member
// sets at both ends (flo ⊇ fhi by monotonicity).
func (m *matcher) split(lo int, flo *tiers, hi int, fhi *tiers) {
	if flo.eq(fhi) {
		return
	}
	if hi == lo+1 {
		for k := range numTiers {
			for w := range len(tset{}) {
				for x := flo[k][w] &^ fhi[k][w]; x != 0; x &= x - 1 {
					m.depth[k][w*64+bits.TrailingZeros64(x)] = int32(hi)
				}
			}
		}
		return
	}
	mid := lo + (hi-lo)/2
	var fm, fh tiers
	m.f(mid, flo, &fm)
	for k := range numTiers { // nobody is present at hi who was absent at mid
		for w := range len(tset{}) {
			fh[k][w] = fhi[k][w] & fm[k][w]
		}
	}
	m.split(lo, flo, mid, &fm)
	m.split(mid, &fm, hi, &fh)
}

// scan resolves targets with orphans by walking the query from the start.
func (m *matcher) scan(reg *registry, dirty tset) {
	var alive [numTiers]tset
	for k := range numTiers {
		alive[k] = reg.live.andNot(m.all[k]).and(dirty)
		alive[k].each(func(s int) { m.depth[k][s] = 0 })
	}
	for i := 0; i < len(m.h); i++ {
		if alive[0].empty() && alive[1].empty() && alive[2].empty() {
			return
		}
		e := m.ix.lookup(m.h[i])
		for k := range numTiers {
			alive[k] = alive[k].and(e.in[k])
			alive[k].each(func(s int) { m.depth[k][s] = int32(i + 1) })
		}
	}
}

// IsResidentG1 reports whether block hash h is resident on t's GPU.
func (ix *Index) IsResidentG1(t kvkey.Target, h kvkey.BlockHash) bool {
	ts := ix.reg.Load().byTarget[t]
	return ts != nil && ix.lookup(h).in[0].has(ts.slot)
}

// DeepestG1 returns how many leading blocks of hashes are resident on t's GPU.
func (ix *Index) DeepestG1(t kvkey.Target, hashes []kvkey.BlockHash) int {
	ts := ix.reg.Load().byTarget[t]
	if ts == nil || len(hashes) == 0 {
		return 0
	}
	if ts.orphans[0].Load() != 0 {
		for i, h := range hashes {
			if !ix.lookup(h).in[0].has(ts.slot) {
				return i
			}
		}
		return len(hashes)
	}
	// Monotone: binary search for the first absent block.
	lo, hi := 0, len(hashes)
	for lo < hi {
		mid := lo + (hi-lo)/2
		if ix.lookup(hashes[mid]).in[0].has(ts.slot) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}
