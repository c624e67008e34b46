package flowcontrol

import (
	"errors"
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

// step is one action on a queue: push an entry (named by Value), wait, charge, remove, or
// dispatch to the free targets and expect a given entry and target.
type step struct {
	push    *Entry[string]
	wait    time.Duration
	charge  string
	amount  float64
	remove  string
	free    []string
	want    string // the Value Next should dispatch ("" = none)
	wantT   string // and to which target
	wantErr error
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
			{push: e("c", 5, "t", nil), wantErr: ErrFull},
			{free: []string{"w"}, want: "a", wantT: "w"},
			{push: e("d", 0, "t", nil)},
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
				case s.push != nil:
					err := q.Push(s.push)
					if !errors.Is(err, s.wantErr) || (err != nil) != (s.wantErr != nil) {
						t.Fatalf("step %d: Push(%v) = %v, want %v", i, s.push.Value, err, s.wantErr)
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
					got, target, ok := q.Next(s.free)
					name := ""
					if ok {
						name = got.Value.(string)
					}
					if name != s.want || (ok && target != s.wantT) {
						t.Fatalf("step %d: Next(%v) = %q on %q, want %q on %q", i, s.free, name, target, s.want, s.wantT)
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
		if err := q.Push(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Push(a); err == nil {
		t.Fatal("pushing an entry twice succeeded")
	}
	if d := q.Depth(); d[2] != [2]int64{1, 7} || d[0] != [2]int64{1, 5} || q.Len() != 2 {
		t.Fatalf("depth %v len %d", d, q.Len())
	}
	if e, _, _ := q.Next([]string{"w"}); e != a {
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
	if _, _, ok := q.Next([]string{"w"}); ok {
		t.Fatal("Next on an empty queue dispatched")
	}
}

func TestQueueForgetsIdleTenants(t *testing.T) {
	q, c := newTestQueue(Limits{MaxRequests: 10, MaxBytes: 100, HalfLife: time.Second})
	for i := range 3 * minPruneAt {
		q.Charge(string(rune('a'+i%26))+time.Duration(i).String(), 5)
		c.advance(100 * time.Millisecond)
		if err := q.Push(&Entry[string]{Tenant: "t"}); err != nil {
			t.Fatal(err)
		}
		q.Next([]string{"w"})
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
	err := bad.Validate()
	for _, key := range []string{"max_requests", "queue_timeout", "age_weight", "fairness_header"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("Validate() = %v, want a problem with %s", err, key)
		}
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
