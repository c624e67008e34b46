package router

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// TestPinnedRoute: a response id produced on one target routes only there; an unknown id, or
// a pinned target that is no longer a candidate, fails with ErrUnknownResponse; the table is
// bounded by MaxPins (LRU) and TTL.
func TestPinnedRoute(t *testing.T) {
	a, b, c := kvkey.Target{Worker: "a"}, kvkey.Target{Worker: "b"}, kvkey.Target{Worker: "c"}
	all := []Candidate{{Target: a}, {Target: b}, {Target: c}}
	cases := []struct {
		name   string
		cfg    PinConfig
		pins   []string // responses produced, in order, each on target b
		age    time.Duration
		pin    string
		cands  []Candidate
		want   kvkey.Target
		absent bool
	}{
		{name: "pinned to its target", cfg: PinConfig{MaxPins: 4}, pins: []string{"r1"}, pin: "r1", cands: all, want: b},
		{name: "unknown id", cfg: PinConfig{MaxPins: 4}, pins: []string{"r1"}, pin: "r2", cands: all, absent: true},
		{name: "target gone", cfg: PinConfig{MaxPins: 4}, pins: []string{"r1"}, pin: "r1", cands: []Candidate{{Target: a}, {Target: c}}, absent: true},
		{name: "evicted by the cap", cfg: PinConfig{MaxPins: 2}, pins: []string{"r1", "r2", "r3"}, pin: "r1", cands: all, absent: true},
		{name: "kept within the cap", cfg: PinConfig{MaxPins: 2}, pins: []string{"r1", "r2", "r3"}, pin: "r2", cands: all, want: b},
		{name: "expired by the ttl", cfg: PinConfig{MaxPins: 4, TTL: time.Minute}, pins: []string{"r1"}, age: 2 * time.Minute, pin: "r1", cands: all, absent: true},
		{name: "zero cap keeps none", cfg: PinConfig{}, pins: []string{"r1"}, pin: "r1", cands: all, absent: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, err := NewDispatcher(DispatcherOptions{Policy: &RoundRobin{}, Pins: tc.cfg})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Unix(1000, 0)
			e.pins.now = func() time.Time { return now }
			for _, id := range tc.pins {
				// Round robin would spread these; the pin must follow the producing target.
				d, life, err := e.Route(context.Background(), &Request{}, []Candidate{{Target: b}})
				if err != nil || d.Chosen.Target != b {
					t.Fatalf("route: %v %v", d.Chosen, err)
				}
				life.Produced(id)
				life.Done()
			}
			now = now.Add(tc.age)
			for range 3 { // every follow-up, not one lucky draw
				d, life, err := e.Route(context.Background(), &Request{PinResponseID: tc.pin}, tc.cands)
				if tc.absent {
					if !errors.Is(err, ErrUnknownResponse) {
						t.Fatalf("err = %v, want ErrUnknownResponse", err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if d.Chosen.Target != tc.want {
					t.Fatalf("chosen %v, want %v", d.Chosen.Target, tc.want)
				}
				life.Done()
			}
			if v := e.DebugPins(10); len(v) == 0 || v[0].ResponseID != tc.pin {
				t.Errorf("DebugPins = %+v", v)
			}
		})
	}
}
