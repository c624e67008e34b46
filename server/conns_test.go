package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/workers"
)

// serveReal runs a Server through Serve on a real loopback listener (the limits live there).
func serveReal(t *testing.T, cfg configs.Config) string {
	t.Helper()
	reg, err := workers.NewRegistry(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pol, _ := router.New("round_robin", router.Options{})
	s, err := New(Options{Config: cfg, Registry: reg, Router: routerFor(t, pol)})
	if err != nil {
		t.Fatal(err)
	}
	reg.ProbeAll(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done; reg.Close() })
	return ln.Addr().String()
}

// A slow upload is cut at limits.body_read_timeout, while a stream that lasts longer than that
// is not.
func TestBodyReadTimeout(t *testing.T) {
	slowSim := fastSim()
	slowSim.ITL = 20 * time.Millisecond
	w := startSim(t, slowSim)
	cfg := testGatewayConfig(w.srv.URL)
	cfg.Limits.BodyReadTimeout = configs.Duration(300 * time.Millisecond)
	addr := serveReal(t, cfg)

	t.Run("slow upload gets 408", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
		stop := make(chan struct{})
		defer close(stop)
		go func() { // a byte every 100 ms: never finishes in time
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
					if _, err := c.Write([]byte(" ")); err != nil {
						return
					}
				}
			}
		}()
		start := time.Now()
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no response to a slow upload: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "body_read_timeout") {
			t.Fatalf("status %d %s, want 408", resp.StatusCode, body)
		}
		if el := time.Since(start); el > 3*time.Second {
			t.Errorf("cut after %s", el)
		}
	})
	t.Run("long stream is not cut", func(t *testing.T) {
		body := `{"model":"` + testModel + `","stream":true,"max_tokens":40,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`
		start := time.Now()
		resp, err := http.Post("http://"+addr+pathChat, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !strings.Contains(string(data), "[DONE]") || strings.Contains(string(data), `"error"`) {
			t.Fatalf("stream broken (err %v): %s", err, data)
		}
		if el := time.Since(start); el < 600*time.Millisecond {
			t.Logf("stream took only %s; it should outlast the 300ms body timeout", el)
		}
	})
}

// Connections beyond limits.max_conns_per_ip from one address are closed at accept; closing
// one frees its place.
func TestMaxConnsPerIP(t *testing.T) {
	w := startSim(t, fastSim())
	cfg := testGatewayConfig(w.srv.URL)
	cfg.Limits.MaxConnsPerIP = 2
	addr := serveReal(t, cfg)
	health := func(c net.Conn) error {
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	cases := []struct {
		name   string
		closeA bool // close the first connection before dialing
		served bool
	}{
		{"first", false, true},
		{"second", false, true},
		{"third is over the cap", false, false},
		{"after one closes", true, true},
	}
	for _, tc := range cases {
		if tc.closeA {
			open[0].Close()
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		err = health(c)
		for deadline := time.Now().Add(3 * time.Second); tc.closeA && err != nil && time.Now().Before(deadline); {
			// The server frees the place once it has read the close: dial again until then.
			c.Close()
			time.Sleep(20 * time.Millisecond)
			if c, err = net.Dial("tcp", addr); err != nil {
				t.Fatal(err)
			}
			err = health(c)
		}
		if (err == nil) != tc.served {
			t.Fatalf("%s: served=%v (err %v), want served=%v", tc.name, err == nil, err, tc.served)
		}
		if err == nil {
			open = append(open, c)
		} else {
			c.Close()
		}
	}
}
