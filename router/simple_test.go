package router

import (
	"context"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/kvkey"
)

func cands(loads ...int) []Candidate {
	out := make([]Candidate, len(loads))
	for i, l := range loads {
		out[i] = Candidate{Target: kvkey.Target{Worker: string(rune('a' + i)), DPRank: 0}, InFlight: l}
	}
	return out
}

func pickN(t *testing.T, p Policy, n int, c []Candidate) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for range n {
		d, err := p.Pick(context.Background(), &Request{}, c)
		if err != nil {
			t.Fatal(err)
		}
		if d.Policy != p.Name() || len(d.Candidates) != len(c) || d.Chosen.Reason == "" {
			t.Fatalf("incomplete decision record %+v", d)
		}
		counts[d.Chosen.Worker]++
	}
	return counts
}

func TestPolicies(t *testing.T) {
	cases := []struct {
		name   string
		loads  []int
		n      int
		expect func(map[string]int) bool
	}{
		{"round_robin", []int{0, 0, 0}, 9, func(m map[string]int) bool { return m["a"] == 3 && m["b"] == 3 && m["c"] == 3 }},
		{"round_robin", []int{5, 0}, 4, func(m map[string]int) bool { return m["a"] == 2 && m["b"] == 2 }},
		{"least_loaded", []int{3, 1, 2}, 6, func(m map[string]int) bool { return m["b"] == 6 }},
		{"least_loaded", []int{0, 0}, 10, func(m map[string]int) bool { return m["a"] == 5 && m["b"] == 5 }},
		{"least_loaded", []int{1, 0, 0}, 10, func(m map[string]int) bool { return m["a"] == 0 && m["b"] == 5 && m["c"] == 5 }},
		{"random", []int{0, 0, 0, 0}, 4000, func(m map[string]int) bool {
			for _, k := range []string{"a", "b", "c", "d"} {
				if m[k] < 850 || m[k] > 1150 {
					return false
				}
			}
			return true
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.name, Options{Seed: 42})
			if err != nil {
				t.Fatal(err)
			}
			if got := pickN(t, p, tc.n, cands(tc.loads...)); !tc.expect(got) {
				t.Errorf("loads %v: picks %v", tc.loads, got)
			}
		})
	}
}

func TestRandomSeedIsDeterministic(t *testing.T) {
	a, b := NewRandom(7), NewRandom(7)
	c := cands(0, 0, 0, 0, 0)
	for range 50 {
		da, _ := a.Pick(context.Background(), nil, c)
		db, _ := b.Pick(context.Background(), nil, c)
		if da.Chosen != db.Chosen {
			t.Fatal("same seed, different picks")
		}
	}
}

func TestNewUnknownAndEmpty(t *testing.T) {
	_, err := New("kv_magic", Options{})
	if err == nil || !strings.Contains(err.Error(), "least_loaded, random, round_robin") {
		t.Fatalf("err = %v", err)
	}
	for _, name := range Names() {
		p, _ := New(name, Options{})
		if _, err := p.Pick(context.Background(), nil, nil); err == nil {
			t.Errorf("%s: empty candidates accepted", name)
		}
	}
}
