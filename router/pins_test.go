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

// fakeSharedPins is an in-memory SharedPins; err, when set, fails every lookup.
type fakeSharedPins struct {
	pins    map[string]kvkey.Target
	shared  []string
	touched []string
	lookups int
	err     error
}

func (f *fakeSharedPins) SharePin(_ context.Context, id string, t kvkey.Target) error {
	f.pins[id] = t
	f.shared = append(f.shared, id)
	return nil
}

func (f *fakeSharedPins) TouchPin(id string, t kvkey.Target) {
	f.pins[id] = t
	f.touched = append(f.touched, id)
}

func (f *fakeSharedPins) LookupPin(_ context.Context, id string) (kvkey.Target, bool, error) {
	f.lookups++
	if f.err != nil {
		return kvkey.Target{}, false, f.err
	}
	t, ok := f.pins[id]
	return t, ok, nil
}

// TestSharedPins: a pin produced here is shared with the fleet; a follow-up unknown here is
// answered from the fleet's pins (and kept, marked "shared"); a fleet miss or an unreadable
// store is the hard pin's unknown-response error, never another worker.
func TestSharedPins(t *testing.T) {
	a, b := kvkey.Target{Worker: "a"}, kvkey.Target{Worker: "b"}
	all := []Candidate{{Target: a}, {Target: b}}
	cases := []struct {
		name       string
		fleet      map[string]kvkey.Target
		err        error
		pin        string
		want       kvkey.Target
		absent     bool
		wantSource string
	}{
		{name: "produced by another replica", fleet: map[string]kvkey.Target{"r9": b}, pin: "r9", want: b, wantSource: PinShared},
		{name: "unknown to the fleet", fleet: map[string]kvkey.Target{}, pin: "r9", absent: true},
		{name: "store unreachable", fleet: map[string]kvkey.Target{"r9": b}, err: errors.New("nats: outbound buffer limit exceeded"), pin: "r9", absent: true},
		{name: "fleet target not routable", fleet: map[string]kvkey.Target{"r9": {Worker: "gone"}}, pin: "r9", absent: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sp := &fakeSharedPins{pins: tc.fleet, err: tc.err}
			e, err := NewDispatcher(DispatcherOptions{Policy: &RoundRobin{}, Pins: PinConfig{MaxPins: 4}, SharedPins: sp})
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				d, life, err := e.Route(context.Background(), &Request{PinResponseID: tc.pin}, all)
				if tc.absent {
					if !errors.Is(err, ErrUnknownResponse) {
						t.Fatalf("err = %v, want ErrUnknownResponse", err)
					}
					continue
				}
				if err != nil || d.Chosen.Target != tc.want {
					t.Fatalf("chosen %v err %v, want %v", d.Chosen.Target, err, tc.want)
				}
				life.Done()
			}
			if !tc.absent {
				if sp.lookups != 1 {
					t.Errorf("fleet lookups %d, want 1 (the second follow-up hits the local copy)", sp.lookups)
				}
				if v := e.DebugPins(10); len(v) != 1 || v[0].Source != tc.wantSource {
					t.Errorf("DebugPins = %+v, want one pin from %q", v, tc.wantSource)
				}
			}
		})
	}
}

// TestPinsShareProducedAndReshareInUse: every produced pin is shared (synchronously); a pin in
// use is touched once TTL/8 passed since its last write (the bucket's TTL counts from writes).
func TestPinsShareProducedAndReshareInUse(t *testing.T) {
	b := kvkey.Target{Worker: "b"}
	sp := &fakeSharedPins{pins: map[string]kvkey.Target{}}
	e, err := NewDispatcher(DispatcherOptions{Policy: &RoundRobin{}, Pins: PinConfig{MaxPins: 4, TTL: 8 * time.Minute}, SharedPins: sp})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	e.pins.now = func() time.Time { return now }
	_, life, err := e.Route(context.Background(), &Request{}, []Candidate{{Target: b}})
	if err != nil {
		t.Fatal(err)
	}
	life.Produced("r1")
	life.Done()
	if sp.pins["r1"] != b || len(sp.shared) != 1 {
		t.Fatalf("produced pin not shared: %v", sp.shared)
	}
	for _, step := range []struct {
		after   time.Duration
		touches int
	}{{30 * time.Second, 0}, {45 * time.Second, 1}, {10 * time.Second, 1}} {
		now = now.Add(step.after)
		_, life, err := e.Route(context.Background(), &Request{PinResponseID: "r1"}, []Candidate{{Target: b}})
		if err != nil {
			t.Fatal(err)
		}
		life.Done()
		if len(sp.touched) != step.touches || len(sp.shared) != 1 {
			t.Fatalf("after %s: %d shares and %d touches, want 1 and %d", step.after, len(sp.shared), len(sp.touched), step.touches)
		}
	}
	if v := e.DebugPins(1); v[0].Source != PinLocal {
		t.Fatalf("source %q, want local", v[0].Source)
	}
}
