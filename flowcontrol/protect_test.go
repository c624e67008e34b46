package flowcontrol

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// protectLimits are pricedLimits with cache protection on.
var protectLimits = func() Limits { l := pricedLimits; l.Protect = true; return l }()

// guarded is a free target (predicted wait 0) holding guards.
func guarded(gs ...Guard) TargetState { return TargetState{WaitMs: 0, HasWait: true, Guards: gs} }

// vip is a priority-1 footprint of blocks.
func vip(blocks float64) Guard { return Guard{Priority: 1, Blocks: blocks} }

// TestPlaceProtected: a request that finds nobody waiting is kept off the targets where it
// would evict an outranking footprint while another qualifies, and never left without one.
func TestPlaceProtected(t *testing.T) {
	free := TargetState{WaitMs: 0, HasWait: true}
	heavyOver := func(q *Queue[string]) { // heavy asked for 50x light: over its share
		q.Arrive(0, "heavy", 5000)
		q.Arrive(0, "light", 100)
	}
	light := Guard{Priority: 0, Tenant: "light", Blocks: 5000}
	cases := []struct {
		name    string
		lim     Limits
		setup   func(*Queue[string])
		class   Class
		states  map[string]TargetState
		want    []string
		wantAll bool
		reason  string
		by      string
	}{
		{"a lower priority avoids the worker holding a higher priority's prompt", protectLimits, nil,
			Class{Priority: 0, Tenant: "t"}, map[string]TargetState{"w1": guarded(vip(6000)), "w2": free},
			[]string{"w2"}, false, "", ProtectedByPriority},
		{"protection off: every worker", pricedLimits, nil,
			Class{Priority: 0, Tenant: "t"}, map[string]TargetState{"w1": guarded(vip(6000)), "w2": free},
			[]string{"w1", "w2"}, true, "", ""},
		{"the higher priority itself goes anywhere", protectLimits, nil,
			Class{Priority: 1, Tenant: "t"}, map[string]TargetState{"w1": guarded(vip(6000)), "w2": free},
			[]string{"w1", "w2"}, true, "", ""},
		{"a same-priority footprint without a named tenant protects nothing", protectLimits, nil,
			Class{Priority: 1, Tenant: "t"}, map[string]TargetState{"w1": guarded(vip(6000)), "w2": free},
			[]string{"w1", "w2"}, true, "", ""},
		{"every worker guarded: the least at risk", protectLimits, nil,
			Class{Priority: 0, Tenant: "t"}, map[string]TargetState{"w1": guarded(vip(6000)), "w2": guarded(vip(1000))},
			[]string{"w2"}, false, "", ProtectedByPriority},
		{"at most half the workers are avoided, the most at risk", protectLimits, nil,
			Class{Priority: 0, Tenant: "t"}, map[string]TargetState{"w1": guarded(vip(6000)), "w2": guarded(vip(3000)),
				"w3": guarded(vip(1000)), "w4": free},
			[]string{"w3", "w4"}, false, "", ProtectedByPriority},
		{"every worker guarded, four: the two most at risk avoided", protectLimits, nil,
			Class{Priority: 0, Tenant: "t"}, map[string]TargetState{"w1": guarded(vip(6000)), "w2": guarded(vip(3000)),
				"w3": guarded(vip(1000)), "w4": guarded(vip(500))},
			[]string{"w3", "w4"}, false, "", ProtectedByPriority},
		{"every worker guarded alike: none avoided (never starved)", protectLimits, nil,
			Class{Priority: 0, Tenant: "t"}, map[string]TargetState{"w1": guarded(vip(3000)), "w2": guarded(vip(3000))},
			[]string{"w1", "w2"}, true, "", ""},
		{"only the guarded worker admits it: it waits", protectLimits, nil,
			Class{Priority: 0, Tenant: "t"}, map[string]TargetState{"w1": guarded(vip(6000)), "w2": {Saturated: true}},
			nil, false, "protected", ProtectedByPriority},
		{"a named tenant that asked for over 1.5x the service avoids the other named tenant's worker", protectLimits, heavyOver,
			Class{Priority: 0, Tenant: "heavy", Named: true}, map[string]TargetState{"w1": guarded(light), "w2": free},
			[]string{"w2"}, false, "", ProtectedByTenant},
		{"the tenant with less service goes anywhere", protectLimits, heavyOver,
			Class{Priority: 0, Tenant: "light", Named: true}, map[string]TargetState{"w1": free, "w2": guarded(Guard{Tenant: "heavy", Blocks: 9000})},
			[]string{"w1", "w2"}, true, "", ""},
		{"an unnamed tenant (an agent program) is not steered by tenants", protectLimits, heavyOver,
			Class{Priority: 0, Tenant: "heavy"}, map[string]TargetState{"w1": guarded(light), "w2": free},
			[]string{"w1", "w2"}, true, "", ""},
		{"tenants that asked within 1.5x of each other do not protect from each other", protectLimits, func(q *Queue[string]) {
			q.Arrive(0, "heavy", 120)
			q.Arrive(0, "light", 100)
			q.Charge("heavy", 5000) // attained service does not decide
			q.Charge("light", 100)
		}, Class{Priority: 0, Tenant: "heavy", Named: true}, map[string]TargetState{"w1": guarded(light), "w2": free},
			[]string{"w1", "w2"}, true, "", ""},
		{"a flood that attained only as much as the light tenant but asked for 5x is kept off its worker", protectLimits, func(q *Queue[string]) {
			q.Arrive(0, "heavy", 500)
			q.Arrive(0, "light", 100)
			q.Charge("heavy", 100) // a saturated fleet shared fairly: equal attained service
			q.Charge("light", 100)
		}, Class{Priority: 0, Tenant: "heavy", Named: true}, map[string]TargetState{"w1": guarded(light), "w2": free},
			[]string{"w2"}, false, "", ProtectedByTenant},
		{"the prefix holder guarded: the price of waiting for it is not counted", protectLimits, nil,
			Class{Priority: 0, Tenant: "t"}, map[string]TargetState{"w1": {WaitMs: 700, HasWait: true, Guards: []Guard{vip(6000)}}, "w2": free, "w3": {WaitMs: 800, HasWait: true}},
			[]string{"w2"}, false, "", ProtectedByPriority},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q, _ := newTestQueue(tc.lim)
			if tc.setup != nil {
				tc.setup(q)
			}
			gain := map[string]float64{}
			for k := range tc.states {
				gain[k] = 0
			}
			if _, ok := tc.states["w3"]; ok {
				gain["w1"] = 2000 // its prefix holder is w1
			}
			pl := q.Place(tc.class, tc.states, func() map[string]float64 { return gain })
			slices.Sort(pl.Allowed)
			if !slices.Equal(pl.Allowed, tc.want) || pl.All != tc.wantAll || pl.Reason != tc.reason || pl.Protected != tc.by {
				t.Errorf("Place = %+v, want %v all %v %q protected %q", pl, tc.want, tc.wantAll, tc.reason, tc.by)
			}
		})
	}
}

// TestNextProtected: a waiting request that a footprint outranks waits for another target
// rather than take the guarded one, takes it when every target is guarded, and the
// outranking class still takes its own.
func TestNextProtected(t *testing.T) {
	type dispatch struct {
		states map[string]TargetState
		want   string // Value dispatched, "" none
		wantT  string
		by     string
		wait   time.Duration
	}
	sat := TargetState{Saturated: true}
	free := TargetState{WaitMs: 0, HasWait: true}
	low := func(name string, gain map[string]float64) *Entry[string] {
		return &Entry[string]{Value: name, Priority: 0, Tenant: "flood", Cost: 10, Gain: gain}
	}
	cases := []struct {
		name  string
		lim   Limits
		push  []*Entry[string]
		steps []dispatch
	}{
		{"waits for the unguarded worker, then takes it", protectLimits,
			[]*Entry[string]{low("a", map[string]float64{"w1": 0, "w2": 0})}, []dispatch{
				{states: map[string]TargetState{"w1": guarded(vip(6000)), "w2": sat}, want: ""},
				{wait: 40 * time.Second, states: map[string]TargetState{"w1": guarded(vip(6000)), "w2": sat}, want: ""},
				{states: map[string]TargetState{"w1": guarded(vip(6000)), "w2": free}, want: "a", wantT: "w2", by: ProtectedByPriority},
			}},
		{"without protection it takes the guarded worker at once", pricedLimits,
			[]*Entry[string]{low("a", map[string]float64{"w1": 0, "w2": 0})}, []dispatch{
				{states: map[string]TargetState{"w1": guarded(vip(6000)), "w2": sat}, want: "a", wantT: "w1"},
			}},
		{"every worker guarded: the least at risk takes it", protectLimits,
			[]*Entry[string]{low("a", map[string]float64{"w1": 0, "w2": 0})}, []dispatch{
				{states: map[string]TargetState{"w1": guarded(vip(6000)), "w2": guarded(vip(100))}, want: "a", wantT: "w2", by: ProtectedByPriority},
			}},
		{"the outranking class takes its own worker; the flood waits for another", protectLimits,
			[]*Entry[string]{low("a", map[string]float64{"w1": 0, "w2": 0}),
				{Value: "vip", Priority: 1, Tenant: "v", Cost: 10, Gain: map[string]float64{"w1": 0, "w2": 0}}}, []dispatch{
				{states: map[string]TargetState{"w1": guarded(vip(6000)), "w2": sat}, want: "vip", wantT: "w1"},
				{states: map[string]TargetState{"w1": guarded(vip(6000)), "w2": sat}, want: ""},
			}},
		{"its prefix holder guarded: it goes to the free worker rather than wait for the holder", protectLimits,
			[]*Entry[string]{low("a", map[string]float64{"w1": 2000, "w2": 0})}, []dispatch{
				{states: map[string]TargetState{"w1": {WaitMs: 400, HasWait: true, Guards: []Guard{vip(6000)}}, "w2": free}, want: "a", wantT: "w2", by: ProtectedByPriority},
			}},
		{"without protection it takes its prefix holder", pricedLimits,
			[]*Entry[string]{low("a", map[string]float64{"w1": 2000, "w2": 0})}, []dispatch{
				{states: map[string]TargetState{"w1": {WaitMs: 400, HasWait: true, Guards: []Guard{vip(6000)}}, "w2": free}, want: "a", wantT: "w1"},
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q, clk := newTestQueue(tc.lim)
			for _, e := range tc.push {
				if _, err := q.Push(e); err != nil {
					t.Fatal(err)
				}
			}
			for i, s := range tc.steps {
				clk.advance(s.wait)
				e, d, ok := q.Next(s.states)
				got := ""
				if ok {
					got = e.Value.(string)
				}
				if got != s.want || (ok && (d.Target != s.wantT || d.Protected != s.by)) {
					t.Fatalf("step %d: Next = %q on %q protected %q, want %q on %q protected %q", i, got, d.Target, d.Protected, s.want, s.wantT, s.by)
				}
			}
		})
	}
}

// TestFootprints: each class's last prompt per target, for the window, bounded.
func TestFootprints(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	f := NewFootprints[string, int](time.Minute)
	f.Record("w1", 0, "", "s1", 100, 1, t0)
	f.Record("w1", 1, "", "s2", 200, 2, t0.Add(10*time.Second))
	f.Record("w1", 0, "", "s1", 300, 3, t0.Add(20*time.Second)) // replaces the first
	f.Record("w2", 2, "a", "s3", 50, 4, t0)
	got := f.Live("w1", t0.Add(30*time.Second))
	if len(got) != 2 || got[0].Priority != 1 || got[0].Mark != 2 || got[1].Blocks != 300 || got[1].Mark != 3 {
		t.Fatalf("Live(w1) = %+v, want priority 1 (mark 2) then priority 0 (300 blocks, mark 3)", got)
	}
	if got := f.Live("w1", t0.Add(75*time.Second)); len(got) != 1 || got[0].Priority != 0 {
		t.Fatalf("Live(w1) after the priority-1 footprint's window = %+v, want the priority-0 one only", got)
	}
	if got := f.Live("w2", t0.Add(61*time.Second)); len(got) != 0 {
		t.Fatalf("Live(w2) past the window = %+v, want none", got)
	}
	f.Record("w3", 1, "vip", "v", 1, -1, t0) // the oldest, but the highest priority: kept
	for i := range maxFootprints + 10 {
		f.Record("w3", 0, "", fmt.Sprint("session", i), 1, i, t0.Add(time.Duration(i+1)*time.Millisecond))
	}
	got = f.Live("w3", t0.Add(time.Second))
	if len(got) != maxFootprints || got[0].Mark != -1 {
		t.Fatalf("Live(w3) holds %d footprints (first %+v), want the bound %d, the priority-1 one first", len(got), got[0], maxFootprints)
	}
	for _, fp := range got[1:] {
		if fp.Mark < 11 {
			t.Fatalf("Live(w3) kept footprint %d, want the oldest 11 of priority 0 forgotten", fp.Mark)
		}
	}
	f.Record("w4", 0, "", "", 1, 0, t0.Add(5*time.Minute))
	f.mu.Lock()
	n := len(f.at)
	f.mu.Unlock()
	if n != 1 {
		t.Fatalf("after every other footprint expired the record holds %d targets, want 1", n)
	}
}

// TestNextProtectedBacklog: between named tenants, a waiting request of a tenant that asked
// for more than the other (here 1.2x, under contended_share) is kept off the other's worker
// while the other has nothing waiting, and not once the other waits too (both over their
// share) or when it asked for less.
func TestNextProtectedBacklog(t *testing.T) {
	free := TargetState{WaitMs: 0, HasWait: true}
	light := Guard{Priority: 0, Tenant: "light", Blocks: 5000}
	entry := func(name, tenant string) *Entry[string] {
		return &Entry[string]{Value: name, Tenant: tenant, Named: true, Cost: 10, Gain: map[string]float64{"w1": 0, "w2": 0}}
	}
	cases := []struct {
		name               string
		heavyAsk, lightAsk float64
		lightWaits         bool
		want               string
		by                 string
	}{
		{"over its share by its backlog: kept off", 1200, 1000, false, "w2", ProtectedByTenant},
		{"the other waits too: 1.2x is within the share", 1200, 1000, true, "w1", ""},
		{"asked for less: not kept off", 900, 1000, false, "w1", ""},
		{"over contended_share: kept off though the other waits", 2000, 1000, true, "w2", ProtectedByTenant},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q, _ := newTestQueue(protectLimits)
			q.Arrive(0, "heavy", tc.heavyAsk)
			q.Arrive(0, "light", tc.lightAsk)
			q.Charge("light", 5000) // the light tenant attained more: the heavy's entry goes first
			if _, err := q.Push(entry("h", "heavy")); err != nil {
				t.Fatal(err)
			}
			if tc.lightWaits {
				if _, err := q.Push(entry("l", "light")); err != nil {
					t.Fatal(err)
				}
			}
			// w1 holds the light tenant's prompt and is the deterministic first choice.
			e, d, ok := q.Next(map[string]TargetState{"w1": guarded(light), "w2": free})
			if !ok || e.Value != "h" || d.Target != tc.want || d.Protected != tc.by {
				t.Fatalf("Next = %v on %q protected %q (ok %v), want h on %q protected %q", e, d.Target, d.Protected, ok, tc.want, tc.by)
			}
		})
	}
}
