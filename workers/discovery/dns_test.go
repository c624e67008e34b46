package discovery

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/confval"
	"github.com/kvgate/kvgate/workers/discoveryconfig"
)

// scriptedResolver answers each lookup with the next scripted answer, then repeats the last.
type scriptedResolver struct {
	mu      sync.Mutex
	answers []answer
	calls   int
}

type answer struct {
	ips []string
	err error
}

func (r *scriptedResolver) LookupIPAddr(_ context.Context, host string) ([]net.IPAddr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.answers[min(r.calls, len(r.answers)-1)]
	r.calls++
	if host != "vllm.llm.svc" {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	var out []net.IPAddr
	for _, s := range a.ips {
		out = append(out, net.IPAddr{IP: net.ParseIP(s)})
	}
	return out, a.err
}

func (r *scriptedResolver) Calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

func TestDNS(t *testing.T) {
	timeout := &net.DNSError{Err: "i/o timeout", Name: "vllm.llm.svc", IsTimeout: true}
	notFound := &net.DNSError{Err: "no such host", Name: "vllm.llm.svc", IsNotFound: true}
	for _, tc := range []struct {
		name    string
		answers []answer
		// want is the fleet after every answer was used; ready whether readiness is.
		want   []string
		ready  bool
		failed bool // resolution errors were counted
	}{
		{"resolved", []answer{{ips: []string{"10.0.0.1", "fd00::2"}}},
			[]string{"http://10.0.0.1:8000", "http://[fd00::2]:8000"}, true, false},
		{"a worker goes, one comes", []answer{{ips: []string{"10.0.0.1", "10.0.0.2"}}, {ips: []string{"10.0.0.2", "10.0.0.3"}}},
			[]string{"http://10.0.0.2:8000", "http://10.0.0.3:8000"}, true, false},
		{"a failure keeps the known workers", []answer{{ips: []string{"10.0.0.1"}}, {err: timeout}},
			[]string{"http://10.0.0.1:8000"}, true, true},
		{"unresolvable at start", []answer{{err: timeout}}, nil, false, true},
		{"no such name is an empty fleet", []answer{{ips: []string{"10.0.0.1"}}, {err: notFound}}, nil, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			res := &scriptedResolver{answers: tc.answers}
			f.opts.Resolver = res
			cfg := discoveryconfig.Default().DNS
			cfg.Name, cfg.KVEventsPort, cfg.ReplayPort, cfg.Interval = "vllm.llm.svc", 5557, 5558, confval.Duration(20*time.Millisecond)
			src := newDNS(cfg, f.reg, f.opts)
			run(t, src)
			eventually(t, "every answer used", func() bool { return res.Calls() > len(tc.answers) })
			if got := f.fleet(); !equal(got, tc.want) {
				t.Errorf("fleet %v, want %v", got, tc.want)
			}
			_, ok, reason := src.Readiness()
			if ok != tc.ready || (!ok && !strings.Contains(reason, "cannot resolve vllm.llm.svc")) {
				t.Errorf("readiness %v %q, want %v", ok, reason, tc.ready)
			}
			if got := f.errors(sourceDNS, "resolve"); (got > 0) != tc.failed {
				t.Errorf("errors{reason=resolve} = %v, want counted: %v", got, tc.failed)
			}
			if w := f.reg.Get("http://10.0.0.2:8000"); w != nil {
				if c := w.Config(); c.KVEvents != "tcp://10.0.0.2:5557" || c.Replay != "tcp://10.0.0.2:5558" {
					t.Errorf("worker %+v", c)
				}
			}
		})
	}
}
