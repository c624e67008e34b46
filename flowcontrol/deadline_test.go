package flowcontrol

import (
	"slices"
	"testing"
	"time"
)

// TestDeadline: a waiting request is never sent where its first token is predicted past its
// deadline, is shed (Late) once that holds on every eligible target, takes a later-priced
// target that still makes it rather than wait for one that would not, and cache protection
// does not yield to its deadline.
func TestDeadline(t *testing.T) {
	type step struct {
		wait   time.Duration
		states map[string]TargetState
		late   []string // Values Late sheds
		want   string   // Value Next dispatches ("" none)
		wantT  string
		// overlong: its own prefill there passes half its budget, so the dispatch carries no
		// deadline for the edge to hold it to (Dispatch.Due zero; else its Deadline).
		overlong bool
		choice   string // Dispatch.Choice when set
	}
	// A target's state with the time model's recent shortfall there (TTFTRatio), and without.
	atR := func(wait, r float64) TargetState { return TargetState{WaitMs: wait, HasWait: true, TTFTRatio: r} }
	satR := func(wait, r float64) TargetState { s := atR(wait, r); s.Saturated = true; return s }
	at := func(wait float64) TargetState { return atR(wait, 0) }
	sat := func(wait float64) TargetState { return satR(wait, 0) }
	// An entry of the flood tenant pushed at the clock's start with a 30 s deadline and a
	// 5 s prefill on every target (none cached), or the given prefills and gains.
	flood := func(name string, prefill, gain map[string]float64) *Entry[string] {
		return &Entry[string]{Value: name, Tenant: "flood", Named: true, Cost: 10, Gain: gain, Prefill: prefill}
	}
	even := map[string]float64{"w1": 5000, "w2": 5000}
	// The light tenant's prompt: the flood tenant, over its share (it waits, the light one
	// does not, and it asked for more), is kept off it.
	lightGuard := Guard{Tenant: "light", Blocks: 5000}
	none := map[string]float64{"w1": 0, "w2": 0}
	cases := []struct {
		name     string
		lim      Limits
		deadline time.Duration // after the push; 0: none
		push     []*Entry[string]
		steps    []step
	}{
		{"time enough: dispatched as before", pricedLimits, 30 * time.Second,
			[]*Entry[string]{flood("a", even, none)}, []step{
				{states: map[string]TargetState{"w1": at(100), "w2": sat(2000)}, want: "a", wantT: "w1", choice: ChoiceHolder},
			}},
		{"a free target where the first token would be late is not taken; shed once every one is", pricedLimits, 30 * time.Second,
			[]*Entry[string]{flood("a", map[string]float64{"w1": 9000, "w2": 5000}, none)}, []step{
				{wait: 22 * time.Second, states: map[string]TargetState{"w1": at(100), "w2": sat(2000)}, want: ""},
				// 24 s in: w2's 5 s prefill alone still ends in time, were w2 to free now.
				{wait: 2 * time.Second, states: map[string]TargetState{"w1": at(100), "w2": sat(2000)}, want: ""},
				{wait: 1500 * time.Millisecond, states: map[string]TargetState{"w1": at(100), "w2": sat(2000)}, late: []string{"a"}},
			}},
		{"a prefill longer than the whole budget is not refused for its length: its wait is bounded", pricedLimits, 30 * time.Second,
			[]*Entry[string]{flood("huge", map[string]float64{"w1": 40000, "w2": 40000}, none)}, []step{
				// Its 40 s prefill counts as 15 s (half the budget): 10 s in it is not shed
				// while both are busy, and w1 freeing takes it (without the cap it would be
				// late everywhere from its arrival).
				{wait: 10 * time.Second, states: map[string]TargetState{"w1": sat(4000), "w2": sat(9000)}, want: ""},
				{states: map[string]TargetState{"w1": at(400), "w2": sat(9000)}, want: "huge", wantT: "w1", overlong: true},
			}},
		{"a prefill longer than the budget: shed once its wait passes the rest of it", pricedLimits, 30 * time.Second,
			[]*Entry[string]{flood("huge", map[string]float64{"w1": 40000, "w2": 40000}, none)}, []step{
				{wait: 10 * time.Second, states: map[string]TargetState{"w1": sat(9000), "w2": sat(9000)}, want: ""},
				{wait: 6 * time.Second, states: map[string]TargetState{"w1": sat(9000), "w2": sat(9000)}, late: []string{"huge"}},
			}},
		{"the margin: a first token predicted just inside the deadline (29.4 s) is late by the model's recent shortfall (1.3x: 31.0 s); shed once no target makes it", pricedLimits, 30 * time.Second,
			[]*Entry[string]{flood("a", even, none)}, []step{
				{wait: 24 * time.Second, states: map[string]TargetState{"w1": atR(400, 1.3), "w2": satR(2000, 1.3)}, late: []string{"a"}},
			}},
		{"the margin: no shortfall measured, the same request is sent", pricedLimits, 30 * time.Second,
			[]*Entry[string]{flood("a", even, none)}, []step{
				{wait: 24 * time.Second, states: map[string]TargetState{"w1": atR(400, 0), "w2": satR(2000, 0)}, want: "a", wantT: "w1"},
			}},
		{"the margin: a model predicting too long (ratio 0.7) is not trusted to shorten the prediction", pricedLimits, 30 * time.Second,
			[]*Entry[string]{flood("a", map[string]float64{"w1": 6000, "w2": 6000}, none)}, []step{
				// 24.5 + 0.4 + 6 = 30.9 s: late as predicted, though 0.7x of it would be in time.
				{wait: 24500 * time.Millisecond, states: map[string]TargetState{"w1": atR(400, 0.7), "w2": satR(2000, 0.7)}, late: []string{"a"}},
			}},
		{"the margin: only the target whose model falls short loses the request", pricedLimits, 30 * time.Second,
			[]*Entry[string]{flood("a", even, none)}, []step{
				{wait: 24 * time.Second, states: map[string]TargetState{"w1": atR(400, 1.3), "w2": atR(450, 1.05)}, want: "a", wantT: "w2"},
			}},
		{"the margin counts toward the cap: a 12 s prefill at 1.3x passes half the budget, so it carries no deadline", pricedLimits, 30 * time.Second,
			[]*Entry[string]{flood("big", map[string]float64{"w1": 12000, "w2": 12000}, none)}, []step{
				{states: map[string]TargetState{"w1": atR(0, 1.3), "w2": satR(2000, 1.3)}, want: "big", wantT: "w1", overlong: true},
			}},
		{"without the margin the same 12 s prefill carries its deadline", pricedLimits, 30 * time.Second,
			[]*Entry[string]{flood("big", map[string]float64{"w1": 12000, "w2": 12000}, none)}, []step{
				{states: map[string]TargetState{"w1": atR(0, 1), "w2": satR(2000, 1)}, want: "big", wantT: "w1"},
			}},
		{"no deadline: the same request is sent late", pricedLimits, 0,
			[]*Entry[string]{flood("a", map[string]float64{"w1": 9000, "w2": 5000}, none)}, []step{
				{wait: 24 * time.Second, states: map[string]TargetState{"w1": at(100), "w2": sat(2000)}, want: "a", wantT: "w1"},
			}},
		{"no prediction: never shed early", pricedLimits, 30 * time.Second,
			[]*Entry[string]{flood("a", nil, none)}, []step{
				{wait: 29 * time.Second, states: map[string]TargetState{"w1": sat(9000), "w2": sat(9000)}, want: ""},
			}},
		{"waiting for the prefix holder would be late: the free target still in time takes it", recomputeLimits, 30 * time.Second,
			[]*Entry[string]{flood("a", map[string]float64{"w1": 1000, "w2": 6000}, map[string]float64{"w1": 5000, "w2": 0})}, []step{
				// The holder w1 is priced far better: the request waits for it.
				{wait: 10 * time.Second, states: map[string]TargetState{"w1": sat(3000), "w2": at(0)}, want: ""},
				// 23 s in, w1 (wait 7 s + 1 s) would pass 30 s; w2 (6 s) still makes it.
				// It is counted as the holder's lateness, not as a faster target.
				{wait: 13 * time.Second, states: map[string]TargetState{"w1": sat(7000), "w2": at(0)}, want: "a", wantT: "w2", choice: ChoiceLateHolder},
			}},
		{"tenant protection holds while the unguarded target still makes it", protectLimits, 30 * time.Second,
			[]*Entry[string]{flood("a", map[string]float64{"w1": 4000, "w2": 4000}, none)}, []step{
				{wait: 20 * time.Second, states: map[string]TargetState{"w1": guarded(lightGuard), "w2": sat(3000)}, want: ""},
				{states: map[string]TargetState{"w1": guarded(lightGuard), "w2": at(0)}, want: "a", wantT: "w2"},
			}},
		{"tenant protection does not yield to the deadline: shed instead", protectLimits, 30 * time.Second,
			[]*Entry[string]{flood("a", map[string]float64{"w1": 4000, "w2": 4000}, none)}, []step{
				{wait: 24 * time.Second, states: map[string]TargetState{"w1": guarded(lightGuard), "w2": sat(3000)}, want: ""},
				{wait: 2500 * time.Millisecond, states: map[string]TargetState{"w1": guarded(lightGuard), "w2": sat(3000)}, late: []string{"a"}},
			}},
		{"nor does a higher priority's", protectLimits, 30 * time.Second,
			[]*Entry[string]{flood("a", map[string]float64{"w1": 4000, "w2": 4000}, none)}, []step{
				{wait: 24 * time.Second, states: map[string]TargetState{"w1": guarded(vip(6000)), "w2": sat(3000)}, want: ""},
				{wait: 2500 * time.Millisecond, states: map[string]TargetState{"w1": guarded(vip(6000)), "w2": sat(3000)}, late: []string{"a"}},
			}},
		{"within the margin of its deadline it is left to its timer", pricedLimits, 30 * time.Second,
			[]*Entry[string]{flood("a", even, none)}, []step{
				{wait: 29950 * time.Millisecond, states: map[string]TargetState{"w1": sat(3000), "w2": sat(3000)}, want: ""},
			}},
		{"only the late one of two is shed", pricedLimits, 30 * time.Second,
			[]*Entry[string]{flood("big", map[string]float64{"w1": 14000, "w2": 14000}, none), flood("small", even, none)}, []step{
				{wait: 17 * time.Second, states: map[string]TargetState{"w1": sat(6000), "w2": sat(6000)}, late: []string{"big"}, want: ""},
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q, clk := newTestQueue(tc.lim)
			q.Arrive(0, "flood", 2000)
			q.Arrive(0, "light", 1000)
			for _, e := range tc.push {
				if tc.deadline > 0 {
					e.Deadline = clk.now().Add(tc.deadline)
				}
				if _, err := q.Push(e); err != nil {
					t.Fatal(err)
				}
			}
			done := 0
			for i, s := range tc.steps {
				clk.advance(s.wait)
				var late []string
				for _, e := range q.Late(s.states, 100*time.Millisecond) {
					late = append(late, e.Value.(string))
				}
				done += len(late)
				if !slices.Equal(late, s.late) {
					t.Fatalf("step %d: Late = %v, want %v", i, late, s.late)
				}
				e, d, ok := q.Next(s.states)
				got := ""
				if ok {
					got = e.Value.(string)
					done++
				}
				if got != s.want || (ok && d.Target != s.wantT) {
					t.Fatalf("step %d: Next = %q on %q, want %q on %q", i, got, d.Target, s.want, s.wantT)
				}
				if ok && s.choice != "" && d.Choice != s.choice {
					t.Fatalf("step %d: Choice = %q, want %q", i, d.Choice, s.choice)
				}
				if ok {
					want := e.Deadline
					if s.overlong {
						want = time.Time{}
					}
					if !d.Due.Equal(want) {
						t.Fatalf("step %d: Due = %v, want %v (deadline %v)", i, d.Due, want, e.Deadline)
					}
				}
			}
			if n := q.Len(); n != len(tc.push)-done {
				t.Fatalf("%d entries still wait, want %d", n, len(tc.push)-done)
			}
		})
	}
}
