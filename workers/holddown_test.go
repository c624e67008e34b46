package workers

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/kvgate/kvgate/configs"
)

// A worker that flaps (ejected soon after each readmission) is held down for exponentially
// longer, up to the cap, and a stable period forgets its flaps.
func TestHoldDownDampsFlapping(t *testing.T) {
	type step struct {
		at       int  // seconds on the fake clock
		ok       bool // what /health answers
		routable bool
		heldFor  int // seconds until it may be readmitted, as Status.HeldUntil says (0: none)
	}
	cases := []struct {
		name                    string
		holdDown, max, resetSec int
		steps                   []step
	}{
		{"exponential hold-down, capped, decaying", 10, 40, 60, []step{
			{0, true, true, 0},
			{1, false, false, 0},  // first ejection: never readmitted yet, no hold-down
			{2, true, true, 0},    // readmitted
			{3, false, false, 10}, // flap 1: 10s
			{4, true, false, 9},   // held: success does not count
			{13, true, true, 0},
			{14, false, false, 20}, // flap 2: 20s
			{33, true, false, 1},
			{34, true, true, 0},
			{35, false, false, 40}, // flap 3: 40s
			{75, true, true, 0},
			{76, false, false, 40}, // flap 4: 80s capped at 40s
			{116, true, true, 0},
			{246, false, false, 0}, // healthy 130s = two reset periods: flaps forgotten, no hold
			{247, true, true, 0},
			{248, false, false, 20}, // one flap left after decay (3-2=1), this is the second: 20s
			{267, true, false, 1},
			{268, true, true, 0},
		}},
		{"hold-down off", 0, 0, 60, []step{
			{0, true, true, 0},
			{1, false, false, 0},
			{2, true, true, 0},
			{3, false, false, 0},
			{4, true, true, 0},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			c := testConfig(f.URL)
			c.Health.FailureThreshold, c.Health.SuccessThreshold = 1, 1
			c.Health.HoldDown = configs.Duration(time.Duration(tc.holdDown) * time.Second)
			c.Health.HoldDownMax = configs.Duration(time.Duration(tc.max) * time.Second)
			c.Health.HoldDownReset = configs.Duration(time.Duration(tc.resetSec) * time.Second)
			reg, err := NewRegistry(c, nil)
			if err != nil {
				t.Fatal(err)
			}
			w := reg.Workers()[0]
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			var now time.Time
			w.clock = func() time.Time { return now }
			for _, s := range tc.steps {
				now = start.Add(time.Duration(s.at) * time.Second)
				if s.ok {
					f.status.Store(http.StatusOK)
				} else {
					f.status.Store(http.StatusServiceUnavailable)
				}
				reg.ProbeAll(context.Background())
				st := w.Status()
				held := 0
				if st.HeldUntil.After(now) {
					held = int(st.HeldUntil.Sub(now) / time.Second)
				}
				if w.Routable() != s.routable || held != s.heldFor {
					t.Fatalf("t=%ds ok=%v: routable=%v held %ds, want %v held %ds (%+v)", s.at, s.ok, w.Routable(), held, s.routable, s.heldFor, st)
				}
			}
		})
	}
}
