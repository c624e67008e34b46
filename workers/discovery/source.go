package discovery

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/kvgate/kvgate/workers"
	"github.com/kvgate/kvgate/workers/discoveryconfig"
)

// Source is a running discovery source: Run follows it until ctx ends, Readiness is its
// server.ReadinessCheck (not ready until its first complete sync).
type Source interface {
	Run(ctx context.Context)
	Readiness() (name string, ready bool, reason string)
}

// Options are a source's collaborators; every field is optional.
type Options struct {
	Metrics *Metrics
	Log     *slog.Logger
	// Getenv reads KUBERNETES_SERVICE_HOST/PORT for the in-cluster API URL (os.Getenv when nil).
	Getenv func(string) string
	// Resolver resolves discovery.dns.name (net.DefaultResolver when nil).
	Resolver Resolver
	// MinBackoff and MaxBackoff bound the retry delay after a failure (500ms and 30s when 0).
	MinBackoff, MaxBackoff time.Duration
}

func (o *Options) fill() {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 500 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(30*time.Second, o.MinBackoff)
	}
}

// New builds the configured source over reg; nil when cfg enables none. An error is a
// configuration problem (no API URL outside a pod, an unreadable CA or namespace file); an
// unreachable source is not an error here: Run retries it and Readiness reports it.
func New(cfg discoveryconfig.Config, reg *workers.Registry, o Options) (Source, error) {
	o.fill()
	switch {
	case cfg.Kubernetes.Enabled():
		k, err := newKubernetes(cfg.Kubernetes, reg, o)
		if err != nil {
			return nil, err
		}
		return k, nil
	case cfg.DNS.Enabled():
		return newDNS(cfg.DNS, reg, o), nil
	}
	return nil, nil
}

// syncState is a source's readiness: not ready until the first complete sync, then ready for
// good (what is known keeps being served when the source goes away later).
type syncState struct {
	name   string
	mu     sync.Mutex
	synced bool
	reason string
}

func (s *syncState) Readiness() (string, bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.synced {
		return s.name, true, ""
	}
	if s.reason == "" {
		return s.name, false, "not synced yet"
	}
	return s.name, false, s.reason
}

func (s *syncState) markSynced() {
	s.mu.Lock()
	s.synced, s.reason = true, ""
	s.mu.Unlock()
}

func (s *syncState) fail(reason string) {
	s.mu.Lock()
	if !s.synced {
		s.reason = reason
	}
	s.mu.Unlock()
}

// backoff doubles from min to max; reset after a success.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	return b.cur
}

func (b *backoff) reset() { b.cur = 0 }

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
