package sessions

import (
	"context"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// fakeShared is an in-memory SharedBindings that records what the tracker reported.
type fakeShared struct {
	mu     sync.Mutex
	b      map[string]SharedBinding
	groups map[string][]GroupMember
	routed []string // "id(parent)→worker"
	ended  []string
	rel    []string // "id→worker"
}

func newFakeShared() *fakeShared {
	return &fakeShared{b: map[string]SharedBinding{}, groups: map[string][]GroupMember{}}
}

func (f *fakeShared) Lookup(id string) (SharedBinding, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.b[id]
	return b, ok
}

func (f *fakeShared) Routed(id, parent string, t kvkey.Target) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.routed = append(f.routed, id+"("+parent+")→"+t.Worker)
}

func (f *fakeShared) Group(parent string) []GroupMember {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.groups[parent]
}

func (f *fakeShared) Ended(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended = append(f.ended, id)
}

func (f *fakeShared) Released(id string, t kvkey.Target) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rel = append(f.rel, id+"→"+t.Worker)
}

func (f *fakeShared) Sync(context.Context, string, string) {}

func (f *fakeShared) set(id string, t kvkey.Target, seen time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.b[id] = SharedBinding{Target: t, Writer: "peer", Seen: seen}
}

// TestSharedHints: a replica that never routed a session (or a subagent's parent) takes its
// hints from the fleet's binding; its own later routing wins over a binding it learned before.
func TestSharedHints(t *testing.T) {
	sys := chain(1, 40)
	cases := []struct {
		name   string
		cfg    func(*Config)
		setup  func(m *Tracker, idx *fakeIndex, sh *fakeShared, clk *fakeClock)
		sid    string
		parent string
		want   []hintWant
	}{
		{"unknown here, bound in the fleet", nil,
			func(_ *Tracker, _ *fakeIndex, sh *fakeShared, clk *fakeClock) { sh.set("s", tB, clk.t) },
			"s", "", []hintWant{{tB, RuleSharedAffinity}}},
		{"fleet binding learned after the local turn wins", nil,
			func(m *Tracker, idx *fakeIndex, sh *fakeShared, clk *fakeClock) {
				route(m, idx, "s", "", tA, sys)
				sh.set("s", tC, clk.t.Add(time.Second)) // another replica rebound it since
			},
			"s", "", []hintWant{{tC, RuleSharedAffinity}}},
		{"local turn after the fleet binding wins (store unreachable since)", nil,
			func(m *Tracker, idx *fakeIndex, sh *fakeShared, clk *fakeClock) {
				sh.set("s", tC, clk.t.Add(-time.Second))
				route(m, idx, "s", "", tA, sys)
			},
			"s", "", []hintWant{{tA, RuleAffinity}}},
		{"subagent's first request: the parent's fleet binding", nil,
			func(_ *Tracker, _ *fakeIndex, sh *fakeShared, clk *fakeClock) { sh.set("root", tB, clk.t) },
			"kid", "root", []hintWant{{tB, RuleSharedParent}}},
		{"parent known only as a placeholder: fleet binding plus the siblings seen here", nil,
			func(m *Tracker, idx *fakeIndex, sh *fakeShared, clk *fakeClock) {
				route(m, idx, "kid1", "root", tC, chain(500, 4))
				sh.set("root", tB, clk.t)
			},
			"kid2", "root", []hintWant{{tC, RuleSiblingGroup}, {tB, RuleSharedParent}}},
		{"sibling-group mode: siblings first, the parent's binding only for the first",
			func(c *Config) { c.ParentMode = PlaceSiblingGroup },
			func(m *Tracker, idx *fakeIndex, sh *fakeShared, clk *fakeClock) {
				route(m, idx, "kid1", "root", tC, chain(500, 4))
				sh.set("root", tB, clk.t)
			},
			"kid2", "root", []hintWant{{tC, RuleSiblingGroup}}},
		{"siblings routed by other replicas: the fleet's sibling group", nil,
			func(_ *Tracker, _ *fakeIndex, sh *fakeShared, clk *fakeClock) {
				sh.set("root", tB, clk.t)
				sh.groups["root"] = []GroupMember{{Target: tC, Members: 2}}
			},
			"kid3", "root", []hintWant{{tC, RuleSharedSiblingGroup}, {tB, RuleSharedParent}}},
		{"sibling-group mode, siblings elsewhere in the fleet: the group alone",
			func(c *Config) { c.ParentMode = PlaceSiblingGroup },
			func(_ *Tracker, _ *fakeIndex, sh *fakeShared, clk *fakeClock) {
				sh.set("root", tB, clk.t)
				sh.groups["root"] = []GroupMember{{Target: tC, Members: 2}}
			},
			"kid3", "root", []hintWant{{tC, RuleSharedSiblingGroup}}},
		{"parent routed here, a sibling landed through another replica", nil,
			func(m *Tracker, idx *fakeIndex, sh *fakeShared, clk *fakeClock) {
				route(m, idx, "root", "", tA, sys)
				sh.groups["root"] = []GroupMember{{Target: tC, Members: 1}}
			},
			"kid", "root", []hintWant{{tA, RuleParent}, {tC, RuleSharedSiblingGroup}}},
		{"parent routed here: local placement as before", nil,
			func(m *Tracker, idx *fakeIndex, sh *fakeShared, clk *fakeClock) {
				route(m, idx, "root", "", tA, sys)
				sh.set("root", tA, clk.t)
			},
			"kid", "root", []hintWant{{tA, RuleParent}}},
		{"affinity off: no shared affinity either", func(c *Config) { c.AffinityBlocks = 0 },
			func(_ *Tracker, _ *fakeIndex, sh *fakeShared, clk *fakeClock) { sh.set("s", tB, clk.t) },
			"s", "", nil},
		{"parent-aware off: no shared parent", func(c *Config) { c.ParentAware = false },
			func(_ *Tracker, _ *fakeIndex, sh *fakeShared, clk *fakeClock) { sh.set("root", tB, clk.t) },
			"kid", "root", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			idx := newFakeIndex()
			m, clk := newTestManager(t, tc.cfg, idx)
			sh := newFakeShared()
			m.SetShared(sh)
			if tc.setup != nil {
				tc.setup(m, idx, sh, clk)
			}
			m.Observe(Identity{SessionID: tc.sid, ParentID: tc.parent})
			if got := hintPairs(m.Hints(tc.sid, tc.parent)); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("hints %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSharedReports: every routed turn and every end of session reaches the shared store,
// and the debug view shows the fleet's binding.
func TestSharedReports(t *testing.T) {
	idx := newFakeIndex()
	m, clk := newTestManager(t, nil, idx)
	sh := newFakeShared()
	m.SetShared(sh)
	route(m, idx, "s", "", tA, chain(1, 4))
	m.OnRouted("s", tB, nil)
	m.OnRouted("", tB, nil) // no session: nothing to share
	sh.set("s", tB, clk.t)
	v, ok := m.Debug("s", false)
	if !ok || v.Shared == nil || v.Shared.Target != tB {
		t.Fatalf("debug view shared = %+v (ok %v), want the fleet binding on %v", v.Shared, ok, tB)
	}
	route(m, idx, "kid", "s", tC, chain(900, 2))
	m.OnReleased("kid", tC)
	m.OnReleased("", tC) // no session: nothing to share
	m.End("s")
	want := []string{"s()→http://a", "s()→http://b", "kid(s)→http://c"}
	if !reflect.DeepEqual(sh.routed, want) || !reflect.DeepEqual(sh.ended, []string{"s"}) {
		t.Fatalf("routed %v ended %v, want %v and [s]", sh.routed, sh.ended, want)
	}
	if !reflect.DeepEqual(sh.rel, []string{"kid→http://c"}) {
		t.Fatalf("released %v, want [kid→http://c]", sh.rel)
	}
}
