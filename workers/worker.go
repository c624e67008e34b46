package workers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/configs"
)

// Worker is one vLLM server as the gateway sees it: its pooled HTTP client, health state and
// per-DP-rank in-flight counts. Safe for concurrent use.
type Worker struct {
	cfg    configs.Worker
	base   *url.URL
	client *http.Client
	health configs.Health

	inflight []atomic.Int64 // one per DP rank
	draining atomic.Bool    // out of rotation: no new requests (Registry.SetDraining)
	removed  atomic.Bool    // left the fleet (Registry.Remove)

	mu       sync.Mutex
	state    state
	fails    int // consecutive failures (probes and passive reports)
	misses   int // consecutive first-byte deadline misses (only a response clears them)
	oks      int // consecutive successful probes while ejected
	lastErr  string
	models   []string
	maxLen   map[string]int // model id -> max_model_len its /v1/models reported
	ejected  int            // times ejected, for metrics and debugging
	lastSeen time.Time

	// Flap damping (health.hold_down*): readmitted is when the worker was last readmitted,
	// holdLevel how many recent flaps it has (hold-down = hold_down * 2^(level-1)), holdUntil
	// the earliest time an ejected worker may be readmitted.
	readmitted time.Time
	holdLevel  int
	holdUntil  time.Time
	clock      func() time.Time // time.Now; tests inject a fake clock
}

type state int

// Worker states as Status.State and the kvgate_workers{state} gauge name them.
const (
	StateUnknown  = "unknown"  // not probed yet (routable)
	StateHealthy  = "healthy"  // routable
	StateEjected  = "ejected"  // failed its probes
	StateDraining = "draining" // out of rotation by the discovery source
)

const (
	stateUnknown state = iota // not probed yet: routable, ejected on its first failure
	stateHealthy
	stateEjected
)

// Status is a snapshot of a worker for /health, metrics and debugging.
type Status struct {
	URL                 string    `json:"url"`
	Healthy             bool      `json:"healthy"`
	State               string    `json:"state"`
	ConsecutiveFailures int       `json:"consecutive_failures"`
	LastError           string    `json:"last_error,omitempty"`
	Ejections           int       `json:"ejections"`
	InFlight            []int     `json:"in_flight"`
	Models              []string  `json:"models,omitempty"`
	LastHealthy         time.Time `json:"last_healthy,omitzero"`
	// HeldUntil is when an ejected, flapping worker may be readmitted (health.hold_down).
	HeldUntil time.Time `json:"held_until,omitzero"`
	// Draining: the discovery source took the worker out of rotation (terminating or not
	// ready); requests in flight finish, no new ones are sent.
	Draining bool `json:"draining,omitempty"`
}

func newWorker(cfg configs.Worker, proxy configs.Proxy, health configs.Health) (*Worker, error) {
	base, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("worker %q: %w", cfg.URL, err)
	}
	dp := max(cfg.DPSize, 1)
	tr := &http.Transport{
		// Workers sit on the cluster network: never route to them through an environment proxy.
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: proxy.DialTimeout.D(), KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   proxy.DialTimeout.D(),
		ResponseHeaderTimeout: proxy.ResponseHeaderTimeout.D(),
		IdleConnTimeout:       proxy.IdleConnTimeout.D(),
		MaxIdleConns:          proxy.MaxIdleConnsPerWorker,
		MaxIdleConnsPerHost:   proxy.MaxIdleConnsPerWorker,
		// Bytes are relayed as the worker sends them; transparent gzip would hide SSE framing.
		DisableCompression: true,
	}
	return &Worker{
		cfg:  cfg,
		base: base,
		client: &http.Client{
			Transport: tr,
			// No Timeout: a stream may legitimately run for many minutes.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		health:   health,
		inflight: make([]atomic.Int64, dp),
		clock:    time.Now,
	}, nil
}

// URL is the worker's configured base URL (its identity).
func (w *Worker) URL() string { return w.cfg.URL }

// Config is the worker's configuration entry.
func (w *Worker) Config() configs.Worker { return w.cfg }

// DPSize is the worker's number of data-parallel ranks.
func (w *Worker) DPSize() int { return len(w.inflight) }

// Client is the worker's pooled HTTP client; it has no total timeout. Requests made with it
// must go through Authorize.
func (w *Worker) Client() *http.Client { return w.client }

// HasAPIKey reports whether the gateway presents a key to this worker.
func (w *Worker) HasAPIKey() bool { return w.cfg.APIKey != "" }

// Authorize sets Authorization: Bearer to the worker's key (workers[].api_key, else
// auth.worker_api_key) on h, replacing whatever was there. Without a key it leaves h alone.
func (w *Worker) Authorize(h http.Header) {
	if w.cfg.APIKey != "" {
		h.Set("Authorization", "Bearer "+w.cfg.APIKey)
	}
}

// Endpoint returns the absolute URL of path (e.g. "/v1/chat/completions") on this worker.
func (w *Worker) Endpoint(path, rawQuery string) string {
	u := *w.base
	u.Path = w.base.Path + path
	u.RawQuery = rawQuery
	return u.String()
}

// Routable reports whether requests may be sent to the worker now: it is in the fleet, not
// draining and not ejected.
func (w *Worker) Routable() bool {
	if w.draining.Load() || w.removed.Load() {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state != stateEjected
}

// Draining reports whether the worker is out of rotation (see Registry.SetDraining).
func (w *Worker) Draining() bool { return w.draining.Load() }

// Removed reports whether the worker left the fleet (see Registry.Remove).
func (w *Worker) Removed() bool { return w.removed.Load() }

// remove marks the worker gone and closes its idle pooled connections; the connections of
// requests still in flight close when the last of them ends (Acquire's release).
func (w *Worker) remove() {
	w.removed.Store(true)
	w.client.CloseIdleConnections()
}

func (w *Worker) inFlightTotal() int {
	n := 0
	for i := range w.inflight {
		n += int(w.inflight[i].Load())
	}
	return n
}

// InFlight returns the gateway's in-flight requests on one DP rank.
func (w *Worker) InFlight(rank int) int {
	if rank < 0 || rank >= len(w.inflight) {
		return 0
	}
	return int(w.inflight[rank].Load())
}

// Acquire counts one request in flight on rank and returns its release; calling release more
// than once has no further effect, so deferred and early releases can coexist.
func (w *Worker) Acquire(rank int) (release func()) {
	if rank < 0 || rank >= len(w.inflight) {
		rank = 0
	}
	w.inflight[rank].Add(1)
	var done atomic.Bool
	return func() {
		if done.CompareAndSwap(false, true) {
			w.inflight[rank].Add(-1)
			if w.removed.Load() && w.inFlightTotal() == 0 {
				w.client.CloseIdleConnections() // nothing will reuse them: no socket left behind
			}
		}
	}
}

// ReportFailure records a connection-level failure seen while proxying. It counts toward
// ejection like a failed probe.
func (w *Worker) ReportFailure(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fail(err.Error())
}

// ReportDeadlineMiss records a first-byte deadline the worker missed while proxying (it accepted
// the request and said nothing within the time its own prediction allowed). After ejectAfter
// misses in a row (0: never), with no response from it in between, it is ejected like a worker
// failing its probes, even though its /health passes (passing probes do not clear misses; they
// readmit it later, as after any ejection). It reports whether this miss ejected the worker.
func (w *Worker) ReportDeadlineMiss(reason string, ejectAfter int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.misses++
	w.lastErr = reason
	if ejectAfter <= 0 || w.misses < ejectAfter || w.state == stateEjected {
		return false
	}
	w.misses, w.oks = 0, 0
	w.state = stateEjected
	w.ejected++
	w.holdDown(w.clock())
	return true
}

// ReportSuccess records a response received while proxying; it clears the failure streak of
// a routable worker and its first-byte deadline misses.
func (w *Worker) ReportSuccess() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.misses = 0
	if w.state != stateEjected {
		w.fails = 0
	}
}

// fail must be called with mu held. It returns true when this failure ejected the worker.
func (w *Worker) fail(reason string) bool {
	w.lastErr = reason
	w.oks = 0
	w.fails++
	switch {
	case w.state == stateUnknown,
		w.state == stateHealthy && w.fails >= w.health.FailureThreshold:
		w.state = stateEjected
		w.ejected++
		w.holdDown(w.clock())
		return true
	}
	return false
}

// holdDown must be called with mu held, when the worker was just ejected at now. A worker
// ejected within hold_down_reset of its readmission is flapping: it may not be readmitted for
// hold_down, doubled per consecutive flap up to hold_down_max. Each full hold_down_reset it
// stayed healthy since its readmission forgets one flap.
func (w *Worker) holdDown(now time.Time) {
	base, reset := w.health.HoldDown.D(), w.health.HoldDownReset.D()
	if base <= 0 || reset <= 0 || w.readmitted.IsZero() {
		return
	}
	stable := now.Sub(w.readmitted)
	w.holdLevel = max(w.holdLevel-int(stable/reset), 0)
	if stable >= reset {
		return
	}
	w.holdLevel++
	limit := max(w.health.HoldDownMax.D(), base)
	d := base
	for i := 1; i < w.holdLevel; i++ {
		if d >= limit {
			w.holdLevel = i // no point counting flaps past the cap: decay starts from it
			break
		}
		d *= 2
	}
	d = min(d, limit)
	w.holdUntil = now.Add(d)
}

// succeed must be called with mu held. It returns true when this success (re)admitted the worker.
func (w *Worker) succeed(now time.Time) bool {
	w.fails = 0
	w.lastSeen = now
	switch w.state {
	case stateUnknown:
		w.state = stateHealthy
		return true
	case stateEjected:
		if now.Before(w.holdUntil) {
			return false // held down: successes during the hold-down do not count
		}
		w.oks++
		if w.oks >= w.health.SuccessThreshold {
			w.state, w.oks, w.lastErr = stateHealthy, 0, ""
			w.readmitted = now
			return true
		}
	}
	return false
}

// Status snapshots the worker.
func (w *Worker) Status() Status {
	inflight := make([]int, len(w.inflight))
	for i := range w.inflight {
		inflight[i] = int(w.inflight[i].Load())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	st := [...]string{StateUnknown, StateHealthy, StateEjected}[w.state]
	if w.draining.Load() && w.state != stateEjected {
		st = StateDraining
	}
	return Status{
		URL:                 w.cfg.URL,
		Healthy:             w.state != stateEjected,
		State:               st,
		Draining:            w.draining.Load(),
		ConsecutiveFailures: w.fails,
		LastError:           w.lastErr,
		Ejections:           w.ejected,
		InFlight:            inflight,
		Models:              append([]string(nil), w.models...),
		LastHealthy:         w.lastSeen,
		HeldUntil:           w.holdUntil,
	}
}

// Models returns the model ids the worker listed in its /v1/models at its last healthy probe.
func (w *Worker) Models() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.models...)
}

// MaxModelLen returns the max_model_len the worker reported for model at its last healthy probe,
// or 0 when it reported none. model "" is the worker's first listed model (vLLM's default).
func (w *Worker) MaxModelLen(model string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if model == "" && len(w.models) > 0 {
		model = w.models[0]
	}
	return w.maxLen[model]
}

// State changes a probe can cause, as passed to Registry.OnChange.
const (
	// ChangeAdmitted: the worker's first successful probe.
	ChangeAdmitted = "admitted"
	// ChangeReadmitted: an ejected worker is healthy again. Its /health flapped, so it may have
	// restarted and lost its KV cache.
	ChangeReadmitted = "readmitted"
	// ChangeEjected: the worker stopped being routable.
	ChangeEjected = "ejected"
)

// probe runs one GET /health. It returns the state change it caused ("" for none).
func (w *Worker) probe(parent context.Context) (change string, err error) {
	ctx, cancel := context.WithTimeout(parent, w.health.Timeout.D())
	defer cancel()
	err = w.get(ctx, "/health", nil)
	if err != nil && parent.Err() != nil {
		return "", err // the prober itself is stopping: no verdict
	}
	w.mu.Lock()
	var admitted, ejected bool
	wasEjected := w.state == stateEjected
	if err != nil {
		ejected = w.fail(err.Error())
	} else {
		admitted = w.succeed(w.clock())
	}
	w.mu.Unlock()
	if err == nil {
		// Every healthy probe rereads /v1/models: an adapter loaded at runtime
		// (/v1/load_lora_adapter) becomes routable within one health.interval.
		w.refreshModels(ctx)
	}
	switch {
	case ejected:
		return ChangeEjected, err
	case admitted:
		if wasEjected {
			return ChangeReadmitted, nil
		}
		return ChangeAdmitted, nil
	}
	return "", err
}

// refreshModels reads /v1/models so that adapters served by the worker are known models.
func (w *Worker) refreshModels(ctx context.Context) {
	var list struct {
		Data []struct {
			ID string `json:"id"`
			// MaxModelLen is vLLM's ModelCard.max_model_len (vllm/entrypoints/openai/protocol.py).
			MaxModelLen int `json:"max_model_len"`
		} `json:"data"`
	}
	if err := w.get(ctx, "/v1/models", &list); err != nil {
		return // best effort: the configured model is always known
	}
	ids := make([]string, 0, len(list.Data))
	lens := make(map[string]int, len(list.Data))
	for _, m := range list.Data {
		ids = append(ids, m.ID)
		if m.MaxModelLen > 0 {
			lens[m.ID] = m.MaxModelLen
		}
	}
	w.mu.Lock()
	w.models, w.maxLen = ids, lens
	w.mu.Unlock()
}

func (w *Worker) get(ctx context.Context, path string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.Endpoint(path, ""), nil)
	if err != nil {
		return err
	}
	w.Authorize(req.Header)
	resp, err := w.client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("GET %s: status %d", path, resp.StatusCode)
	}
	if into == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(into); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}
