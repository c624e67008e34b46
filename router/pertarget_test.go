package router

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/kvkey"
)

// TestPerTargetBoundAndForget: state is made once per target, never beyond maxTimedTargets, not
// kept when create declines, and gone after forget.
func TestPerTargetBoundAndForget(t *testing.T) {
	target := func(i int) kvkey.Target { return kvkey.Target{Worker: fmt.Sprintf("http://w%d", i)} }
	p := newPerTarget[int]()
	made := 0
	mk := func() *int { made++; v := made; return &v }
	for i := range maxTimedTargets {
		if p.getOrCreate(target(i), mk) == nil {
			t.Fatalf("target %d: no state below the bound", i)
		}
	}
	cases := []struct {
		name   string
		target kvkey.Target
		create func() *int
		want   bool
	}{
		{"known target reuses its state", target(0), mk, true},
		{"beyond the bound: none", target(maxTimedTargets), mk, false},
	}
	for _, tc := range cases {
		before := made
		got := p.getOrCreate(tc.target, tc.create)
		if (got != nil) != tc.want || made != before {
			t.Errorf("%s: got %v, made %d new", tc.name, got, made-before)
		}
	}
	p.forget(target(1))
	if p.get(target(1)) != nil || len(p.all()) != maxTimedTargets-1 {
		t.Fatalf("forget left %d targets", len(p.all()))
	}
	if p.getOrCreate(target(1), func() *int { return nil }) != nil || p.get(target(1)) != nil {
		t.Fatal("a declined create was kept")
	}
	if p.getOrCreate(target(maxTimedTargets), mk) == nil {
		t.Fatal("room freed by forget was not reused")
	}
}
