package serverconfig

import (
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/confval"
)

func TestDefaults(t *testing.T) {
	p, l := DefaultProxy(), DefaultLimits()
	tests := []struct {
		name      string
		got, want any
	}{
		{"proxy.max_retries", p.MaxRetries, 2},
		{"proxy.max_body_bytes", p.MaxBodyBytes, confval.ByteSize(32 << 20)},
		{"proxy.dial_timeout", p.DialTimeout, confval.Duration(5 * time.Second)},
		{"proxy.response_header_timeout", p.ResponseHeaderTimeout, confval.Duration(10 * time.Minute)},
		{"proxy.stream_idle_timeout", p.StreamIdleTimeout, confval.Duration(5 * time.Minute)},
		{"proxy.idle_conn_timeout", p.IdleConnTimeout, confval.Duration(90 * time.Second)},
		{"proxy.max_idle_conns_per_worker", p.MaxIdleConnsPerWorker, 128},
		{"proxy.expose_routing_headers", p.ExposeRoutingHeaders, false},
		{"limits.max_model_len (learned)", l.MaxModelLen, 0},
		{"limits.max_concurrent_tokenizations (GOMAXPROCS)", l.MaxConcurrentTokenizations, 0},
		{"limits.tokenize_queue", l.TokenizeQueue, 64},
		{"limits.tokenize_queue_timeout", l.TokenizeQueueTimeout, confval.Duration(10 * time.Second)},
		{"limits.body_read_timeout", l.BodyReadTimeout, confval.Duration(30 * time.Second)},
		{"limits.max_conns_per_ip (no cap)", l.MaxConnsPerIP, 0},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if err := p.Validate(); err != nil {
		t.Errorf("proxy defaults invalid: %v", err)
	}
	if err := l.Validate(); err != nil {
		t.Errorf("limits defaults invalid: %v", err)
	}
}

// check runs one validation case: want is the error's key prefix, "" for valid.
func check(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("want valid, got %v", err)
	case want != "" && (err == nil || !strings.HasPrefix(err.Error(), want)):
		t.Fatalf("want an error starting %q, got %v", want, err)
	}
}

func TestProxyValidate(t *testing.T) {
	tests := []struct {
		name string
		set  func(*Proxy)
		want string
	}{
		{"defaults", func(*Proxy) {}, ""},
		{"no retry", func(p *Proxy) { p.MaxRetries = 0 }, ""},
		{"no header timeout", func(p *Proxy) { p.ResponseHeaderTimeout = 0 }, ""},
		{"negative retries", func(p *Proxy) { p.MaxRetries = -1 }, "max_retries: "},
		{"too many retries", func(p *Proxy) { p.MaxRetries = 17 }, "max_retries: "},
		{"zero body cap", func(p *Proxy) { p.MaxBodyBytes = 0 }, "max_body_bytes: "},
		{"zero dial timeout", func(p *Proxy) { p.DialTimeout = 0 }, "dial_timeout: "},
		{"negative header timeout", func(p *Proxy) { p.ResponseHeaderTimeout = -1 }, "response_header_timeout: "},
		{"negative stream idle", func(p *Proxy) { p.StreamIdleTimeout = -1 }, "stream_idle_timeout: "},
		{"negative idle conn", func(p *Proxy) { p.IdleConnTimeout = -1 }, "idle_conn_timeout: "},
		{"zero idle conns", func(p *Proxy) { p.MaxIdleConnsPerWorker = 0 }, "max_idle_conns_per_worker: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultProxy()
			tc.set(&p)
			check(t, p.Validate(), tc.want)
		})
	}
}

func TestLimitsValidate(t *testing.T) {
	tests := []struct {
		name string
		set  func(*Limits)
		want string
	}{
		{"defaults", func(*Limits) {}, ""},
		{"no queue", func(l *Limits) { l.TokenizeQueue = 0 }, ""},
		{"negative model len", func(l *Limits) { l.MaxModelLen = -1 }, "max_model_len: "},
		{"negative tokenizations", func(l *Limits) { l.MaxConcurrentTokenizations = -1 }, "max_concurrent_tokenizations: "},
		{"negative queue", func(l *Limits) { l.TokenizeQueue = -1 }, "tokenize_queue: "},
		{"negative queue timeout", func(l *Limits) { l.TokenizeQueueTimeout = -1 }, "tokenize_queue_timeout: "},
		{"negative body read timeout", func(l *Limits) { l.BodyReadTimeout = -1 }, "body_read_timeout: "},
		{"negative conns per ip", func(l *Limits) { l.MaxConnsPerIP = -1 }, "max_conns_per_ip: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := DefaultLimits()
			tc.set(&l)
			check(t, l.Validate(), tc.want)
		})
	}
}
