package workers

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/kvkey"
)

// Registry is the fleet: the workers from config and those a discovery source adds and
// removes at runtime, their health probing, drain state and load. Safe for concurrent use.
//
// Lock order: memberMu (held across a membership change and its notifications) before mu;
// listeners run under memberMu and must not change membership themselves.
type Registry struct {
	health configs.Health
	proxy  configs.Proxy
	apiKey string // auth.worker_api_key, the default of a worker without its own key
	log    *slog.Logger

	memberMu sync.Mutex // serialises Add, Remove, SetDraining and their notifications

	mu       sync.RWMutex
	workers  []*Worker // config order, then order of addition
	byURL    map[string]*Worker
	onChange []func(w *Worker, change string)
	onMember []func(MemberEvent)
}

// TargetLoad is one routable target with the gateway's in-flight count on it.
type TargetLoad struct {
	kvkey.Target
	InFlight int
}

// NewRegistry builds the registry from a validated config. Nothing is probed until Run or
// ProbeAll; until its first probe a worker counts as routable. With a discovery source
// configured the static list may be empty: the source Adds the workers it finds.
func NewRegistry(cfg configs.Config, log *slog.Logger) (*Registry, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Registry{byURL: map[string]*Worker{}, health: cfg.Health, proxy: cfg.Proxy, apiKey: cfg.Auth.WorkerAPIKey, log: log}
	for _, wc := range cfg.Workers {
		if _, dup := r.byURL[wc.URL]; dup {
			return nil, fmt.Errorf("workers: %q listed twice", wc.URL)
		}
		w, err := r.newWorker(wc)
		if err != nil {
			return nil, err
		}
		r.workers = append(r.workers, w)
		r.byURL[wc.URL] = w
	}
	if len(r.workers) == 0 && !cfg.Discovery.Enabled() {
		return nil, fmt.Errorf("workers: none configured")
	}
	return r, nil
}

func (r *Registry) newWorker(wc configs.Worker) (*Worker, error) {
	if wc.APIKey == "" {
		wc.APIKey = r.apiKey // configs.Load already did; a hand-built or discovered one may not
	}
	return newWorker(wc, r.proxy, r.health)
}

// Workers returns a snapshot of every worker, static ones first in config order.
func (r *Registry) Workers() []*Worker {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return append([]*Worker(nil), r.workers...)
}

// Len is the number of workers, draining ones included.
func (r *Registry) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.workers)
}

// Get returns the worker with the given base URL, or nil (never listed, or removed).
func (r *Registry) Get(url string) *Worker {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.byURL[url]
}

// Routable returns every target (worker and DP rank) of every routable worker, in registry
// order, with its in-flight count. The order is stable so that round robin spreads evenly.
func (r *Registry) Routable() []TargetLoad {
	ws := r.Workers()
	out := make([]TargetLoad, 0, len(ws))
	for _, w := range ws {
		if !w.Routable() {
			continue
		}
		for rank := 0; rank < w.DPSize(); rank++ {
			out = append(out, TargetLoad{Target: kvkey.Target{Worker: w.URL(), DPRank: rank}, InFlight: w.InFlight(rank)})
		}
	}
	return out
}

// RoutableCount is the number of routable workers.
func (r *Registry) RoutableCount() int {
	n := 0
	for _, w := range r.Workers() {
		if w.Routable() {
			n++
		}
	}
	return n
}

// Models returns the union of the model ids the workers reported, in first-seen order.
func (r *Registry) Models() []string {
	seen := map[string]bool{}
	var out []string
	for _, w := range r.Workers() {
		for _, m := range w.Models() {
			if !seen[m] {
				seen[m] = true
				out = append(out, m)
			}
		}
	}
	return out
}

// MaxModelLen returns the largest max_model_len any worker reported for model in its
// /v1/models (a prompt that fits one worker is not refused), or 0 when none did.
func (r *Registry) MaxModelLen(model string) int {
	n := 0
	for _, w := range r.Workers() {
		n = max(n, w.MaxModelLen(model))
	}
	return n
}

// OnChange registers fn to hear every state change a probe causes (ChangeAdmitted,
// ChangeReadmitted, ChangeEjected), synchronously on the probing goroutine; fn must be quick.
// The gateway uses it to tell the KV-event subscriptions that a worker's health flapped.
func (r *Registry) OnChange(fn func(w *Worker, change string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onChange = append(r.onChange, fn)
}

func (r *Registry) notify(w *Worker, change string) {
	r.mu.RLock()
	fns := append([]func(*Worker, string){}, r.onChange...)
	r.mu.RUnlock()
	for _, fn := range fns {
		fn(w, change)
	}
}

// ProbeAll probes every worker once, concurrently, and returns when all probes ended.
func (r *Registry) ProbeAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, w := range r.Workers() {
		wg.Go(func() {
			change, err := w.probe(ctx)
			if w.Removed() {
				return // it left the fleet while probed: nobody needs the verdict
			}
			switch change {
			case ChangeEjected:
				r.log.Warn("worker ejected", "worker", w.URL(), "err", err)
			case ChangeAdmitted, ChangeReadmitted:
				r.log.Info("worker "+change, "worker", w.URL(), "models", w.Models())
			}
			if change != "" {
				r.notify(w, change)
			}
		})
	}
	wg.Wait()
}

// Run probes every worker every health.interval until ctx ends. Call ProbeAll first to know
// the fleet before serving.
func (r *Registry) Run(ctx context.Context) {
	t := time.NewTicker(r.health.Interval.D())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.ProbeAll(ctx)
	}
}

// AuthTransport wraps next (nil: http.DefaultTransport) so that every request to one of the
// registry's workers carries that worker's key (see Worker.Authorize); a request is matched
// to the worker whose base URL prefixes it. Other requests pass unchanged. The gateway's
// /metrics scraper uses it.
func (r *Registry) AuthTransport(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return authTransport{reg: r, next: next}
}

type authTransport struct {
	reg  *Registry
	next http.RoundTripper
}

func (t authTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	u := req.URL.String()
	var best *Worker
	for _, w := range t.reg.Workers() {
		base := w.URL()
		if w.HasAPIKey() && strings.HasPrefix(u, base) && (len(u) == len(base) || u[len(base)] == '/' || u[len(base)] == '?') &&
			(best == nil || len(base) > len(best.URL())) {
			best = w
		}
	}
	if best == nil {
		return t.next.RoundTrip(req)
	}
	req = req.Clone(req.Context()) // a RoundTripper must not modify the caller's request
	best.Authorize(req.Header)
	return t.next.RoundTrip(req)
}

// Close releases the idle connections of every worker's pool.
func (r *Registry) Close() {
	for _, w := range r.Workers() {
		w.client.CloseIdleConnections()
	}
}
