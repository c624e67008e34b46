package sessions

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

type hintWant struct {
	target kvkey.Target
	rule   string
}

func hintPairs(hs []Hint) []hintWant {
	var out []hintWant
	for _, h := range hs {
		out = append(out, hintWant{h.Target, h.Rule})
	}
	return out
}

// route records a request of id (child of parent) routed to target with its whole prompt resident.
func route(m *Tracker, idx *fakeIndex, id, parent string, target kvkey.Target, prompt []kvkey.BlockHash) {
	m.Observe(Identity{SessionID: id, ParentID: parent})
	idx.store(target, prompt...)
	m.OnRouted(id, target, prompt)
}

func TestHints(t *testing.T) {
	sys := chain(1, 40) // the root's long system prompt
	cases := []struct {
		name   string
		cfg    func(*Config)
		setup  func(m *Tracker, idx *fakeIndex)
		sid    string
		parent string
		want   []hintWant
	}{
		{"no identity", nil, nil, "", "", nil},
		{"unknown session without parent", nil, nil, "x", "", nil},
		{"later turn: affinity", nil,
			func(m *Tracker, idx *fakeIndex) { route(m, idx, "s", "", tB, sys) },
			"s", "", []hintWant{{tB, RuleAffinity}}},
		{"affinity wins over the parent", nil,
			func(m *Tracker, idx *fakeIndex) {
				route(m, idx, "root", "", tA, sys)
				route(m, idx, "kid", "root", tB, append(slices.Clone(sys), 99))
			},
			"kid", "root", []hintWant{{tB, RuleAffinity}}},
		{"first request of a child: the parent's frontier", nil,
			func(m *Tracker, idx *fakeIndex) { route(m, idx, "root", "", tA, sys) },
			"kid", "root", []hintWant{{tA, RuleParent}}},
		{"parent taken from the session record when the request omits it", nil,
			func(m *Tracker, idx *fakeIndex) {
				route(m, idx, "root", "", tA, sys)
				m.Observe(Identity{SessionID: "kid", ParentID: "root"})
			},
			"kid", "", []hintWant{{tA, RuleParent}}},
		{"parent-aware placement off", func(c *Config) { c.ParentAware = false },
			func(m *Tracker, idx *fakeIndex) { route(m, idx, "root", "", tA, sys) },
			"kid", "root", nil},
		{"unknown parent", nil, nil, "kid", "ghost", nil},
		{"parent known by affinity only (no G1 match)", nil,
			func(m *Tracker, _ *fakeIndex) { m.OnRouted("root", tC, chain(500, 3)) },
			"kid", "root", []hintWant{{tC, RuleParent}}},
		{"lineage root", func(c *Config) { c.ParentMode = PlaceLineageRoot },
			func(m *Tracker, idx *fakeIndex) {
				route(m, idx, "root", "", tC, sys)
				route(m, idx, "mid", "root", tB, chain(700, 5))
			},
			"leaf", "mid", []hintWant{{tC, RuleLineageRoot}}},
		{"sibling group, first sibling follows the parent", func(c *Config) { c.ParentMode = PlaceSiblingGroup },
			func(m *Tracker, idx *fakeIndex) { route(m, idx, "root", "", tA, sys) },
			"kid1", "root", []hintWant{{tA, RuleParent}}},
		{"sibling group follows where siblings landed", func(c *Config) { c.ParentMode = PlaceSiblingGroup },
			func(m *Tracker, idx *fakeIndex) {
				route(m, idx, "root", "", tA, sys)
				route(m, idx, "kid1", "root", tB, append(slices.Clone(sys), 1000))
			},
			"kid2", "root", []hintWant{{tB, RuleSiblingGroup}}},
		{"spilled group: the parent's worker and the warmed second worker", nil,
			func(m *Tracker, idx *fakeIndex) {
				route(m, idx, "root", "", tA, sys)
				route(m, idx, "kid1", "root", tA, append(slices.Clone(sys), 1000))
				route(m, idx, "kid2", "root", tB, append(slices.Clone(sys), 2000)) // tA was busy
			},
			"kid3", "root", []hintWant{{tA, RuleParent}, {tB, RuleSiblingGroup}}},
		{"group remembers at most group_targets targets", func(c *Config) { c.GroupTargets = 1 },
			func(m *Tracker, idx *fakeIndex) {
				route(m, idx, "root", "", tA, sys)
				route(m, idx, "kid1", "root", tB, chain(3000, 2))
				route(m, idx, "kid2", "root", tC, chain(4000, 2))
			},
			"kid3", "root", []hintWant{{tA, RuleParent}, {tC, RuleSiblingGroup}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			idx := newFakeIndex()
			m, _ := newTestManager(t, tc.cfg, idx)
			if tc.setup != nil {
				tc.setup(m, idx)
			}
			got := m.Hints(tc.sid, tc.parent)
			if !reflect.DeepEqual(hintPairs(got), tc.want) {
				t.Fatalf("hints = %+v, want %+v", got, tc.want)
			}
			for _, h := range got {
				wantBlocks := m.cfg.ParentBlocks
				if h.Rule == RuleAffinity {
					wantBlocks = m.cfg.AffinityBlocks
				}
				if h.Blocks != wantBlocks {
					t.Fatalf("hint %+v: blocks %v, want %v", h, h.Blocks, wantBlocks)
				}
			}
			checkInvariants(t, m)
		})
	}
}

// The lineage-aware extra: a child's first request is credited for the blocks its parent's or
// siblings' in-flight requests are prefilling on a target, until KV events announce them (then
// the index credits them instead) or the pending TTL passes.
func TestHintsWithPrefixCreditsInFlightRelatives(t *testing.T) {
	idx := newFakeIndex()
	m, clk := newTestManager(t, func(c *Config) { c.PendingTTL = 10 * time.Second }, idx)
	sys := chain(1, 20)
	// The root was routed to tA; only its first 5 blocks were resident then (the rest is prefilling).
	idx.store(tA, sys[:5]...)
	m.Observe(Identity{SessionID: "root"})
	m.OnRouted("root", tA, sys)

	kid1 := append(slices.Clone(sys[:15]), chain(100, 5)...)
	got := m.HintsWithPrefix("kid1", "root", kid1)
	want := []Hint{{Target: tA, Rule: RuleParent, Blocks: m.cfg.ParentBlocks},
		{Target: tA, Rule: RuleSiblingPrefix, Blocks: 10}} // 15 shared - 5 already in G1
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("hints = %+v, want %+v", got, want)
	}

	// kid1 spills to tB (tA busy) and starts prefilling there; kid2 shares kid1's 18 blocks.
	m.Observe(Identity{SessionID: "kid1", ParentID: "root"})
	m.OnRouted("kid1", tB, kid1)
	kid2 := append(slices.Clone(kid1[:18]), chain(200, 4)...)
	got = m.HintsWithPrefix("kid2", "root", kid2)
	var prefix []Hint
	for _, h := range got {
		if h.Rule == RuleSiblingPrefix {
			prefix = append(prefix, h)
		}
	}
	wantPrefix := []Hint{{Target: tA, Rule: RuleSiblingPrefix, Blocks: 10}, {Target: tB, Rule: RuleSiblingPrefix, Blocks: 18}}
	if !reflect.DeepEqual(prefix, wantPrefix) {
		t.Fatalf("sibling prefix hints = %+v, want %+v", prefix, wantPrefix)
	}

	// The events arrive on tA: the index now credits those blocks, the hint must not count them twice.
	idx.store(tA, sys...)
	for _, h := range m.HintsWithPrefix("kid2", "root", kid2) {
		if h.Rule == RuleSiblingPrefix && h.Target == tA {
			t.Fatalf("credit for announced blocks: %+v", h)
		}
	}
	// After the TTL nothing in flight is credited.
	clk.t = clk.t.Add(11 * time.Second)
	for _, h := range m.HintsWithPrefix("kid2", "root", kid2) {
		if h.Rule == RuleSiblingPrefix {
			t.Fatalf("expired in-flight prompt still credited: %+v", h)
		}
	}
	checkInvariants(t, m)
	// A session that already has affinity gets no sibling credit.
	for _, h := range m.HintsWithPrefix("kid1", "root", kid1) {
		if h.Rule != RuleAffinity {
			t.Fatalf("kid1 has affinity, got %+v", h)
		}
	}
}

func TestDebugView(t *testing.T) {
	idx := newFakeIndex()
	m, _ := newTestManager(t, nil, idx)
	sys := chain(1, 6)
	route(m, idx, "root", "", tA, sys)
	route(m, idx, "kid", "root", tA, append(slices.Clone(sys), 50, 51))
	v, ok := m.Debug("root", true)
	if !ok {
		t.Fatal("root not found")
	}
	if v.Affinity == nil || *v.Affinity != tA || len(v.Frontiers) != 1 || v.Frontiers[0].Depth != 6 ||
		len(v.Frontiers[0].Lineage) != 6 || v.Frontiers[0].Lineage[0] != "0000000000000001" {
		t.Fatalf("root view = %+v", v)
	}
	if !slices.Equal(v.Children, []string{"kid"}) || len(v.Group) != 1 || v.Group[0].Members != 1 {
		t.Fatalf("root children/group = %+v / %+v", v.Children, v.Group)
	}
	k, _ := m.Debug("kid", false)
	if k.ParentID != "root" || k.RootID != "root" || k.Frontiers[0].Depth != 8 || k.Frontiers[0].Lineage != nil {
		t.Fatalf("kid view = %+v", k)
	}
	if _, ok := m.Debug("nobody", false); ok {
		t.Fatal("unknown session found")
	}
	// A second child's next request would be told to follow the parent: the view says so, in JSON.
	m.Observe(Identity{SessionID: "kid2", ParentID: "root"})
	v2, _ := m.Debug("kid2", false)
	raw, err := json.Marshal(v2)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"hints":[{"target":{"worker":"http://a","dp_rank":0},"rule":"parent","blocks":16}`) {
		t.Fatalf("kid2 view JSON: %s", raw)
	}
}
