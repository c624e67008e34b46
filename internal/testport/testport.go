// Package testport hands tests a loopback TCP port that is free now and that the kernel will
// not give to anybody else meanwhile, for servers a test starts later on that port (an
// embedded NATS server, a ZMQ bind, a gateway given --listen).
//
// A port taken with Listen("127.0.0.1:0") and closed comes from the ephemeral range
// (net.ipv4.ip_local_port_range, 32768–60999 by default), which the kernel also uses for the
// local end of every outgoing connection; with every package's tests running in parallel, one
// of those connections can take the port before the server binds it, and the server never
// becomes ready. Ports below that range are only ever bound on purpose.
package testport

import (
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
)

// The range Free draws from: above the ports the project's scripts use (18000–19999) and
// below the kernel's default ephemeral range.
const (
	low  = 20000
	high = 32768
)

// Free returns a loopback port in [20000, 32768) that could be bound just now.
func Free(tb testing.TB) int {
	tb.Helper()
	for range 200 {
		p := low + rand.IntN(high-low)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue // in use: draw again
		}
		_ = l.Close()
		return p
	}
	tb.Fatalf("testport: no free loopback port in [%d, %d) after 200 draws", low, high)
	return 0
}

// Addr is Free as "127.0.0.1:port".
func Addr(tb testing.TB) string {
	tb.Helper()
	return "127.0.0.1:" + strconv.Itoa(Free(tb))
}
