package indexers

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// matchBefore is Match as it was before the word-wise bisection rewrite (sets passed and
// compared by value) and the reusable result slice, kept only so BenchmarkMatchBeforeAfter can
// measure both in one run.
func matchBefore(ix *Index, hashes []kvkey.BlockHash) []Overlap {
	reg := ix.reg.Load()
	depth := matchBeforeDepths(ix, hashes)
	var out []Overlap
	reg.live.each(func(s int) {
		d1, d2, d3 := int(depth[0][s]), int(depth[1][s]), int(depth[2][s])
		if d3 == 0 {
			return
		}
		d2 = max(d2, d1)
		d3 = max(d3, d2)
		out = append(out, Overlap{Target: reg.bySlot[s].target, G1: d1, G2: d2 - d1, G3: d3 - d2})
	})
	return out
}

func matchBeforeDepths(ix *Index, hashes []kvkey.BlockHash) *[numTiers][MaxTargets]int32 {
	reg := ix.reg.Load()
	var m beforeMatcher
	m.ix, m.h = ix, hashes
	for k := range numTiers {
		m.all[k] = reg.live
	}
	reg.live.each(func(s int) {
		for k := range numTiers {
			if reg.bySlot[s].orphans[k].Load() != 0 {
				m.all[k].clear(s)
			}
		}
	})
	f0 := m.f(0)
	m.split(-1, m.all, 0, f0)
	m.split(0, f0, len(hashes), [numTiers]tset{})
	return &m.depth
}

type beforeMatcher struct {
	ix    *Index
	h     []kvkey.BlockHash
	all   [numTiers]tset
	depth [numTiers][MaxTargets]int32
}

func (m *beforeMatcher) f(i int) [numTiers]tset {
	e := m.ix.lookup(m.h[i])
	return [numTiers]tset{e.in[0].and(m.all[0]), e.in[1].and(m.all[1]), e.in[2].and(m.all[2])}
}

func (m *beforeMatcher) split(lo int, flo [numTiers]tset, hi int, fhi [numTiers]tset) {
	if flo == fhi {
		return
	}
	if hi == lo+1 {
		for k := range numTiers {
			flo[k].andNot(fhi[k]).each(func(s int) { m.depth[k][s] = int32(hi) })
		}
		return
	}
	mid := lo + (hi-lo)/2
	fm := m.f(mid)
	for k := range numTiers {
		fm[k] = fm[k].and(flo[k])
		fhi[k] = fhi[k].and(fm[k])
	}
	m.split(lo, flo, mid, fm)
	m.split(mid, fm, hi, fhi)
}

// BenchmarkMatchBeforeAfter: the worst-case Match (8,192 blocks, 64 targets each at a different
// depth) as before (old bisection, result grown by append: 7 allocations) and now (word-wise
// bisection, reused result slice: none), alternating call by call so that both see the same
// machine noise, alone and under a concurrent writer. Reports p50/p99 of each and the ratio.
func BenchmarkMatchBeforeAfter(b *testing.B) {
	f := newBenchFleet(b, 64)
	if want, got := matchBefore(f.ix, f.query), f.ix.Match(f.query); !slices.Equal(want, got) || len(got) != 64 {
		b.Fatalf("before and after disagree: %v vs %v", want, got)
	}
	for _, writers := range []int{0, 1} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range writers {
				wg.Go(func() {
					var cs ChangeSet
					for {
						select {
						case <-stop:
							return
						default:
							f.applyCycle(b, &cs)
						}
					}
				})
			}
			var before, after []time.Duration
			var buf []Overlap // reused, as Index.MatchTiers does
			for b.Loop() {
				t0 := time.Now()
				matchBefore(f.ix, f.query)
				t1 := time.Now()
				buf = f.ix.MatchInto(f.query, buf)
				before, after = append(before, t1.Sub(t0)), append(after, time.Since(t1))
			}
			close(stop)
			wg.Wait()
			pct := func(l []time.Duration, p int) float64 {
				slices.Sort(l)
				return float64(l[len(l)*p/100].Nanoseconds())
			}
			b50, b99, a50, a99 := pct(before, 50), pct(before, 99), pct(after, 50), pct(after, 99)
			b.ReportMetric(b50, "before-p50-ns")
			b.ReportMetric(b99, "before-p99-ns")
			b.ReportMetric(a50, "after-p50-ns")
			b.ReportMetric(a99, "after-p99-ns")
			b.ReportMetric(a50/b50, "p50-ratio")
		})
	}
}
