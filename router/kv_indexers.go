package router

import (
	"sync"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
)

// IndexMatcher adapts the indexers' tiered index to the PrefixMatcher the KV policies read.
// indexers.Overlap's G2/G3 (blocks host memory, then disk, can add beyond the GPU prefix) are
// exactly TierMatch's.
func IndexMatcher(ix *indexers.Index) PrefixMatcher {
	m := &indexMatcher{ix: ix}
	m.pos.New = func() any { return make(map[kvkey.Target]int, 64) }
	m.ov.New = func() any { return new([]indexers.Overlap) }
	return m
}

type indexMatcher struct {
	ix  *indexers.Index
	pos sync.Pool // map[kvkey.Target]int: target → position in the candidates, reused
	ov  sync.Pool // *[]indexers.Overlap: Match results, reused (no allocation per request)
}

// MatchTiers implements PrefixMatcher.
func (m *indexMatcher) MatchTiers(hashes []kvkey.BlockHash, targets []kvkey.Target, out []TierMatch) {
	clear(out)
	buf := m.ov.Get().(*[]indexers.Overlap)
	defer m.ov.Put(buf)
	*buf = m.ix.MatchInto(hashes, *buf)
	ov := *buf
	if len(ov) == 0 {
		return
	}
	if len(ov)*len(targets) <= 256 {
		for _, o := range ov {
			for i, t := range targets {
				if t == o.Target {
					out[i] = TierMatch{G1: o.G1, G2: o.G2, G3: o.G3}
					break
				}
			}
		}
		return
	}
	pos := m.pos.Get().(map[kvkey.Target]int)
	defer m.pos.Put(pos)
	clear(pos)
	for i, t := range targets {
		pos[t] = i
	}
	for _, o := range ov {
		if i, ok := pos[o.Target]; ok {
			out[i] = TierMatch{G1: o.G1, G2: o.G2, G3: o.G3}
		}
	}
}

// NoteRouted implements RoutedRecorder (indexers.Index.NoteRouted).
func (m *indexMatcher) NoteRouted(t kvkey.Target, local []uint64, seq []kvkey.BlockHash) {
	m.ix.NoteRouted(t, local, seq)
}

// ManagerHealth reports a target's KV event stream healthy while its subscription is live or
// replaying and its index is exact, not approximate after lost batches
// (indexers.Manager.EventsHealthy: atomic state per target, no lock, no polling). A target with
// no subscription is not healthy (scored in approximate mode).
func ManagerHealth(m *indexers.Manager) EventHealth {
	return EventHealthFunc(m.EventsHealthy)
}
