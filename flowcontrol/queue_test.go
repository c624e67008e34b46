package flowcontrol

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// clock is an injectable clock the tests move by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newTestQueue(lim Limits) (*Queue[string], *clock) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	return NewQueue[string](lim, c.now), c
}

var testLimits = Limits{MaxRequests: 100, MaxBytes: 1 << 20, HalfLife: time.Minute, AgeWeight: 0.1}

// pricedLimits add the predicted-wait bounds and contention (max_predicted_wait 500 ms,
// contended_predicted_wait 100 ms, a 10 s window, contended_share 1.5).
var pricedLimits = Limits{MaxRequests: 100, MaxBytes: 1 << 20, HalfLife: time.Minute, AgeWeight: 0.1,
	MaxWaitMs: 500, ContendedWaitMs: 100, Window: 10 * time.Second, ContendedShare: 1.5}

// recomputeLimits are pricedLimits with recompute_weight 2: a move off the prefix holder
// pays the recomputed prefill three times (the request's own, and twice the fleet's).
var recomputeLimits = func() Limits { l := pricedLimits; l.RecomputeWeight = 2; return l }()

// step is one action on a queue: push an entry (named by Value), wait, charge, remove, or
// dispatch to the free targets and expect a given entry and target.
type step struct {
	push    *Entry[string]
	wait    time.Duration
	charge  string
	amount  float64
	remove  string
	free    []string               // targets free, unpriced (no time model)
	states  map[string]TargetState // or every target's load (priced)
	arrive  *Entry[string]         // Arrive(its priority, its tenant, its cost)
	want    string                 // the Value Next should dispatch ("" = none)
	wantT   string                 // and to which target
	choice  string                 // and its Dispatch.Choice, when set
	wantErr error
	evicted []string // the Values Push sheds to make room
}

// freeStates is free as states: each free and unpriced.
func freeStates(free []string) map[string]TargetState {
	out := map[string]TargetState{}
	for _, f := range free {
		out[f] = TargetState{}
	}
	return out
}

func TestQueueOrder(t *testing.T) {
	e := func(name string, prio int, tenant string, gain map[string]float64) *Entry[string] {
		return &Entry[string]{Value: name, Priority: prio, Tenant: tenant, Bytes: 10, Cost: 100, Gain: gain}
	}
	cases := []struct {
		name  string
		lim   Limits
		steps []step
	}{
		{"fifo within a tenant without gains", testLimits, []step{
			{push: e("a", 0, "t", nil)}, {wait: time.Millisecond}, {push: e("b", 0, "t", nil)},
			{free: []string{"w1"}, want: "a", wantT: "w1"},
			{free: []string{"w1"}, want: "b", wantT: "w1"},
			{free: []string{"w1"}, want: ""},
		}},
		{"higher priority first whatever its age or gain", testLimits, []step{
			{push: e("low", 0, "t", map[string]float64{"w1": 500})}, {wait: time.Second},
			{push: e("high", 1, "u", map[string]float64{"w1": 0})},
			{free: []string{"w1"}, want: "high", wantT: "w1"},
			{free: []string{"w1"}, want: "low", wantT: "w1"},
		}},
		{"late binding: the freed worker takes the request whose prefix it holds", testLimits, []step{
			{push: e("on-w1", 0, "t", map[string]float64{"w1": 40, "w2": 0})},
			{wait: 10 * time.Millisecond},
			{push: e("on-w2", 0, "t", map[string]float64{"w1": 0, "w2": 40})},
			{free: []string{"w2"}, want: "on-w2", wantT: "w2"},
			{free: []string{"w2"}, want: "on-w1", wantT: "w2"},
		}},
		{"a request cached elsewhere goes last to a worker that holds nothing of it", testLimits, []step{
			{push: e("cached-on-w1", 0, "t", map[string]float64{"w1": 80, "w2": 0})},
			{wait: 10 * time.Millisecond},
			{push: e("uncached", 0, "t", map[string]float64{"w1": 0, "w2": 0})},
			{free: []string{"w2"}, want: "uncached", wantT: "w2"},
			{free: []string{"w2"}, want: "cached-on-w1", wantT: "w2"}, // a free worker is never left idle
		}},
		{"the request gaining most chooses among several free workers", testLimits, []step{
			{push: e("a", 0, "t", map[string]float64{"w1": 0, "w2": 30})},
			{free: []string{"w1", "w2"}, want: "a", wantT: "w2"},
		}},
		{"a long wait outweighs another request's gain (age_weight)", testLimits, []step{
			{push: e("old", 0, "t", map[string]float64{"w1": 0})},
			{wait: time.Second}, // 0.1 × 1000 ms = 100 ms of credit
			{push: e("cached", 0, "t", map[string]float64{"w1": 60})},
			{free: []string{"w1"}, want: "old", wantT: "w1"},
		}},
		{"an ineligible target leaves the request waiting; a lower priority may take it", testLimits, []step{
			{push: e("adapter", 1, "t", map[string]float64{"w2": 0})},
			{push: e("base", 0, "t", map[string]float64{"w1": 0, "w2": 0})},
			{free: []string{"w1"}, want: "base", wantT: "w1"},
			{free: []string{"w1"}, want: ""},
			{free: []string{"w1", "w2"}, want: "adapter", wantT: "w2"},
		}},
		{"least attained service first: a flooding tenant waits behind a light one", testLimits, []step{
			{push: e("heavy-1", 0, "heavy", nil)}, {push: e("heavy-2", 0, "heavy", nil)},
			{push: e("heavy-3", 0, "heavy", nil)}, {wait: time.Millisecond},
			{push: e("light-1", 0, "light", nil)}, {push: e("light-2", 0, "light", nil)},
			// Both start at zero: the oldest goes; heavy is then charged 100.
			{free: []string{"w"}, want: "heavy-1", wantT: "w"},
			{free: []string{"w"}, want: "light-1", wantT: "w"},
			// Equal again (100 each): the oldest, heavy's.
			{free: []string{"w"}, want: "heavy-2", wantT: "w"},
			{free: []string{"w"}, want: "light-2", wantT: "w"},
			{free: []string{"w"}, want: "heavy-3", wantT: "w"},
		}},
		{"service decays: an old flood is forgiven", testLimits, []step{
			{charge: "a", amount: 1000}, {charge: "b", amount: 400},
			{push: e("a-1", 0, "a", nil)}, {push: e("b-1", 0, "b", nil)},
			{free: []string{"w"}, want: "b-1", wantT: "w"},
			{charge: "b", amount: 10000},
			{wait: 10 * time.Minute}, // 2^-10: both near zero, b's 10.4k → ~10, a's 1k → ~1
			{push: e("b-2", 0, "b", nil)},
			{free: []string{"w"}, want: "a-1", wantT: "w"},
		}},
		{"a removed request is never dispatched", testLimits, []step{
			{push: e("gone", 0, "t", nil)}, {push: e("stays", 0, "t", nil)},
			{remove: "gone"},
			{free: []string{"w"}, want: "stays", wantT: "w"},
		}},
		{"max_requests", Limits{MaxRequests: 2, MaxBytes: 1 << 20, HalfLife: time.Minute}, []step{
			{push: e("a", 0, "t", nil)}, {push: e("b", 0, "t", nil)},
			{push: e("c", 0, "t", nil), wantErr: ErrFull},
			{free: []string{"w"}, want: "a", wantT: "w"},
			{push: e("d", 0, "t", nil)},
		}},
		{"a higher priority evicts the lowest priority's youngest from a full queue", Limits{MaxRequests: 3, MaxBytes: 1 << 20, HalfLife: time.Minute}, []step{
			{push: e("p0-old", 0, "t", nil)}, {wait: time.Millisecond}, {push: e("p0-young", 0, "t", nil)},
			{push: e("m1", -1, "t", nil)},
			{push: e("p1", 1, "t", nil), evicted: []string{"m1"}},
			{push: e("p1-b", 1, "t", nil), evicted: []string{"p0-young"}},
			{push: e("p0-new", 0, "t", nil), wantErr: ErrFull}, // nothing lower to evict
			{free: []string{"w"}, want: "p1", wantT: "w"},
			{free: []string{"w"}, want: "p1-b", wantT: "w"},
			{free: []string{"w"}, want: "p0-old", wantT: "w"},
			{free: []string{"w"}, want: ""},
		}},
		{"eviction frees bytes too, and evicts nothing when even that would not fit", Limits{MaxRequests: 10, MaxBytes: 25, HalfLife: time.Minute}, []step{
			{push: e("low", 0, "t", nil)}, {push: e("mid", 1, "t", nil)},
			{push: &Entry[string]{Value: "huge", Priority: 2, Bytes: 30}, wantErr: ErrFull},
			{push: e("high", 2, "t", nil), evicted: []string{"low"}},
		}},

		// Priced late binding (a time model: every target's predicted wait known). The bound
		// is max_predicted_wait 500 ms.
		{"a held request waits for its prefix holder when that is predicted sooner", pricedLimits, []step{
			{push: e("cached-on-w1", 0, "t", map[string]float64{"w1": 2000, "w2": 0})},
			// w2 free: 0 ms wait + 2000 ms more prefill; w1 saturated (600 ms) but 600 - 2000 is sooner.
			{states: map[string]TargetState{"w1": {WaitMs: 600, HasWait: true}, "w2": {WaitMs: 0, HasWait: true}}, want: ""},
			{states: map[string]TargetState{"w1": {WaitMs: 400, HasWait: true}, "w2": {WaitMs: 0, HasWait: true}},
				want: "cached-on-w1", wantT: "w1", choice: ChoiceHolder},
		}},
		{"a held request goes to the freed worker when that is predicted sooner", pricedLimits, []step{
			{push: e("cached-on-w1", 0, "t", map[string]float64{"w1": 300, "w2": 0})},
			// w1's queue (2 s) costs more than recomputing its 300 ms of cached prefix on w2.
			{states: map[string]TargetState{"w1": {WaitMs: 2000, HasWait: true}, "w2": {WaitMs: 100, HasWait: true}},
				want: "cached-on-w1", wantT: "w2", choice: ChoiceFaster},
		}},
		// recompute_weight: the holder's queue must outlast the recomputed prefill (1 + 2) times.
		{"a holder's queue longer than the recompute but not three times it: wait for the holder", recomputeLimits, []step{
			{push: e("cached-on-w1", 0, "t", map[string]float64{"w1": 1000, "w2": 0})},
			// w2: 100 ms. w1: 2500 - 3 × 1000 = -500 ms (with the own prefill only, 1500: w2 first).
			{states: map[string]TargetState{"w1": {WaitMs: 2500, HasWait: true}, "w2": {WaitMs: 100, HasWait: true}}, want: ""},
			{states: map[string]TargetState{"w1": {WaitMs: 400, HasWait: true}, "w2": {WaitMs: 100, HasWait: true}},
				want: "cached-on-w1", wantT: "w1", choice: ChoiceHolder},
		}},
		{"a waiting request pays the whole recompute weight beside free workers with a queue (2x)", recomputeLimits, []step{
			{push: e("cached-on-w1", 0, "t", map[string]float64{"w1": 1000, "w2": 0, "w3": 0})},
			// w2 and w3 admit it but are not idle: w1's 2500 - 3 × 1000 = -500 is still sooner
			// than 100 (Place's share, 0 here, would move it: 2500 - 1000 = 1500).
			{states: map[string]TargetState{"w1": {WaitMs: 2500, HasWait: true}, "w2": {WaitMs: 100, HasWait: true}, "w3": {WaitMs: 100, HasWait: true}}, want: ""},
		}},
		{"2x: more requests wait than idle workers can take: the weight by the backlog", recomputeLimits, []step{
			{push: e("cached-on-w1", 0, "t", map[string]float64{"w1": 1000, "w2": 0, "w3": 0, "w4": 0})},
			{push: e("cached-on-w4", 0, "t", map[string]float64{"w1": 0, "w2": 0, "w3": 0, "w4": 1000})},
			{push: e("cached-on-w4-too", 0, "t", map[string]float64{"w1": 0, "w2": 0, "w3": 0, "w4": 1000})},
			// Three wait, one idle worker (w2; w3 has a queue): 2/3 of the weight, 2200 - (1 +
			// 4/3) × 1000 on the holders is sooner than 0 on w2 (Place's share, 1/2 on w2 with
			// w3 under max_predicted_wait, would move them: 2200 - 2000).
			{states: map[string]TargetState{"w1": {Saturated: true, WaitMs: 2200, HasWait: true}, "w2": {HasWait: true},
				"w3": {WaitMs: 400, HasWait: true}, "w4": {Saturated: true, WaitMs: 2200, HasWait: true}}, want: ""},
			// Once it waits alone, the idle w2 can take it: no weight, 0 against 2200 - 1000.
			{remove: "cached-on-w4"}, {remove: "cached-on-w4-too"},
			{states: map[string]TargetState{"w1": {Saturated: true, WaitMs: 2200, HasWait: true}, "w2": {HasWait: true},
				"w3": {WaitMs: 400, HasWait: true}, "w4": {Saturated: true, WaitMs: 2200, HasWait: true}},
				want: "cached-on-w1", wantT: "w2", choice: ChoiceFaster},
		}},
		{"2x: a free worker that still runs decodes is not idle: the whole weight", recomputeLimits, []step{
			{push: e("cached-on-w1", 0, "t", map[string]float64{"w1": 1000, "w2": 0})},
			// w2 has no prefill queued (0 ms) but runs 12 requests' decodes: w1's 1500 - 3 ×
			// 1000 is sooner (counted idle, no weight: 1500 - 1000 = 500, it would move).
			{states: map[string]TargetState{"w1": {Saturated: true, WaitMs: 1500, HasWait: true}, "w2": {HasWait: true, Running: 12}}, want: ""},
		}},
		{"beside idle workers a waiting request pays half the weight: it leaves a holder whose queue passes twice the recompute", recomputeLimits, []step{
			{push: e("cached-on-w1", 0, "t", map[string]float64{"w1": 1000, "w2": 0, "w3": 0})},
			// w2 and w3 idle (no prefill queued): half the weight, 0 against w1's 1500 - 2*1000:
			// it waits (with no weight, 1500 - 1000, it would leave its cache behind).
			{states: map[string]TargetState{"w1": {Saturated: true, WaitMs: 1500, HasWait: true}, "w2": {HasWait: true}, "w3": {WaitMs: 0.5, HasWait: true}},
				want: ""},
			// 0 against 2500 - 2*1000: it leaves (with the whole weight, 2500 - 3000, it would wait).
			{states: map[string]TargetState{"w1": {Saturated: true, WaitMs: 2500, HasWait: true}, "w2": {HasWait: true}, "w3": {WaitMs: 0.5, HasWait: true}},
				want: "cached-on-w1", wantT: "w2", choice: ChoiceFaster},
		}},
		{"a fan-out beside as many idle workers: each sibling leaves the busy holder", recomputeLimits, []step{
			{push: e("sub-1", 0, "t", map[string]float64{"w1": 1000, "w2": 0, "w3": 0, "w4": 0})},
			{push: e("sub-2", 0, "t", map[string]float64{"w1": 1000, "w2": 0, "w3": 0, "w4": 0})},
			{push: e("sub-3", 0, "t", map[string]float64{"w1": 1000, "w2": 0, "w3": 0, "w4": 0})},
			{states: map[string]TargetState{"w1": {Saturated: true, WaitMs: 2500, HasWait: true}, "w2": {HasWait: true},
				"w3": {HasWait: true}, "w4": {HasWait: true}}, want: "sub-1", wantT: "w2", choice: ChoiceFaster},
			{states: map[string]TargetState{"w1": {Saturated: true, WaitMs: 2500, HasWait: true}, "w2": {Saturated: true, HasWait: true},
				"w3": {HasWait: true}, "w4": {HasWait: true}}, want: "sub-2", wantT: "w3", choice: ChoiceFaster},
			{states: map[string]TargetState{"w1": {Saturated: true, WaitMs: 2500, HasWait: true}, "w2": {Saturated: true, HasWait: true},
				"w3": {WaitMs: 300, HasWait: true}, "w4": {HasWait: true}}, want: "sub-3", wantT: "w4", choice: ChoiceFaster},
		}},
		{"a holder's queue over three times the recompute: the freed worker", recomputeLimits, []step{
			{push: e("cached-on-w1", 0, "t", map[string]float64{"w1": 1000, "w2": 0})},
			{states: map[string]TargetState{"w1": {WaitMs: 3200, HasWait: true}, "w2": {WaitMs: 100, HasWait: true}},
				want: "cached-on-w1", wantT: "w2", choice: ChoiceFaster},
		}},
		{"the recompute is the difference in cached prefix: a partial holder pays only what it lacks", recomputeLimits, []step{
			{push: e("mostly-on-w2", 0, "t", map[string]float64{"w1": 1000, "w2": 800})},
			// w2: 100 - 3 × 800 = -2300; w1: 2500 - 3000 = -500: the partial holder w2 is sooner.
			{states: map[string]TargetState{"w1": {WaitMs: 2500, HasWait: true}, "w2": {WaitMs: 100, HasWait: true}},
				want: "mostly-on-w2", wantT: "w2", choice: ChoiceFaster},
		}},
		{"a router-busy holder is priced at its predicted wait too", pricedLimits, []step{
			{push: e("cached-on-w1", 0, "t", map[string]float64{"w1": 2000, "w2": 0})},
			{states: map[string]TargetState{"w1": {Saturated: true, WaitMs: 300, HasWait: true}, "w2": {HasWait: true}}, want: ""},
		}},
		{"while one waits for its holder, others take the freed worker", pricedLimits, []step{
			{push: e("cached-on-w1", 0, "t", map[string]float64{"w1": 2000, "w2": 0})},
			{wait: time.Millisecond},
			{push: e("uncached", 0, "t", map[string]float64{"w1": 0, "w2": 0})},
			{states: map[string]TargetState{"w1": {WaitMs: 900, HasWait: true}, "w2": {WaitMs: 0, HasWait: true}},
				want: "uncached", wantT: "w2", choice: ChoiceHolder},
			{states: map[string]TargetState{"w1": {WaitMs: 900, HasWait: true}, "w2": {WaitMs: 0, HasWait: true}}, want: ""},
		}},
		{"no starvation: the wait credit takes a freed worker in the end", pricedLimits, []step{
			{push: e("cached-on-w1", 0, "t", map[string]float64{"w1": 2000, "w2": 0})},
			{wait: 10 * time.Second}, // 0.1 × 10,000 ms = 1,000 ms: not yet the 1,400 ms difference
			{states: map[string]TargetState{"w1": {WaitMs: 600, HasWait: true}, "w2": {HasWait: true}}, want: ""},
			{wait: 5 * time.Second},
			{states: map[string]TargetState{"w1": {WaitMs: 600, HasWait: true}, "w2": {HasWait: true}},
				want: "cached-on-w1", wantT: "w2", choice: ChoiceAged},
		}},
		{"a predicted wait at the bound takes nobody", pricedLimits, []step{
			{push: e("any", 0, "t", map[string]float64{"w1": 0})},
			{states: map[string]TargetState{"w1": {WaitMs: 500, HasWait: true}}, want: ""},
			{states: map[string]TargetState{"w1": {WaitMs: 499, HasWait: true}}, want: "any", wantT: "w1", choice: ChoiceUnpriced},
		}},

		// Contention: the contended bound (100 ms here) for a lower priority or a tenant over
		// its share, max_predicted_wait (500 ms) for the others.
		{"a lower priority leaves the last headroom to a higher one seen lately", pricedLimits, []step{
			{arrive: e("", 1, "vip", nil)},
			{push: e("low", 0, "t", nil)},
			{states: map[string]TargetState{"w": {WaitMs: 200, HasWait: true}}, want: ""},
			{push: e("high", 1, "vip", nil)},
			{states: map[string]TargetState{"w": {WaitMs: 200, HasWait: true}}, want: "high", wantT: "w"},
			{states: map[string]TargetState{"w": {WaitMs: 200, HasWait: true}}, want: ""},
			{states: map[string]TargetState{"w": {WaitMs: 50, HasWait: true}}, want: "low", wantT: "w"},
		}},
		{"a lower priority never takes the last target with headroom for a higher one", pricedLimits, []step{
			{arrive: e("", 1, "vip", nil)},
			{push: e("low", 0, "t", map[string]float64{"w1": 0, "w2": 0})},
			// w1 is idle, but w2 is over max_predicted_wait: w1 is the priority's last headroom.
			{states: map[string]TargetState{"w1": {HasWait: true}, "w2": {WaitMs: 600, HasWait: true}}, want: ""},
			// w2 under max_predicted_wait again: w1 may go to priority 0.
			{states: map[string]TargetState{"w1": {HasWait: true}, "w2": {WaitMs: 400, HasWait: true}}, want: "low", wantT: "w1"},
		}},
		{"the headroom returns once the higher priority is gone for contention_window", pricedLimits, []step{
			{arrive: e("", 1, "vip", nil)},
			{push: e("low", 0, "t", nil)},
			{states: map[string]TargetState{"w": {WaitMs: 200, HasWait: true}}, want: ""},
			{wait: 11 * time.Second},
			{states: map[string]TargetState{"w": {WaitMs: 200, HasWait: true}}, want: "low", wantT: "w"},
		}},
		{"a tenant over its fair share is held to the contended bound, the light one is not", pricedLimits, []step{
			{arrive: e("", 0, "heavy", nil)}, {arrive: e("", 0, "light", nil)},
			{charge: "heavy", amount: 5000}, {charge: "light", amount: 1000}, // mean 3000: heavy over 1.5x
			{push: e("heavy-1", 0, "heavy", nil)}, {push: e("light-1", 0, "light", nil)},
			{states: map[string]TargetState{"w": {WaitMs: 200, HasWait: true}}, want: "light-1", wantT: "w"},
			{states: map[string]TargetState{"w": {WaitMs: 200, HasWait: true}}, want: ""},
			{states: map[string]TargetState{"w": {WaitMs: 50, HasWait: true}}, want: "heavy-1", wantT: "w"},
		}},
		{"tenants of about equal service do not contend", pricedLimits, []step{
			{arrive: e("", 0, "a", nil)}, {arrive: e("", 0, "b", nil)},
			{charge: "a", amount: 1200}, {charge: "b", amount: 1000},
			{push: e("a-1", 0, "a", nil)},
			{states: map[string]TargetState{"w": {WaitMs: 200, HasWait: true}}, want: "a-1", wantT: "w"},
		}},
		{"max_bytes", Limits{MaxRequests: 10, MaxBytes: 25, HalfLife: time.Minute}, []step{
			{push: e("a", 0, "t", nil)}, {push: e("b", 0, "t", nil)},
			{push: e("c", 0, "t", nil), wantErr: ErrFull},
		}},
		{"max_requests 0 queues nothing", Limits{MaxRequests: 0, MaxBytes: 25, HalfLife: time.Minute}, []step{
			{push: e("a", 0, "t", nil), wantErr: ErrFull},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q, c := newTestQueue(tc.lim)
			byName := map[string]*Entry[string]{}
			for i, s := range tc.steps {
				switch {
				case s.arrive != nil:
					q.Arrive(s.arrive.Priority, s.arrive.Tenant, s.arrive.Cost)
				case s.push != nil:
					ev, err := q.Push(s.push)
					if !errors.Is(err, s.wantErr) || (err != nil) != (s.wantErr != nil) {
						t.Fatalf("step %d: Push(%v) = %v, want %v", i, s.push.Value, err, s.wantErr)
					}
					var names []string
					for _, x := range ev {
						names = append(names, x.Value.(string))
						if q.Remove(x) {
							t.Fatalf("step %d: evicted %v still removable", i, x.Value)
						}
					}
					if !slices.Equal(names, s.evicted) {
						t.Fatalf("step %d: Push(%v) evicted %v, want %v", i, s.push.Value, names, s.evicted)
					}
					byName[s.push.Value.(string)] = s.push
				case s.wait > 0:
					c.advance(s.wait)
				case s.charge != "":
					q.Charge(s.charge, s.amount)
				case s.remove != "":
					if !q.Remove(byName[s.remove]) {
						t.Fatalf("step %d: Remove(%s) found it gone", i, s.remove)
					}
					if q.Remove(byName[s.remove]) {
						t.Fatalf("step %d: Remove(%s) twice succeeded", i, s.remove)
					}
				default:
					states := s.states
					if states == nil {
						states = freeStates(s.free)
					}
					got, d, ok := q.Next(states)
					name := ""
					if ok {
						name = got.Value.(string)
					}
					if name != s.want || (ok && d.Target != s.wantT) || (ok && s.choice != "" && d.Choice != s.choice) {
						t.Fatalf("step %d: Next(%v) = %q on %q (%+v), want %q on %q %s", i, states, name, d.Target, d, s.want, s.wantT, s.choice)
					}
					if ok && q.Remove(got) {
						t.Fatalf("step %d: a dispatched entry was still removable", i)
					}
				}
			}
		})
	}
}

func TestQueueAccounting(t *testing.T) {
	q, c := newTestQueue(testLimits)
	a := &Entry[string]{Priority: 2, Tenant: "x", Bytes: 7, Cost: 80}
	b := &Entry[string]{Priority: 0, Tenant: "y", Bytes: 5}
	for _, e := range []*Entry[string]{a, b} {
		if _, err := q.Push(e); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Push(a); err == nil {
		t.Fatal("pushing an entry twice succeeded")
	}
	if d := q.Depth(); d[2] != [2]int64{1, 7} || d[0] != [2]int64{1, 5} || q.Len() != 2 {
		t.Fatalf("depth %v len %d", d, q.Len())
	}
	if e, _, _ := q.Next(freeStates([]string{"w"})); e != a {
		t.Fatal("priority 2 not first")
	}
	if got := q.Service("x"); got != 80 {
		t.Fatalf("service after dispatch = %v, want the cost 80", got)
	}
	c.advance(time.Minute)
	if got := q.Service("x"); got < 39.99 || got > 40.01 {
		t.Fatalf("service one half-life later = %v, want 40", got)
	}
	q.Charge("x", -1000)
	if got := q.Service("x"); got != 0 {
		t.Fatalf("a refund beyond the service left %v, want 0", got)
	}
	if d := q.Depth(); len(d) != 1 {
		t.Fatalf("an emptied band stayed: %v", d)
	}
	if got := q.Drain(); len(got) != 1 || got[0] != b || q.Len() != 0 || len(q.Depth()) != 0 {
		t.Fatalf("drain = %v, len %d", got, q.Len())
	}
	if _, _, ok := q.Next(freeStates([]string{"w"})); ok {
		t.Fatal("Next on an empty queue dispatched")
	}
}

func TestQueueForgetsIdleTenants(t *testing.T) {
	q, c := newTestQueue(Limits{MaxRequests: 10, MaxBytes: 100, HalfLife: time.Second})
	for i := range 3 * minPruneAt {
		q.Charge(string(rune('a'+i%26))+time.Duration(i).String(), 5)
		c.advance(100 * time.Millisecond)
		if _, err := q.Push(&Entry[string]{Tenant: "t"}); err != nil {
			t.Fatal(err)
		}
		q.Next(freeStates([]string{"w"}))
	}
	if n := len(q.service); n > 2*minPruneAt {
		t.Fatalf("%d tenants remembered, want them pruned", n)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	bad := Default()
	bad.MaxRequests, bad.QueueTimeout, bad.AgeWeight, bad.FairnessHeader = -1, 0, -1, "bad header"
	bad.RecomputeWeight = math.NaN()
	err := bad.Validate()
	for _, key := range []string{"max_requests", "queue_timeout", "age_weight", "fairness_header", "recompute_weight"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("Validate() = %v, want a problem with %s", err, key)
		}
	}
}

func TestLimitsOf(t *testing.T) {
	c := Default()
	c.RecomputeWeight, c.AgeWeight = 3, 0.5
	if l := LimitsOf(c); l.RecomputeWeight != 3 || l.AgeWeight != 0.5 {
		t.Errorf("LimitsOf: recompute weight %v, age weight %v; want 3, 0.5", l.RecomputeWeight, l.AgeWeight)
	}
}

func TestSaturated(t *testing.T) {
	c := Default()
	c.MaxPrefillTokens, c.MaxWaitingRequests = 4096, 2
	cases := []struct {
		name string
		l    Load
		want bool
	}{
		{"idle", Load{}, false},
		{"router busy", Load{Busy: true}, true},
		{"predicted wait under the bound", Load{WaitMs: 499, HasWait: true}, false},
		{"predicted wait at the bound", Load{WaitMs: 500, HasWait: true}, true},
		{"no prediction (not kv)", Load{WaitMs: 5000}, false},
		{"prefill tokens at the bound", Load{PrefillTokens: 4096}, true},
		{"waiting under the bound", Load{Waiting: 1.5, HasWaiting: true}, false},
		{"waiting at the bound", Load{Waiting: 2, HasWaiting: true}, true},
		{"stale waiting count", Load{Waiting: 9}, false},
	}
	for _, tc := range cases {
		if got := c.Saturated(tc.l); got != tc.want {
			t.Errorf("%s: Saturated(%+v) = %v, want %v", tc.name, tc.l, got, tc.want)
		}
	}
	off := c
	off.MaxPredictedWait, off.MaxPrefillTokens, off.MaxWaitingRequests = 0, 0, 0
	if off.Saturated(Load{WaitMs: 1e9, HasWait: true, PrefillTokens: 1e9, Waiting: 1e9, HasWaiting: true}) {
		t.Error("thresholds at 0 still saturate")
	}
}

// Place: a request that finds nobody waiting is let through to the targets that admit its
// class and beat waiting for its prefix holder, or waits.
func TestPlace(t *testing.T) {
	st := func(wait float64) TargetState { return TargetState{WaitMs: wait, HasWait: true} }
	cases := []struct {
		name      string
		arrive    []Entry[string] // priorities/tenants seen before
		prio      int
		states    map[string]TargetState
		gain      map[string]float64
		want      []string
		wantAll   bool
		reason    string
		wantGains bool // gains asked for
	}{
		{"every target admits: no narrowing, no gains", nil, 0,
			map[string]TargetState{"w1": st(100), "w2": st(0)}, nil, []string{"w1", "w2"}, true, "", false},
		{"none admits", nil, 0,
			map[string]TargetState{"w1": st(600), "w2": {Saturated: true}}, nil, nil, false, "saturated", false},
		{"the holder saturated but sooner: wait for it", nil, 0,
			map[string]TargetState{"w1": st(700), "w2": st(0)}, map[string]float64{"w1": 2000, "w2": 0}, nil, false, "prefix_holder", true},
		{"the holder's queue longer than recomputing: the free one, the router free to choose", nil, 0,
			map[string]TargetState{"w1": st(3000), "w2": st(0)}, map[string]float64{"w1": 300, "w2": 0}, []string{"w2"}, true, "", true},
		{"recompute_weight: the holder's queue shorter than three recomputes: wait for it", nil, 0,
			map[string]TargetState{"w1": st(2500), "w2": st(0)}, map[string]float64{"w1": 1000, "w2": 0}, nil, false, "prefix_holder", true},
		{"recompute_weight: the holder's queue longer than three recomputes: the free one", nil, 0,
			map[string]TargetState{"w1": st(3200), "w2": st(0)}, map[string]float64{"w1": 1000, "w2": 0}, []string{"w2"}, true, "", true},
		{"recompute_weight unpaid beside an idle worker: the free one", nil, 0,
			map[string]TargetState{"w1": {Saturated: true, WaitMs: 2500, HasWait: true}, "w2": st(0), "w3": st(0)},
			map[string]float64{"w1": 1000, "w2": 0, "w3": 0}, []string{"w2", "w3"}, true, "", true},
		{"recompute_weight paid when the rest of the fleet is over max_predicted_wait: wait for the holder", nil, 0,
			map[string]TargetState{"w1": st(2500), "w2": st(0), "w3": st(900)},
			map[string]float64{"w1": 1000, "w2": 0, "w3": 0}, nil, false, "prefix_holder", true},
		{"recompute_weight paid when the rest of the fleet is saturated: wait for the holder", nil, 0,
			map[string]TargetState{"w1": {Saturated: true, WaitMs: 2500, HasWait: true}, "w2": st(0), "w3": {Saturated: true, WaitMs: 900, HasWait: true}},
			map[string]float64{"w1": 1000, "w2": 0, "w3": 0}, nil, false, "prefix_holder", true},
		{"a contended request is narrowed to what admits it", []Entry[string]{{Priority: 1, Tenant: "vip"}}, 0,
			map[string]TargetState{"w1": st(300), "w2": st(0)}, map[string]float64{"w1": 0, "w2": 0}, []string{"w2"}, false, "", true},
		{"a contended request leaves the last target with headroom", []Entry[string]{{Priority: 1, Tenant: "vip"}}, 0,
			map[string]TargetState{"w1": st(600), "w2": st(0)}, nil, nil, false, "saturated", false},
		{"the higher priority itself has the headroom", []Entry[string]{{Priority: 1, Tenant: "vip"}}, 1,
			map[string]TargetState{"w1": st(300), "w2": st(0)}, nil, []string{"w1", "w2"}, true, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q, _ := newTestQueue(recomputeLimits)
			for _, a := range tc.arrive {
				q.Arrive(a.Priority, a.Tenant, a.Cost)
			}
			asked := false
			pl := q.Place(Class{Priority: tc.prio, Tenant: "t"}, tc.states, func() map[string]float64 { asked = true; return tc.gain })
			got, all, reason := pl.Allowed, pl.All, pl.Reason
			slices.Sort(got)
			if !slices.Equal(got, tc.want) || all != tc.wantAll || reason != tc.reason || asked != tc.wantGains {
				t.Errorf("Place = %v all %v %q (gains asked %v), want %v all %v %q (%v)", got, all, reason, asked, tc.want, tc.wantAll, tc.reason, tc.wantGains)
			}
		})
	}
}

// backlogShare: the share of the waiting requests the idle targets eligible for one cannot
// take at once (Next's recompute weight).
func TestBacklogShare(t *testing.T) {
	idleSt := TargetState{HasWait: true}
	cases := []struct {
		name    string
		states  map[string]TargetState
		gain    map[string]float64
		waiting int
		want    float64
	}{
		{"as many idle targets as waiting requests: the floor, minBacklogShare", map[string]TargetState{"w1": {Saturated: true}, "w2": idleSt, "w3": idleSt}, nil, 2, 0.5},
		{"more idle targets than waiting: the floor", map[string]TargetState{"w1": idleSt, "w2": idleSt}, nil, 1, 0.5},
		{"no idle target: all", map[string]TargetState{"w1": {WaitMs: 100, HasWait: true}, "w2": {Saturated: true}}, nil, 1, 1},
		{"three waiting, one idle: two thirds", map[string]TargetState{"w1": idleSt, "w2": {WaitMs: 400, HasWait: true}}, nil, 3, 2.0 / 3},
		{"a wait under a millisecond is idle, over it is not", map[string]TargetState{"w1": {WaitMs: 1, HasWait: true}, "w2": {WaitMs: 1.5, HasWait: true}}, nil, 4, 0.75},
		{"saturated (or reserved) is not idle, whatever its wait", map[string]TargetState{"w1": {Saturated: true, HasWait: true}}, nil, 1, 1},
		{"a target running decodes with no prefill queued is not idle", map[string]TargetState{"w1": {HasWait: true, Running: 8}, "w2": idleSt}, nil, 4, 0.75},
		{"without a time model a free target is idle", map[string]TargetState{"w1": {}}, nil, 2, 0.5},
		{"an idle target the request may not use does not count", map[string]TargetState{"w1": idleSt, "w2": idleSt}, map[string]float64{"w1": 0}, 4, 0.75},
		{"nobody waiting: all", map[string]TargetState{"w1": idleSt}, nil, 0, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := backlogShare(tc.gain, tc.states, tc.waiting); math.Abs(got-tc.want) > 1e-12 {
				t.Errorf("backlogShare = %v, want %v", got, tc.want)
			}
		})
	}
}
