package sessions

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

func TestOnRoutedAdvancesFrontierFromG1Match(t *testing.T) {
	idx := newFakeIndex()
	m, _ := newTestManager(t, nil, idx)
	prompt := chain(1000, 10)
	idx.store(tA, prompt[:6]...)
	m.OnRouted("s1", tA, prompt)
	if got := frontierDepths(m, "s1"); !reflect.DeepEqual(got, map[kvkey.Target][]int{tA: {6}}) {
		t.Fatalf("frontiers = %v, want a:[6]", got)
	}
	// Next turn: the worker now holds the whole first prompt plus the reply; the frontier moves down.
	turn2 := append(slices.Clone(prompt), chain(2000, 4)...)
	idx.store(tA, turn2...)
	m.OnRouted("s1", tA, turn2)
	if got := frontierDepths(m, "s1"); !reflect.DeepEqual(got, map[kvkey.Target][]int{tA: {14}}) {
		t.Fatalf("frontiers = %v, want a:[14]", got)
	}
	// A shallower match (an edited history) keeps the deeper frontier it descends from.
	m.OnRouted("s1", tA, prompt[:3])
	if got := frontierDepths(m, "s1"); !reflect.DeepEqual(got, map[kvkey.Target][]int{tA: {14}}) {
		t.Fatalf("frontiers = %v, want a:[14]", got)
	}
	// A divergent branch on the same worker is a second frontier.
	branch := append(slices.Clone(prompt[:4]), chain(3000, 3)...)
	idx.store(tA, branch...)
	m.OnRouted("s1", tA, branch)
	if got := frontierDepths(m, "s1"); !reflect.DeepEqual(got, map[kvkey.Target][]int{tA: {14, 7}}) {
		t.Fatalf("frontiers = %v, want a:[14 7]", got)
	}
	lin := m.Lineage("s1", tA, nil)
	if len(lin) != 2 {
		t.Fatalf("lineages = %d, want 2", len(lin))
	}
	anchor := kvkey.BlockHash(3000)
	lin = m.Lineage("s1", tA, &anchor)
	if len(lin) != 1 || !slices.Equal(lin[0], chain(3000, 3)) {
		t.Fatalf("anchored lineage = %v", lin)
	}
	checkInvariants(t, m)
}

func TestStoredEventsAttributedBySession(t *testing.T) {
	idx := newFakeIndex()
	m, _ := newTestManager(t, nil, idx)
	prompt := chain(1, 8)
	m.Observe(Identity{SessionID: "s1"})
	if err := m.ApplyStored(tA, prompt[:4], 0, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := m.ApplyStored(tA, prompt[4:], prompt[3], "s1"); err != nil {
		t.Fatal(err)
	}
	if got := frontierDepths(m, "s1"); !reflect.DeepEqual(got, map[kvkey.Target][]int{tA: {8}}) {
		t.Fatalf("frontiers = %v, want a:[8]", got)
	}
	// An event for an untracked session creates no state.
	if err := m.ApplyStored(tB, chain(500, 3), 0, "nobody"); err != nil {
		t.Fatal(err)
	}
	if st := m.Stats(); st.Nodes != 8 || st.Sessions != 1 {
		t.Fatalf("stats = %+v, want 8 nodes, 1 session", st)
	}
	// Conflicting parentage on an event is rejected with an error and changes nothing.
	err := m.ApplyStored(tA, []kvkey.BlockHash{prompt[5]}, 999, "s1")
	if !errors.Is(err, ErrConflictingParent) {
		t.Fatalf("err = %v, want ErrConflictingParent", err)
	}
	if got := frontierDepths(m, "s1"); !reflect.DeepEqual(got, map[kvkey.Target][]int{tA: {8}}) {
		t.Fatalf("frontiers after rejected event = %v", got)
	}
	checkInvariants(t, m)
}

// A route-time match recorded without its top (max_lineage_blocks) starts at a temporary root; a
// later stored event, even one attributed to no session, grafts it.
func TestRouteMatchTemporaryRootGraftedByStoredEvent(t *testing.T) {
	idx := newFakeIndex()
	m, _ := newTestManager(t, func(c *Config) { c.MaxLineageBlocks = 4 }, idx)
	prompt := chain(100, 10)
	idx.store(tA, prompt...)
	m.OnRouted("s1", tA, prompt)
	fs := m.Frontiers("s1")
	if len(fs) != 1 || fs[0].Depth != 4 || fs[0].Rooted {
		t.Fatalf("frontiers = %+v, want depth 4 unrooted", fs)
	}
	if err := m.ApplyStored(tA, prompt[:7], 0, ""); err != nil {
		t.Fatal(err)
	}
	fs = m.Frontiers("s1")
	if len(fs) != 1 || fs[0].Depth != 10 || !fs[0].Rooted {
		t.Fatalf("after graft: %+v, want depth 10 rooted", fs)
	}
	checkInvariants(t, m)
}

func TestRemovalRecedesFrontiers(t *testing.T) {
	idx := newFakeIndex()
	m, _ := newTestManager(t, nil, idx)
	p := chain(1, 10)
	idx.store(tA, p...)
	idx.store(tB, p...)
	m.OnRouted("s1", tA, p)
	m.OnRouted("s2", tA, p[:7])
	m.OnRouted("s1", tB, p)
	// The tail block goes: s1 recedes by one; s2 (depth 7) is untouched.
	idx.remove(tA, p[9])
	m.ApplyRemoved(tA, []kvkey.BlockHash{p[9]})
	want := map[string]map[kvkey.Target][]int{"s1": {tA: {9}, tB: {10}}, "s2": {tA: {7}}}
	for id, w := range want {
		if got := frontierDepths(m, id); !reflect.DeepEqual(got, w) {
			t.Fatalf("%s: %v, want %v", id, got, w)
		}
	}
	// A middle block goes: both recede to its parent (the nearest ancestor not removed); tB keeps all.
	idx.remove(tA, p[4], p[5])
	m.ApplyRemoved(tA, []kvkey.BlockHash{p[5], p[4]})
	want = map[string]map[kvkey.Target][]int{"s1": {tA: {4}, tB: {10}}, "s2": {tA: {4}}}
	for id, w := range want {
		if got := frontierDepths(m, id); !reflect.DeepEqual(got, w) {
			t.Fatalf("%s: %v, want %v", id, got, w)
		}
	}
	// The root goes: the frontiers on tA disappear.
	m.ApplyRemoved(tA, []kvkey.BlockHash{p[0]})
	if got := frontierDepths(m, "s2"); len(got) != 0 {
		t.Fatalf("s2 after root removal: %v", got)
	}
	if got := frontierDepths(m, "s1"); !reflect.DeepEqual(got, map[kvkey.Target][]int{tB: {10}}) {
		t.Fatalf("s1 after root removal: %v", got)
	}
	// Removing blocks nobody tracks is a no-op.
	m.ApplyRemoved(tB, []kvkey.BlockHash{12345})
	checkInvariants(t, m)
}

func TestClearDropsOnlyThatTarget(t *testing.T) {
	idx := newFakeIndex()
	m, _ := newTestManager(t, nil, idx)
	p := chain(1, 6)
	for _, tg := range []kvkey.Target{tA, tA1, tB} {
		idx.store(tg, p...)
	}
	m.OnRouted("s1", tA, p)
	m.OnRouted("s1", tA1, p)
	m.OnRouted("s2", tB, p)
	m.ApplyCleared(tA)
	if got := frontierDepths(m, "s1"); !reflect.DeepEqual(got, map[kvkey.Target][]int{tA1: {6}}) {
		t.Fatalf("s1 = %v, want only a#1", got)
	}
	if got := frontierDepths(m, "s2"); !reflect.DeepEqual(got, map[kvkey.Target][]int{tB: {6}}) {
		t.Fatalf("s2 = %v", got)
	}
	checkInvariants(t, m)
}

func TestSessionLRUEvictionReleasesNodes(t *testing.T) {
	idx := newFakeIndex()
	m, _ := newTestManager(t, func(c *Config) { c.MaxSessions = 2 }, idx)
	for i, id := range []string{"s1", "s2"} {
		p := chain(kvkey.BlockHash(1000*(i+1)), 50)
		idx.store(tA, p...)
		m.OnRouted(id, tA, p)
	}
	m.Observe(Identity{SessionID: "s1"}) // s1 is now the most recent; s2 is evicted next
	p3 := chain(3000, 50)
	idx.store(tA, p3...)
	m.OnRouted("s3", tA, p3)
	st := m.Stats()
	if st.Sessions != 2 || st.SessionsEvicted != 1 {
		t.Fatalf("stats = %+v, want 2 sessions, 1 eviction", st)
	}
	if m.Frontiers("s2") != nil {
		t.Fatal("s2 must be evicted")
	}
	if st.Nodes != 100 {
		t.Fatalf("nodes = %d, want 100 (s2's 50 released)", st.Nodes)
	}
	m.End("s1")
	m.End("s3")
	if st := m.Stats(); st.Nodes != 0 || st.Sessions != 0 || st.SessionsClosed != 2 {
		t.Fatalf("after closing: %+v", st)
	}
	checkInvariants(t, m)
}

// When the forest is full, least recently used sessions give their nodes up for the new update.
func TestForestCapEvictsOldSessions(t *testing.T) {
	idx := newFakeIndex()
	m, _ := newTestManager(t, func(c *Config) { c.MaxNodes = 64; c.SiblingPrefix = false }, idx)
	for i := range 5 {
		p := chain(kvkey.BlockHash(1000*(i+1)), 30)
		idx.store(tA, p...)
		m.OnRouted(string(rune('a'+i)), tA, p)
		checkInvariants(t, m)
	}
	st := m.Stats()
	if st.Nodes > 64 || st.SessionsEvicted != 3 || m.Frontiers("e") == nil || m.Frontiers("a") != nil {
		t.Fatalf("stats = %+v, frontiers(e)=%v", st, m.Frontiers("e"))
	}
	// An update larger than the whole forest is rejected, not applied partially.
	big := chain(9000, 65)
	idx.store(tB, big...)
	m.OnRouted("big", tB, big)
	if m.Stats().Rejected != 1 || len(m.Frontiers("big")) != 0 {
		t.Fatalf("oversized update: %+v", m.Stats())
	}
}

// The frontier update is guarded by the target's residency version (docs/ARCHITECTURE.md, "Sessions and frontiers").
func TestOnRoutedStaleMatchByResidencyVersion(t *testing.T) {
	p := chain(1, 8)
	cases := []struct {
		name      string
		interfere func(idx *fakeIndex, call int)
		wantDepth int // 0: no frontier
		stats     func(Stats) bool
	}{
		{"version unchanged", nil, 8, func(s Stats) bool { return s.StaleRetries == 0 }},
		{"one concurrent removal of another block: retry succeeds",
			func(idx *fakeIndex, call int) {
				if call == 1 {
					idx.remove(tA, 777)
				}
			}, 8, func(s Stats) bool { return s.StaleRetries == 1 && s.StaleDropped == 0 }},
		{"matched tail removed during the match: retry sees the shorter prefix",
			func(idx *fakeIndex, call int) {
				if call == 1 {
					idx.remove(tA, p[7])
				}
			}, 7, func(s Stats) bool { return s.StaleRetries == 1 }},
		{"churn on both attempts, prefix still resident: verified",
			func(idx *fakeIndex, call int) {
				if call <= 2 {
					idx.remove(tA, 777)
				}
			}, 8, func(s Stats) bool { return s.StaleVerified == 1 }},
		{"churn on both attempts and the matched blocks removed: dropped",
			func(idx *fakeIndex, call int) {
				if call == 2 {
					idx.remove(tA, p[2])
				} else if call == 1 {
					idx.remove(tA, 777)
				}
			}, 0, func(s Stats) bool { return s.StaleDropped == 1 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			idx := newFakeIndex()
			idx.store(tA, p...)
			m, _ := newTestManager(t, nil, idx)
			if tc.interfere != nil {
				idx.onDeepest = func(call int) { tc.interfere(idx, call) }
			}
			m.OnRouted("s1", tA, p)
			got := frontierDepths(m, "s1")[tA]
			if (tc.wantDepth == 0 && len(got) != 0) || (tc.wantDepth != 0 && !slices.Equal(got, []int{tc.wantDepth})) {
				t.Fatalf("frontier depths = %v, want %d", got, tc.wantDepth)
			}
			if !tc.stats(m.Stats()) {
				t.Fatalf("stats = %+v", m.Stats())
			}
			// Affinity is recorded even when the frontier update is dropped.
			if h := m.Hints("s1", ""); len(h) != 1 || h[0].Target != tA || h[0].Rule != RuleAffinity {
				t.Fatalf("hints = %+v", h)
			}
			checkInvariants(t, m)
		})
	}
}

// Frontier refs held by the reverse map must not alias when a freed slot is reused by another
// block: a removal of the new block must not touch a session that held the old one.
func TestSlotReuseDoesNotAliasSessions(t *testing.T) {
	idx := newFakeIndex()
	m, _ := newTestManager(t, func(c *Config) { c.SiblingPrefix = false }, idx)
	p := chain(1, 3)
	idx.store(tA, p...)
	m.OnRouted("old", tA, p)
	m.mu.Lock()
	oldRef := m.sess[m.byID["old"]].frontiers[0].node
	m.mu.Unlock()
	m.End("old")
	q := chain(50, 3)
	idx.store(tA, q...)
	m.OnRouted("new", tA, q)
	m.mu.Lock()
	newRef := m.sess[m.byID["new"]].frontiers[0].node
	_, staleOK := m.f.resolve(oldRef)
	m.mu.Unlock()
	if newRef.Slot != oldRef.Slot {
		t.Fatalf("slot not reused (old %v new %v): the test needs reuse", oldRef, newRef)
	}
	if staleOK {
		t.Fatal("stale frontier ref resolves after slot reuse")
	}
	if got := frontierDepths(m, "new"); !reflect.DeepEqual(got, map[kvkey.Target][]int{tA: {3}}) {
		t.Fatalf("new = %v", got)
	}
	checkInvariants(t, m)
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		set  func(*Config)
		want string // substring of the error; "" = valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"affinity off", func(c *Config) { c.AffinityBlocks = 0 }, ""},
		{"parent hint off", func(c *Config) { c.ParentBlocks = 0 }, ""},
		{"whole prefix recorded", func(c *Config) { c.MaxLineageBlocks = 0 }, ""},
		{"zero config is not the defaults", func(c *Config) { *c = Config{} }, "max_sessions"},
		{"negative max sessions", func(c *Config) { c.MaxSessions = -1 }, "max_sessions"},
		{"zero max nodes", func(c *Config) { c.MaxNodes = 0 }, "max_nodes"},
		{"frontiers per target above per session", func(c *Config) { c.MaxFrontiersPerTarget, c.MaxFrontiersPerSession = 8, 4 }, "max_frontiers_per_target"},
		{"zero frontiers per target", func(c *Config) { c.MaxFrontiersPerTarget = 0 }, "max_frontiers_per_target"},
		{"negative affinity", func(c *Config) { c.AffinityBlocks = -1 }, "affinity_blocks"},
		{"infinite affinity", func(c *Config) { c.AffinityBlocks = math.Inf(1) }, "affinity_blocks"},
		{"NaN parent blocks", func(c *Config) { c.ParentBlocks = math.NaN() }, "parent_blocks"},
		{"unknown parent mode", func(c *Config) { c.ParentMode = "nearest" }, "parent_mode"},
		{"empty parent mode", func(c *Config) { c.ParentMode = "" }, "parent_mode"},
		{"group targets", func(c *Config) { c.GroupTargets = 0 }, "group_targets"},
		{"negative lineage cap", func(c *Config) { c.MaxLineageBlocks = -1 }, "max_lineage_blocks"},
		{"negative pending ttl", func(c *Config) { c.PendingTTL = -time.Second }, "pending_ttl"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Defaults()
			tc.set(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("want valid, got %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("want an error naming %s, got %v", tc.want, err)
			}
			if _, nerr := New(c, nil, nil); (nerr == nil) != (err == nil) {
				t.Fatalf("New disagrees with Validate: %v vs %v", nerr, err)
			}
		})
	}
}

// TestZeroCreditIsOff: a credit of 0 turns its hint off; it does not mean "the default" (as it
// did when zero fields were filled from Defaults).
func TestZeroCreditIsOff(t *testing.T) {
	idx := newFakeIndex()
	p := chain(100, 8)
	for _, tc := range []struct {
		name             string
		set              func(*Config)
		affinity, parent bool
	}{
		{"defaults", nil, true, true},
		{"affinity_blocks 0", func(c *Config) { c.AffinityBlocks = 0 }, false, true},
		{"parent_blocks 0", func(c *Config) { c.ParentBlocks = 0 }, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := newTestManager(t, tc.set, idx)
			m.Observe(Identity{SessionID: "parent"})
			m.OnRouted("parent", tA, p)
			m.Observe(Identity{SessionID: "kid", ParentID: "parent"})
			gotParent := hasRule(m.Hints("kid", "parent"), RuleParent)
			m.OnRouted("kid", tB, p)
			gotAffinity := hasRule(m.Hints("kid", "parent"), RuleAffinity)
			if gotAffinity != tc.affinity || gotParent != tc.parent {
				t.Fatalf("affinity hint %v (want %v), parent hint %v (want %v)", gotAffinity, tc.affinity, gotParent, tc.parent)
			}
		})
	}
}

func hasRule(hs []Hint, rule string) bool {
	for _, h := range hs {
		if h.Rule == rule {
			return true
		}
	}
	return false
}
