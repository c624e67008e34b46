package flowcontrol

import (
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/kvgate/kvgate/confval"
)

// The priorities a key or a header may give (a bounded range keeps the per-priority metrics'
// series bounded).
const (
	MinPriority = -100
	MaxPriority = 100
)

// Config is the flow_control section: the gateway's queue of requests that found every
// candidate worker saturated (router.busy_* or the max_* thresholds below). Zero is a value of every field;
// defaults come from Default only.
type Config struct {
	// Enabled turns the queue on (default true, from the measurements in
	// docs/benchmarks/2026-12-05-overload-late-binding.md). Off, a request goes to a worker
	// even when every candidate is busy and waits in that worker's queue.
	Enabled bool `yaml:"enabled"`
	// MaxRequests bounds the requests waiting per model pool (default 1000); one more is
	// answered 429 with Retry-After (0: every request that would wait is refused).
	MaxRequests int `yaml:"max_requests"`
	// MaxBytes bounds the request bodies waiting per model pool, in bytes (default 64 MiB);
	// a request that would pass it is answered 429 with Retry-After.
	MaxBytes confval.ByteSize `yaml:"max_bytes"`
	// QueueTimeout bounds a waiting request's time to its first token, counted from its
	// arrival at the gateway (default 30s): it is answered 503 with Retry-After once the
	// timeout passed, or earlier, as soon as the kv time model predicts that no worker can
	// give it its first token in time any more (its own prefill after the worker's wait, both
	// scaled by how far the model fell short on that worker lately); it is never sent where
	// its first token is predicted later. A streamed request that waited is also held to it
	// at the edge: if its worker has sent no first byte by then, the request is cancelled
	// there and answered the same 503. A prefill longer than half the timeout counts as half
	// of it, so a prompt too long for any worker to answer in time is not refused for its
	// length: its wait is bounded by the other half, and it is not cut.
	QueueTimeout confval.Duration `yaml:"queue_timeout"`
	// MaxPredictedWait marks a worker saturated when the kv policy's time model predicts that
	// a request sent there now would wait longer than this before its own prefill starts: the
	// prefill already queued there, the running decodes' share of those steps, KV pressure
	// (default 500ms; 0 turns it off; no effect under the other policies).
	MaxPredictedWait confval.Duration `yaml:"max_predicted_wait"`
	// ContendedPredictedWait replaces max_predicted_wait for a request that others contend
	// with: a higher priority was seen within contention_window, or its tenant's attained
	// service is over contended_share times the mean of the tenants active within the window
	// (default 200ms; 0: contention changes nothing). The workers' own queues (first come,
	// first served) then stay short, so the gateway's order (priority, fair share) decides who
	// runs next, and the rest of max_predicted_wait stays headroom for the favoured requests.
	// A request contended by a higher priority also leaves the last worker under
	// max_predicted_wait to that priority (with two workers or more).
	ContendedPredictedWait confval.Duration `yaml:"contended_predicted_wait"`
	// ContentionWindow is how long a priority or a tenant counts as active after its last
	// request (default 10s).
	ContentionWindow confval.Duration `yaml:"contention_window"`
	// ContendedShare: a tenant whose attained service is over this many times the mean of the
	// tenants active within contention_window is held to contended_predicted_wait (default
	// 1.5; 0: tenants never contend, only priorities).
	ContendedShare float64 `yaml:"contended_share"`
	// ProtectCache keeps a request off a worker that holds the recent prompt of a class that
	// outranks it, while the router's working sets count that prompt as still cached there:
	// a higher priority's, or, between tenants named by a client key or the fairness header,
	// that of a tenant the request's tenant is over its share against (it asked for more
	// service on arrival, and has requests waiting at the gateway while the other has none
	// or asked for more than contended_share times the other's). Its prefills then neither evict that prompt nor queue ahead of the class's
	// next request. The workers with the most such blocks are avoided first, and at least
	// half of the eligible workers (rounded up) stay eligible (default true, from the
	// measurements in docs/benchmarks/2026-12-05-cache-protection.md). The outranking class
	// itself is routed as without it.
	ProtectCache bool `yaml:"protect_cache"`
	// ProtectWindow is how long a class's prompt on a worker stays protected after the
	// class last routed there (default 60s: longer than the longest think time of the
	// recorded agent traces replayed at time scale 0.05, 28 s); the router's working set
	// (router.approximate.ttl) bounds it too.
	ProtectWindow confval.Duration `yaml:"protect_window"`
	// MaxPrefillTokens marks a worker saturated when the uncached prompt tokens in flight to
	// it before their first token (every replica's) reach this (default 0: off).
	MaxPrefillTokens int `yaml:"max_prefill_tokens"`
	// MaxWaitingRequests marks a worker saturated when its reported waiting requests, moved
	// forward by what the gateway sent since the scrape, reach this (default 0: off). Works
	// under every policy; the only threshold besides router.busy_* that does without the kv
	// policy's tokenization.
	MaxWaitingRequests int `yaml:"max_waiting_requests"`
	// RetryAfter is the Retry-After of a 429 (queue full) or 503 (queue timeout, no worker)
	// the queue answers, rounded up to whole seconds (default 1s).
	RetryAfter confval.Duration `yaml:"retry_after"`
	// Objectives maps GIE's x-gateway-inference-objective header values to priorities
	// (default none); an objective not listed leaves the request's priority as it was.
	Objectives map[string]int `yaml:"objectives"`
	// FairnessHeader names the header whose value splits a tenant into fair-share tenants
	// (default x-gateway-inference-fairness-id, GIE's); "" ignores such headers. Under client
	// keys the value only subdivides the key's own share: it never joins another key's.
	FairnessHeader string `yaml:"fairness_header"`
	// ServiceHalfLife is the half-life of a tenant's attained service, the weighted tokens
	// its dispatched requests used (default 60s): the tenant with the least is served first
	// within a priority.
	ServiceHalfLife confval.Duration `yaml:"service_half_life"`
	// InputWeight weighs a request's prompt tokens in its tenant's attained service (default 1).
	InputWeight float64 `yaml:"input_weight"`
	// OutputWeight weighs a request's output tokens in its tenant's attained service (default
	// 1): its max_tokens when it is let through, the worker's reported completion tokens once
	// the response ends.
	OutputWeight float64 `yaml:"output_weight"`
	// AgeWeight is the credit, in ms of predicted gain, that one ms of waiting earns a request
	// when a freed worker chooses among the waiting requests of a tenant (default 0.1): a
	// request whose prefix the worker holds goes first, and an uncached one still gets its
	// turn once it waited ten times the other's gain longer.
	AgeWeight float64 `yaml:"age_weight"`
	// RecomputeWeight prices what a request's move away from the worker holding its cached
	// prefix costs the fleet, as a fraction of the prefill it recomputes (default 2, as
	// router.latency.recompute_weight): the queue moves a request to another worker only when
	// the holder's predicted wait exceeds (1 + this) times the prefill the move recomputes,
	// since that prefill delays every request behind it there and evicts other prompts'
	// cached blocks (0: the request's own time only). A request that finds nobody waiting pays
	// it in proportion to the share of the other workers that take no request now (saturated,
	// or at max_predicted_wait): beside idle workers the recompute delays nobody. A waiting
	// request pays it in proportion to the share of the waiting requests that the idle workers
	// (nothing in flight, no prefill queued) cannot take at once, and at least half of it:
	// all of it while many wait and every worker has a queue (overload), half while idle
	// workers are enough for every waiting request (a subagent fan-out beside idle workers).
	RecomputeWeight float64 `yaml:"recompute_weight"`
	// PollInterval is how often the waiting requests are matched against the workers' load
	// besides every load change the gateway sees (default 50ms): a safety net for capacity
	// that frees unseen (a peer replica's request ending, a worker coming back).
	PollInterval confval.Duration `yaml:"poll_interval"`
}

// Default returns the documented defaults (the queue on).
func Default() Config {
	return Config{
		Enabled:                true,
		MaxRequests:            1000,
		MaxBytes:               64 << 20,
		QueueTimeout:           confval.Duration(30 * time.Second),
		MaxPredictedWait:       confval.Duration(500 * time.Millisecond),
		ContendedPredictedWait: confval.Duration(200 * time.Millisecond),
		ContentionWindow:       confval.Duration(10 * time.Second),
		ContendedShare:         1.5,
		ProtectCache:           true,
		ProtectWindow:          confval.Duration(time.Minute),
		RetryAfter:             confval.Duration(time.Second),
		FairnessHeader:         "x-gateway-inference-fairness-id",
		ServiceHalfLife:        confval.Duration(time.Minute),
		InputWeight:            1,
		OutputWeight:           1,
		AgeWeight:              0.1,
		RecomputeWeight:        2,
		PollInterval:           confval.Duration(50 * time.Millisecond),
	}
}

// Validate returns every invalid key, relative to the section (configs prefixes
// "flow_control.").
func (c Config) Validate() error {
	var p confval.Problems
	if c.MaxRequests < 0 {
		p.Addf("max_requests", "must be >= 0, got %d", c.MaxRequests)
	}
	if c.MaxBytes < 0 {
		p.Addf("max_bytes", "must be >= 0, got %d", c.MaxBytes)
	}
	for _, d := range []struct {
		key string
		v   confval.Duration
	}{{"queue_timeout", c.QueueTimeout}, {"service_half_life", c.ServiceHalfLife}, {"poll_interval", c.PollInterval}} {
		if d.v <= 0 {
			p.Addf(d.key, "must be a positive duration, got %s", d.v)
		}
	}
	if c.MaxPredictedWait < 0 {
		p.Addf("max_predicted_wait", "must be >= 0 (0 turns it off), got %s", c.MaxPredictedWait)
	}
	if c.ContendedPredictedWait < 0 {
		p.Addf("contended_predicted_wait", "must be >= 0 (0 turns it off), got %s", c.ContendedPredictedWait)
	}
	if c.ProtectWindow < 0 {
		p.Addf("protect_window", "must be >= 0, got %s", c.ProtectWindow)
	}
	if c.ContentionWindow < 0 {
		p.Addf("contention_window", "must be >= 0, got %s", c.ContentionWindow)
	}
	if c.MaxPrefillTokens < 0 {
		p.Addf("max_prefill_tokens", "must be >= 0 (0 turns it off), got %d", c.MaxPrefillTokens)
	}
	if c.MaxWaitingRequests < 0 {
		p.Addf("max_waiting_requests", "must be >= 0 (0 turns it off), got %d", c.MaxWaitingRequests)
	}
	if c.RetryAfter < 0 {
		p.Addf("retry_after", "must be >= 0, got %s", c.RetryAfter)
	}
	for _, w := range []struct {
		key string
		v   float64
	}{{"input_weight", c.InputWeight}, {"output_weight", c.OutputWeight}, {"age_weight", c.AgeWeight}, {"recompute_weight", c.RecomputeWeight}, {"contended_share", c.ContendedShare}} {
		if !(w.v >= 0) || math.IsInf(w.v, 0) {
			p.Addf(w.key, "must be a finite number >= 0, got %v", w.v)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Objectives)) {
		if prio := c.Objectives[name]; prio < MinPriority || prio > MaxPriority {
			p.Addf("objectives."+name, "must be between %d and %d, got %d", MinPriority, MaxPriority, prio)
		}
	}
	if c.FairnessHeader != "" && !validHeaderName(c.FairnessHeader) {
		p.Addf("fairness_header", "%q is not a valid HTTP header name", c.FairnessHeader)
	}
	return p.Err()
}

// validHeaderName reports whether s is an HTTP token (RFC 9110 §5.1).
func validHeaderName(s string) bool {
	for _, r := range s {
		if r > 0x7e || r <= ' ' || r == ':' || r == '"' || r == '(' || r == ')' || r == ',' || r == '/' ||
			r == ';' || r == '<' || r == '=' || r == '>' || r == '?' || r == '@' || r == '[' || r == '\\' ||
			r == ']' || r == '{' || r == '}' {
			return false
		}
	}
	return http.CanonicalHeaderKey(s) != ""
}

// RetryAfterSeconds is RetryAfter in whole seconds, rounded up, at least 1.
func (c Config) RetryAfterSeconds() int {
	return max(1, int(math.Ceil(c.RetryAfter.D().Seconds())))
}

// PriorityLabel is a priority as a metric label value.
func PriorityLabel(p int) string { return fmt.Sprint(p) }

// Load is what flow control reads of one worker's load (the router's Capacity.Saturation).
type Load struct {
	// Busy: over one of the router's busy thresholds (router.busy_*).
	Busy          bool
	PrefillTokens int
	Waiting       float64
	HasWaiting    bool
	WaitMs        float64
	HasWait       bool
	// Requests are the requests in flight there (0: nothing runs there).
	Requests int
	// TTFTRatio is TargetState.TTFTRatio.
	TTFTRatio float64
}

// Saturated reports whether a worker with load l takes no more requests now: over a router
// busy threshold, or over one of the section's own thresholds (each 0 = off).
func (c Config) Saturated(l Load) bool {
	return c.saturatedForAll(l) || c.MaxPredictedWait > 0 && l.HasWait && l.WaitMs >= ms(c.MaxPredictedWait)
}

// saturatedForAll reports the thresholds that bind every request alike (all but the
// predicted wait, whose bound depends on the request's contention).
func (c Config) saturatedForAll(l Load) bool {
	return l.Busy ||
		c.MaxPrefillTokens > 0 && l.PrefillTokens >= c.MaxPrefillTokens ||
		c.MaxWaitingRequests > 0 && l.HasWaiting && l.Waiting >= float64(c.MaxWaitingRequests)
}

// State is a worker's load as the queue's dispatch reads it (Queue.Next, Queue.Place).
func (c Config) State(l Load) TargetState {
	return TargetState{Saturated: c.saturatedForAll(l), WaitMs: l.WaitMs, HasWait: l.HasWait, Running: l.Requests,
		TTFTRatio: l.TTFTRatio}
}

func ms(d confval.Duration) float64 { return float64(d.D()) / float64(time.Millisecond) }
