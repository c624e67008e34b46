package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
)

// perIPListener caps the concurrent connections of each remote IP (limits.max_conns_per_ip):
// a connection over the cap is closed as soon as it is accepted.
type perIPListener struct {
	net.Listener
	max int
	log *slog.Logger

	mu    sync.Mutex
	conns map[string]int // open connections per IP; entries at zero are deleted
}

func newPerIPListener(ln net.Listener, maxPerIP int, log *slog.Logger) *perIPListener {
	return &perIPListener{Listener: ln, max: maxPerIP, log: log, conns: map[string]int{}}
}

// Accept returns the next connection whose IP is under its cap, closing the others.
func (l *perIPListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := remoteIP(c.RemoteAddr())
		l.mu.Lock()
		n := l.conns[ip]
		if n >= l.max {
			l.mu.Unlock()
			l.log.Debug("connection refused: limits.max_conns_per_ip reached", "ip", ip, "open", n)
			_ = c.Close()
			continue
		}
		l.conns[ip] = n + 1
		l.mu.Unlock()
		return &countedConn{Conn: c, release: func() { l.release(ip) }}, nil
	}
}

func (l *perIPListener) release(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns[ip]--; l.conns[ip] <= 0 {
		delete(l.conns, ip)
	}
}

// remoteIP is the address without its port (the whole address when it has none).
func remoteIP(a net.Addr) string {
	if a == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// countedConn gives its slot back once, on its first Close.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// bodyDeadline bounds the reading of this request's body to limits.body_read_timeout from now
// (the headers are bounded by the server's ReadHeaderTimeout). It returns the function that
// lifts the deadline once the body is read, so that the connection can wait for the client's
// next request, and reading never limits a long response. http.Server.ReadTimeout is not used:
// its deadline stays on the connection and, once it passes, the server cancels the request's
// context, cutting long streams.
func (s *Server) bodyDeadline(c *gin.Context) (lift func()) {
	d := s.cfg.Limits.BodyReadTimeout.D()
	if d <= 0 {
		return func() {}
	}
	rc := http.NewResponseController(c.Writer)
	if err := rc.SetReadDeadline(time.Now().Add(d)); err != nil {
		return func() {} // not a net/http connection (e.g. a test recorder)
	}
	return func() { _ = rc.SetReadDeadline(time.Time{}) }
}

// bodyTimeoutError is the answer to a body not received within limits.body_read_timeout.
func (s *Server) bodyTimeoutError(err error) *apiError {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return nil
	}
	return &apiError{
		Status:  http.StatusRequestTimeout,
		Message: fmt.Sprintf("request body not received within limits.body_read_timeout (%s)", s.cfg.Limits.BodyReadTimeout),
	}
}
