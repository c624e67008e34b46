package sessions

import (
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// fakeIndex is a minimal physical G1 index: resident sets and residency versions per target.
// onDeepest, when set, runs inside DeepestG1 (after the match was taken) to inject concurrent
// removals between the match and the session update.
type fakeIndex struct {
	mu        sync.Mutex
	res       map[kvkey.Target]map[kvkey.BlockHash]bool
	ver       map[kvkey.Target]uint64
	onDeepest func(call int)
	calls     int
}

func newFakeIndex() *fakeIndex {
	return &fakeIndex{res: map[kvkey.Target]map[kvkey.BlockHash]bool{}, ver: map[kvkey.Target]uint64{}}
}

func (x *fakeIndex) store(t kvkey.Target, hs ...kvkey.BlockHash) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.res[t] == nil {
		x.res[t] = map[kvkey.BlockHash]bool{}
	}
	for _, h := range hs {
		x.res[t][h] = true
	}
}

func (x *fakeIndex) remove(t kvkey.Target, hs ...kvkey.BlockHash) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, h := range hs {
		delete(x.res[t], h)
	}
	x.ver[t]++
}

func (x *fakeIndex) ResidencyVersion(t kvkey.Target) uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.ver[t]
}

func (x *fakeIndex) IsResidentG1(t kvkey.Target, h kvkey.BlockHash) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.res[t][h]
}

func (x *fakeIndex) DeepestG1(t kvkey.Target, hs []kvkey.BlockHash) int {
	x.mu.Lock()
	n := 0
	for n < len(hs) && x.res[t][hs[n]] {
		n++
	}
	x.calls++
	call, hook := x.calls, x.onDeepest
	x.mu.Unlock()
	if hook != nil {
		hook(call)
	}
	return n
}

var (
	tA  = kvkey.Target{Worker: "http://a", DPRank: 0}
	tB  = kvkey.Target{Worker: "http://b", DPRank: 0}
	tC  = kvkey.Target{Worker: "http://c", DPRank: 0}
	tA1 = kvkey.Target{Worker: "http://a", DPRank: 1}
)

// fakeClock is a settable clock for TTL tests.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// newTestManager builds a tracker from Defaults changed by set (nil: the defaults as they are).
func newTestManager(t *testing.T, set func(*Config), idx Residency) (*Tracker, *fakeClock) {
	t.Helper()
	cfg := Defaults()
	if set != nil {
		set(&cfg)
	}
	m, err := New(cfg, idx, nil)
	if err != nil {
		t.Fatal(err)
	}
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	m.now = clk.now
	return m, clk
}

// frontierDepths returns target → depths of the session's frontiers there.
func frontierDepths(m *Tracker, id string) map[kvkey.Target][]int {
	out := map[kvkey.Target][]int{}
	for _, f := range m.Frontiers(id) {
		out[f.Target] = append(out[f.Target], f.Depth)
	}
	return out
}

// checkInvariants verifies the reverse map and forest reference counts against session state.
func checkInvariants(t *testing.T, m *Tracker) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	refs := map[uint32]uint32{}
	revCount := 0
	for slot := range m.sess {
		s := &m.sess[slot]
		if !s.live {
			continue
		}
		r := sessRef{slot: uint32(slot), gen: s.gen}
		for _, fr := range s.frontiers {
			ns, ok := m.f.resolve(fr.node)
			if !ok {
				t.Fatalf("session %s holds a dead frontier ref", s.id)
			}
			refs[ns]++
			found := false
			for _, x := range m.rev[fr.target][fr.node].appendTo(nil) {
				found = found || x == r
			}
			if !found {
				t.Fatalf("session %s frontier on %s missing from the reverse map", s.id, fr.target)
			}
			revCount++
		}
		if s.hasPending {
			ns, ok := m.f.resolve(s.pending.node)
			if !ok {
				t.Fatalf("session %s holds a dead pending ref", s.id)
			}
			refs[ns]++
		}
	}
	n := 0
	for _, byNode := range m.rev {
		for _, l := range byNode {
			if l.n != len(l.appendTo(nil)) || l.n == 0 {
				t.Fatalf("reverse list count %d, entries %d", l.n, len(l.appendTo(nil)))
			}
			n += l.n
		}
	}
	if n != revCount {
		t.Fatalf("reverse map holds %d entries, sessions %d frontiers", n, revCount)
	}
	for slot := range m.f.nodes {
		nd := &m.f.nodes[slot]
		if nd.flags&flagLive == 0 {
			continue
		}
		if nd.refs != refs[uint32(slot)] {
			t.Fatalf("node %x refs=%d, sessions hold %d", nd.hash, nd.refs, refs[uint32(slot)])
		}
		if nd.refs == 0 && nd.children == 0 {
			t.Fatalf("node %x is an unreferenced leaf that was not reclaimed", nd.hash)
		}
	}
}

// withSiblingPrefix returns Defaults with sibling-prefix credit on or off.
func withSiblingPrefix(on bool) Config {
	c := Defaults()
	c.SiblingPrefix = on
	return c
}
