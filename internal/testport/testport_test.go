package testport

import (
	"net"
	"testing"
)

// Free's ports lie below the ephemeral range, are distinct across draws often enough to be
// useful, and can be bound.
func TestFree(t *testing.T) {
	seen := map[int]bool{}
	for range 50 {
		p := Free(t)
		if p < low || p >= high {
			t.Fatalf("port %d outside [%d, %d)", p, low, high)
		}
		seen[p] = true
	}
	if len(seen) < 40 {
		t.Fatalf("50 draws gave only %d distinct ports", len(seen))
	}
	l, err := net.Listen("tcp", Addr(t))
	if err != nil {
		t.Fatalf("bind a port from Addr: %v", err)
	}
	_ = l.Close()
}
