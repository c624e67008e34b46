package indexers

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/kvkey"
)

const modelBS = 4

// modelWorld is a reference model of the index: per target, the worker's opaque hashes with
// reference counts per tier, and a naive linear Match.
type modelWorld struct {
	docs    [][]uint32 // token sequences sharing prefixes
	hashes  [][]uint64 // request-side chained hashes of each doc (bare, as the model keys them)
	targets []kvkey.Target
	ext     []map[uint64]*modelExt
	// removed: worker hashes whose last reference went away → our hash, once the target has
	// shown a lower tier (lower); the index remembers far more than a walk removes, so the model
	// needs no bound.
	removed []map[uint64]uint64
	lower   []bool
}

type modelExt struct {
	our  uint64
	refs [numTiers]int
}

func newModelWorld(r *rand.Rand, nTargets int) *modelWorld {
	w := &modelWorld{}
	for d := range 8 {
		var toks []uint32
		if d > 0 && r.IntN(3) > 0 { // share a prefix with an earlier doc
			src := w.docs[r.IntN(d)]
			toks = slices.Clone(src[:modelBS*r.IntN(len(src)/modelBS+1)])
		}
		for len(toks) < modelBS*(6+r.IntN(8)) {
			toks = append(toks, uint32(r.IntN(50)))
		}
		w.docs = append(w.docs, toks)
		w.hashes = append(w.hashes, raw(kvkey.BlockHashes(toks, modelBS, kvkey.HashOptions{})))
	}
	for i := range nTargets {
		w.targets = append(w.targets, kvkey.Target{Worker: fmt.Sprintf("http://w%d", i/2), DPRank: i % 2})
		w.ext = append(w.ext, map[uint64]*modelExt{})
		w.removed = append(w.removed, map[uint64]uint64{})
		w.lower = append(w.lower, false)
	}
	return w
}

// extOf is the worker's opaque id for our hash (different per target, like vLLM's random NONE_HASH).
func extOf(ti int, our uint64) uint64 { return our*0x9e3779b97f4a7c15 + uint64(ti)*7919 + 1 }

var tierMedium = [numTiers]string{MediumGPU, MediumCPU, MediumDisk}

// step generates one random event for a target, applies it to the model and returns it.
func (w *modelWorld) step(r *rand.Rand, ti int) Event {
	m := w.ext[ti]
	tier := Tier(0)
	if x := r.IntN(10); x >= 7 {
		tier = Tier(1 + x%2)
	}
	switch op := r.IntN(20); {
	case op < 10: // store a run of a doc, usually after a known parent
		d := r.IntN(len(w.docs))
		hs := w.hashes[d]
		start := 0
		if r.IntN(3) > 0 {
			start = r.IntN(len(hs))
		}
		end := min(len(hs), start+1+r.IntN(4))
		ev := &BlockStored{TokenIDs: w.docs[d][start*modelBS : end*modelBS], BlockSize: modelBS,
			Medium: Some(tierMedium[tier]), GroupIdx: Some[int64](0)}
		w.lower[ti] = w.lower[ti] || tier != G1
		for _, h := range hs[start:end] {
			ev.BlockHashes = append(ev.BlockHashes, IntHash(extOf(ti, h)))
		}
		if start > 0 {
			ev.ParentBlockHash = Some(IntHash(extOf(ti, hs[start-1])))
			if _, ok := m[extOf(ti, hs[start-1])]; !ok {
				return ev // parent_not_found: the model drops it too
			}
		}
		for _, h := range hs[start:end] {
			e := m[extOf(ti, h)]
			if e == nil {
				e = &modelExt{our: h}
				m[extOf(ti, h)] = e
			}
			e.refs[tier]++
		}
		return ev
	case op < 12: // token-less lower-tier store of a known hash, or of one removed recently
		tier = Tier(1 + r.IntN(2))
		ev := &BlockStored{TokenIDs: []uint32{}, Medium: Some(tierMedium[tier])}
		w.lower[ti] = true
		if r.IntN(2) == 0 {
			for x, our := range w.removed[ti] {
				ev.BlockHashes = append(ev.BlockHashes, IntHash(x))
				if e := m[x]; e != nil { // stored again since: the known entry wins
					e.refs[tier]++
				} else {
					m[x] = &modelExt{our: our}
					m[x].refs[tier]++
					delete(w.removed[ti], x)
				}
				return ev
			}
		}
		for x, e := range m {
			ev.BlockHashes = append(ev.BlockHashes, IntHash(x))
			e.refs[tier]++
			break
		}
		return ev
	case op < 18: // remove a resident hash (possibly mid-chain → orphans)
		for x, e := range m {
			for t := range Tier(numTiers) {
				if e.refs[t] > 0 {
					e.refs[t]--
					if e.refs == [numTiers]int{} {
						delete(m, x)
						if w.lower[ti] {
							w.removed[ti][x] = uint64(e.our)
						}
					}
					return &BlockRemoved{BlockHashes: []WireHash{IntHash(x)}, Medium: Some(tierMedium[t])}
				}
			}
		}
		return &BlockRemoved{BlockHashes: []WireHash{IntHash(12345)}}
	case op < 19:
		for x, e := range m {
			if w.lower[ti] && e.refs[G1] > 0 && e.refs == [numTiers]int{G1: e.refs[G1]} {
				w.removed[ti][x] = uint64(e.our)
			}
			e.refs[G1] = 0
			if e.refs == [numTiers]int{} {
				delete(m, x)
			}
		}
		return &AllBlocksCleared{}
	default:
		clear(m)
		clear(w.removed[ti])
		return nil // reset
	}
}

func (w *modelWorld) resident(ti int, k int, our uint64) bool {
	for _, e := range w.ext[ti] {
		if uint64(e.our) == our {
			for j := 0; j <= k; j++ {
				if e.refs[j] > 0 {
					return true
				}
			}
		}
	}
	return false
}

func (w *modelWorld) match(ti int, hs []uint64) [numTiers]int {
	var d [numTiers]int
	for k := range numTiers {
		for d[k] < len(hs) && w.resident(ti, k, hs[d[k]]) {
			d[k]++
		}
	}
	return d
}

func TestIndexMatchesModel(t *testing.T) {
	orphanSteps := 0
	for seed := range uint64(12) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 99))
			w := newModelWorld(r, 6)
			ix := NewIndex(Options{BlockSize: modelBS})
			lastVersion := make([]uint64, len(w.targets))
			for step := range 600 {
				ti := r.IntN(len(w.targets))
				ev := w.step(r, ti)
				if ev == nil {
					ix.Reset(w.targets[ti])
				} else if err := ix.Apply(w.targets[ti], &EventBatch{Events: []Event{ev}}); err != nil {
					t.Fatal(err)
				}
				v := ix.ResidencyVersion(w.targets[ti])
				switch ev.(type) {
				case *BlockRemoved, *AllBlocksCleared, nil:
					if v <= lastVersion[ti] {
						t.Fatalf("step %d: residency version did not increase on %T", step, ev)
					}
				}
				lastVersion[ti] = v
				w.check(t, ix, step, r)
				w.checkOrphans(t, ix, step)
				for _, tg := range w.targets {
					if ts := ix.reg.Load().byTarget[tg]; ts != nil && ts.orphans[0].Load() > 0 {
						orphanSteps++
					}
				}
			}
		})
	}
	if orphanSteps == 0 {
		t.Fatal("the random walk never produced orphans: the linear fallback went untested")
	}
	t.Logf("target-steps with G1 orphans: %d", orphanSteps)
}

// check compares every query form against the model for every doc prefix.
func (w *modelWorld) check(t *testing.T, ix *Index, step int, r *rand.Rand) {
	t.Helper()
	for d, hs := range w.hashes {
		q := hs[:1+r.IntN(len(hs))]
		got := map[kvkey.Target]Overlap{}
		for _, o := range ix.Match(typed(q)) {
			got[o.Target] = o
		}
		for ti, tg := range w.targets {
			want := w.match(ti, q)
			o := got[tg]
			if o.G1 != want[0] || o.G1+o.G2 != want[1] || o.G1+o.G2+o.G3 != want[2] {
				t.Fatalf("step %d doc %d target %s: got %+v, model depths %v", step, d, tg, o, want)
			}
			if g := ix.DeepestG1(tg, typed(q)); g != want[0] {
				t.Fatalf("step %d: DeepestG1 = %d, model %d", step, g, want[0])
			}
			h := q[r.IntN(len(q))]
			if ix.IsResidentG1(tg, kvkey.BlockHash(h)) != w.resident(ti, 0, h) {
				t.Fatalf("step %d: IsResidentG1 disagrees", step)
			}
		}
	}
}

// checkOrphans compares the index's orphan counts (which decide bisection vs scan) with the
// model: members of set k whose parent block is not a member.
func (w *modelWorld) checkOrphans(t *testing.T, ix *Index, step int) {
	t.Helper()
	parent := map[uint64]uint64{}
	for _, hs := range w.hashes {
		for i := 1; i < len(hs); i++ {
			parent[hs[i]] = hs[i-1]
		}
	}
	for ti, tg := range w.targets {
		ts := ix.reg.Load().byTarget[tg]
		if ts == nil {
			continue
		}
		for k := range numTiers {
			seen := map[uint64]bool{}
			want := int64(0)
			for _, e := range w.ext[ti] {
				if seen[uint64(e.our)] || !w.resident(ti, k, uint64(e.our)) {
					continue
				}
				seen[uint64(e.our)] = true
				if p, ok := parent[uint64(e.our)]; ok && !w.resident(ti, k, p) {
					want++
				}
			}
			if got := ts.orphans[k].Load(); got != want {
				t.Fatalf("step %d target %s set %d: orphans %d, model %d", step, tg, k, got, want)
			}
		}
	}
}

// Readers run while a writer applies random events: every result stays well-formed (and -race
// checks the locking).
func TestConcurrentReadersUnderWrites(t *testing.T) {
	r := rand.New(rand.NewPCG(42, 1))
	w := newModelWorld(r, 4)
	ix := NewIndex(Options{BlockSize: modelBS})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 3000 {
			ti := r.IntN(len(w.targets))
			if ev := w.step(r, ti); ev != nil {
				_ = ix.Apply(w.targets[ti], &EventBatch{Events: []Event{ev}})
			} else {
				ix.Reset(w.targets[ti])
			}
		}
	}()
	for {
		select {
		case <-done:
			return
		default:
		}
		for _, hs := range w.hashes {
			for _, o := range ix.Match(typed(hs)) {
				if o.G1 < 0 || o.G2 < 0 || o.G3 < 0 || o.G1+o.G2+o.G3 > len(hs) {
					t.Fatalf("malformed overlap %+v for %d blocks", o, len(hs))
				}
			}
			_ = ix.DeepestG1(w.targets[0], typed(hs))
		}
	}
}
