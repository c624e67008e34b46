// Package routerconfig holds the router package's configuration types (the knobs of the
// KV-aware policies, load accounting, metrics scraping and approximate mode) with their
// defaults and validation. It is a leaf: configs composes these types into the kvgate YAML
// schema without importing the router itself; router re-exports them as KVConfig and
// ApproxConfig.
package routerconfig

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/confval"
)

// KV holds every knob of the KV-aware policies (kv, kv_blocks, kv_no_load), the gateway's load
// accounting, the metrics scraper and the approximate (no-events) mode. kv's cost is a
// predicted TTFT in ms (Latency); kv_blocks' cost is in KV blocks: one block of prompt the
// target would have to prefill weighs the same as one block of load it already carries,
// scaled by the weights below. Default documents the defaults;
// zero is a meaningful value of every field (Validate says which ones it rejects), never
// "use the default": start from Default.
type KV struct {
	// PrefillWeight scales the uncached prompt blocks a target would have to prefill (default 1).
	// Higher favours cache hits over balance; lower favours balance over cache hits.
	PrefillWeight float64 `yaml:"prefill_weight"`
	// G2Credit is the credit for a block resident in host memory beyond the GPU match (default
	// 0.75): loading from host is cheaper than recomputing, not free. 1 treats it like a GPU hit.
	G2Credit float64 `yaml:"g2_credit"`
	// G3Credit is the credit for a block on disk beyond the GPU and host match (default 0.25).
	// Higher trusts disk loads to be fast; lower treats them almost like a miss.
	G3Credit float64 `yaml:"g3_credit"`
	// PrefillLoadWeight scales the prompt tokens (in blocks) in flight on a target before their
	// first token (default 1). Higher steers new prompts away from targets busy prefilling (TTFT);
	// lower tolerates prefill queues for the sake of cache hits.
	PrefillLoadWeight float64 `yaml:"prefill_load_weight"`
	// DecodeWeight scales the KV blocks held by requests active on a target, counting the new
	// request's own blocks not already held there (default 1). Higher balances KV memory and
	// decode batch size; lower lets hot targets accumulate more sequences.
	DecodeWeight float64 `yaml:"decode_weight"`
	// RequestWeight is a cost in blocks per active request on a target (default 0). Raise it to
	// balance request counts when requests are short and block counts say little.
	RequestWeight float64 `yaml:"request_weight"`
	// WaitingWeight is the cost in blocks of each request the worker reports waiting that the
	// gateway did not send itself (other clients or gateways; default 32, a 512-token prompt at
	// block size 16). Higher reacts more strongly to queues the gateway cannot see.
	WaitingWeight float64 `yaml:"waiting_weight"`
	// Temperature turns costs into a softmax draw over min-max normalised costs (default 0: always
	// the lowest cost). Higher spreads load and explores at the price of some cache hits.
	Temperature float64 `yaml:"temperature"`
	// BusyWaitingRequests marks a target busy when its worker reports at least this many waiting
	// requests (default 16; 0 disables). Busy targets are avoided while any other is not busy.
	BusyWaitingRequests int `yaml:"busy_waiting_requests"`
	// BusyKVUsage marks a target busy when its worker reports KV cache usage at or above this
	// fraction (default 0.99: a cache so full that a new prompt waits or preempts; 0 disables).
	// Below it kv prices KV pressure in its prediction instead (latency.kv_pressure_*): a lower
	// threshold moves agents with long contexts off their cache whenever their running requests
	// fill it. Lower keeps headroom against preemption.
	BusyKVUsage float64 `yaml:"busy_kv_usage"`
	// BusyPrefillTokens marks a target busy when the gateway has at least this many prompt tokens
	// in flight to it before their first token (default 0: disabled). Bounds TTFT under bursts.
	BusyPrefillTokens int `yaml:"busy_prefill_tokens"`
	// MetricsInterval is how often each worker's /metrics is scraped to correct the gateway's own
	// load view (default 1s). Shorter is fresher and costs more scrapes.
	MetricsInterval confval.Duration `yaml:"metrics_interval"`
	// MetricsMaxAge is how old a scrape may be and still count (default 5s); older readings are
	// ignored so a dead scrape never pins a target as busy.
	MetricsMaxAge confval.Duration `yaml:"metrics_max_age"`
	// LoadExpiry force-releases load a request still holds after this long (default 1h): a safety
	// net against a caller that never ends a handle. Must exceed the longest expected stream.
	LoadExpiry confval.Duration `yaml:"load_expiry"`
	// Approximate configures the cache prediction used for targets without a healthy event stream.
	Approximate Approx `yaml:"approximate"`
	// Latency configures the predicted-TTFT cost of the kv policy: the prior profile each
	// worker's online fit starts from, the fit, and the terms that are not learned. The block
	// weights above (prefill_weight, prefill_load_weight, decode_weight, request_weight) apply
	// to kv_blocks only; waiting_weight also sizes, for kv, the unseen waiting requests.
	Latency Latency `yaml:"latency"`
	// Hold configures holding a request whose prompt shares a long prefix with a prefill in
	// flight, so that the prefix is computed once (kv only).
	Hold Hold `yaml:"hold"`
}

// Hold configures the sibling hold of the kv policy: a request whose first MinBlocks prompt
// blocks (or more) equal those of a request being prefilled right now on target T is routed to
// T and held at the gateway until that prefix is computed there, instead of computing the same
// prefix side by side, when that is the faster choice: under kv the hold is priced (the
// predicted wait plus the cached suffix's TTFT on T against the best other target's predicted
// TTFT now, with SavedWeight of the GPU time the hold saves when the fleet is loaded). The hold
// lasts at most the first request's predicted remaining TTFT plus Margin, and never applies
// when T is over the busy thresholds.
type Hold struct {
	// Enabled turns the hold on (default true). Off, shared prefixes are still tracked to count
	// duplicate prefill.
	Enabled bool `yaml:"enabled"`
	// MinBlocks is the shortest shared prefix, in blocks, that is worth a hold (default 64:
	// 1,024 tokens at block size 16, about 16 ms of prefill on the default prior; below that
	// the wait's own jitter is of the order of the prefill it saves).
	MinBlocks int `yaml:"min_blocks"`
	// Margin is added to the first request's predicted remaining TTFT to bound the hold
	// (default 250ms): slack for the prediction's error and the KV events' delivery.
	Margin confval.Duration `yaml:"margin"`
	// SavedWeight scales the GPU prefill time a hold saves (the shared prefix not computed a
	// second time) when it is weighed against waiting (default 1): a request is held when the
	// predicted wait plus its cached suffix's TTFT on the first request's target is at most
	// the best other target's predicted TTFT plus SavedWeight × the saved ms × the share of
	// the other workers with requests queued (waiting, or more prefill routed than one step
	// takes; 0 when none is: the next request need not wait behind the duplicate). 0 compares
	// the TTFTs alone (kv only; kv_blocks always holds).
	SavedWeight float64 `yaml:"saved_weight"`
}

// Latency configures the kv policy's TTFT model (router/latency). The five *_ms* knobs are the
// prior profile: the coefficients a worker is scored with until its own fit is ready, and the
// fit's warm start. Defaults are the simulator's default timing profile (vllm-sim --profile
// mocker, the Dynamo mocker's polynomials), the only worker timing kvgate ships and demos; a
// real fleet's fits replace them after ready_samples streamed requests per worker. A prior
// that overprices steps and decode reads on a fast GPU costs little (prefill spreads a little
// more), one that underprices them on a slow GPU packs prefill onto decoding workers.
type Latency struct {
	// FrontendMs is the per-request constant: HTTP, tokenization, scheduling (default 10).
	FrontendMs float64 `yaml:"frontend_ms"`
	// PrefillMsPerToken is the prefill time per uncached prompt token (default 0.0152, ~66k tok/s).
	PrefillMsPerToken float64 `yaml:"prefill_ms_per_token"`
	// AttentionMsPerPair is the time per attention pair: each new token × each token before it,
	// cached or new (default 8.4e-7).
	AttentionMsPerPair float64 `yaml:"attention_ms_per_pair"`
	// StepMs is the fixed time of one engine step that carries prefill (default 16.5: a step's
	// launch and scheduling cost, paid once per max_num_batched_tokens of prefill).
	StepMs float64 `yaml:"step_ms"`
	// StepMsPerKVToken is a step's time per KV token of the running decodes (default 2e-4: a
	// decode step read of 54 ms over a full pool of 16,384 blocks of 16 tokens).
	StepMsPerKVToken float64 `yaml:"step_ms_per_kv_token"`
	// MaxNumBatchedTokens is the workers' --max-num-batched-tokens, the token budget of one step
	// (default 8192, vLLM's serve default on H100-class GPUs).
	MaxNumBatchedTokens int `yaml:"max_num_batched_tokens"`
	// KVPressureStart is the KV cache usage above which a target risks preemption (default 0.9);
	// KVPressureWeight is the fraction of its queued and own prefill time added at full usage
	// (default 1; 0 turns the term off).
	KVPressureStart  float64 `yaml:"kv_pressure_start"`
	KVPressureWeight float64 `yaml:"kv_pressure_weight"`
	// FleetWeight prices the delay a request's prefill imposes on the target's running decodes:
	// its own prefill time, times the running decodes, times this (default 0.05; 0 turns it
	// off). Higher keeps prefill away from busy decoders and sessions on their cache (a hit
	// shrinks the prefill).
	FleetWeight float64 `yaml:"fleet_weight"`
	// EvictWeight prices the evictions a prefill causes on a target whose KV cache
	// (num_gpu_blocks) is already asked to hold its working set (the blocks routed there within
	// approximate.ttl): the prefill time of the blocks it pushes out, times this (default 1; 0
	// turns it off). Higher keeps prompts where they fit, and off workers full of live prefixes.
	EvictWeight float64 `yaml:"evict_weight"`
	// EvictStaleAfter, when > 0, prices as free the evicted working-set blocks last routed
	// longer ago than this: an LRU cache evicts its oldest blocks first, and a prefix left
	// that long is seldom asked for again (default 30s; 0 = every block of the working set
	// counts).
	EvictStaleAfter confval.Duration `yaml:"evict_stale_after"`
	// RecomputeWeight prices, as a fraction of their prefill time, the prompt blocks a target
	// would compute that the best-cached candidate already holds (0 = off): the fleet's share of
	// moving a request away from its cache, which delays what queues behind it there
	// (default 2).
	RecomputeWeight float64 `yaml:"recompute_weight"`
	// OverflowWeight prices, as a fraction of their prefill time, the part of a target's
	// overflow (its working set plus this prefill beyond num_gpu_blocks) that this prompt's
	// cached prefix shares in (latency.OverflowBlocks; 0 = off): sessions whose live contexts
	// outgrow one worker's cache evict each other on every turn, so staying there costs a
	// recompute each time they cycle, and one move while contexts are smaller costs it once.
	OverflowWeight float64 `yaml:"overflow_weight"`
	// QueueLossWeight scales the part of a target's cached prefix counted as lost to the
	// prefill queued ahead of the request there (latency.QueueLossBlocks, the prefix placed in
	// the target's LRU order by its working set; 0 = off): those tokens are priced as uncached.
	QueueLossWeight float64 `yaml:"queue_loss_weight"`
	// Learn turns the online fit on (default true); false scores every worker with the prior.
	Learn bool `yaml:"learn"`
	// LearnFrom names the sample sources the fit learns from: gateway_ttft (the TTFTs the
	// gateway measures), worker_prefill and worker_step (the worker's own prefill-time and
	// inter-token-latency histograms, per scrape window), gateway_itl (the time between relayed
	// stream events). Default gateway_ttft only: with the worker's sources on as well, kv
	// captured less of the cache on the simulator (docs/routing.md, the `latency.learn_from` row).
	LearnFrom []string `yaml:"learn_from"`
	// Forgetting is the fit's forgetting factor λ in (0, 1] (default 0.997: a memory of ~330
	// requests). Lower tracks changes faster and is noisier.
	Forgetting float64 `yaml:"forgetting"`
	// ReadySamples is how many observed requests a worker's fit needs before it may replace the
	// prior (default 20); it does so only while it predicts the recent requests better.
	ReadySamples int `yaml:"ready_samples"`
}

// Approx configures approximate mode: the gateway assumes that the blocks it routed to a
// target are resident there, until they expire or the target's block budget pushes them out.
type Approx struct {
	// TTL is how long routed blocks are assumed resident after their last use (default 120s, as
	// Dynamo). Longer keeps affinity across idle gaps; shorter forgets evicted prefixes sooner.
	TTL confval.Duration `yaml:"ttl"`
	// BlockBudget is how many blocks per target are assumed resident at most, least recently used
	// out first (default 16384). Set it near the worker's GPU block count (vllm:cache_config_info).
	BlockBudget int `yaml:"block_budget"`
}

// Default returns the documented defaults.
func Default() KV {
	return KV{
		PrefillWeight:       1,
		G2Credit:            0.75,
		G3Credit:            0.25,
		PrefillLoadWeight:   1,
		DecodeWeight:        1,
		RequestWeight:       0,
		WaitingWeight:       32,
		Temperature:         0,
		BusyWaitingRequests: 16,
		BusyKVUsage:         0.99,
		BusyPrefillTokens:   0,
		MetricsInterval:     confval.Duration(time.Second),
		MetricsMaxAge:       confval.Duration(5 * time.Second),
		LoadExpiry:          confval.Duration(time.Hour),
		Approximate: Approx{
			TTL:         confval.Duration(120 * time.Second),
			BlockBudget: 16384,
		},
		Latency: Latency{
			FrontendMs: 10, PrefillMsPerToken: 0.0152, AttentionMsPerPair: 8.4e-7,
			StepMs: 16.5, StepMsPerKVToken: 2e-4, MaxNumBatchedTokens: 8192,
			KVPressureStart: 0.9, KVPressureWeight: 1, FleetWeight: 0.05, EvictWeight: 1, RecomputeWeight: 2,
			EvictStaleAfter: confval.Duration(30 * time.Second),
			Learn:           true, LearnFrom: []string{"gateway_ttft"}, Forgetting: 0.997, ReadySamples: 20,
		},
		Hold: Hold{Enabled: true, MinBlocks: 64, Margin: confval.Duration(250 * time.Millisecond), SavedWeight: 1},
	}
}

// Validate returns every invalid knob, each naming its YAML key relative to the section
// ("decode_weight", "approximate.ttl"); configs prefixes them with "router.".
// LearnSources are the names router.latency.learn_from accepts, in the router's source order.
func LearnSources() []string {
	return []string{"gateway_ttft", "worker_prefill", "worker_step", "gateway_itl"}
}

func (c KV) Validate() error {
	var p confval.Problems
	for i, src := range c.Latency.LearnFrom {
		if !slices.Contains(LearnSources(), src) {
			p.Addf(fmt.Sprintf("latency.learn_from[%d]", i), "%q is not one of %s", src, strings.Join(LearnSources(), ", "))
		}
	}
	weights := []struct {
		key string
		v   float64
	}{
		{"prefill_weight", c.PrefillWeight},
		{"prefill_load_weight", c.PrefillLoadWeight},
		{"decode_weight", c.DecodeWeight},
		{"request_weight", c.RequestWeight},
		{"waiting_weight", c.WaitingWeight},
		{"temperature", c.Temperature},
		{"latency.frontend_ms", c.Latency.FrontendMs},
		{"latency.prefill_ms_per_token", c.Latency.PrefillMsPerToken},
		{"latency.attention_ms_per_pair", c.Latency.AttentionMsPerPair},
		{"latency.step_ms", c.Latency.StepMs},
		{"latency.step_ms_per_kv_token", c.Latency.StepMsPerKVToken},
		{"latency.kv_pressure_weight", c.Latency.KVPressureWeight},
		{"latency.fleet_weight", c.Latency.FleetWeight},
		{"latency.evict_weight", c.Latency.EvictWeight},
		{"latency.recompute_weight", c.Latency.RecomputeWeight},
		{"latency.overflow_weight", c.Latency.OverflowWeight},
		{"latency.queue_loss_weight", c.Latency.QueueLossWeight},
	}
	if c.Latency.EvictStaleAfter.D() < 0 {
		p.Addf("latency.evict_stale_after", "must be >= 0, got %v", c.Latency.EvictStaleAfter.D())
	}
	for _, w := range weights {
		if !(w.v >= 0) || math.IsInf(w.v, 0) {
			p.Addf(w.key, "must be a finite number >= 0, got %v", w.v)
		}
	}
	fractions := []struct {
		key string
		v   float64
	}{
		{"g2_credit", c.G2Credit},
		{"g3_credit", c.G3Credit},
		{"busy_kv_usage", c.BusyKVUsage},
		{"latency.kv_pressure_start", c.Latency.KVPressureStart},
	}
	for _, f := range fractions {
		if !(f.v >= 0 && f.v <= 1) {
			p.Addf(f.key, "must be between 0 and 1, got %v", f.v)
		}
	}
	if c.BusyWaitingRequests < 0 {
		p.Addf("busy_waiting_requests", "must be >= 0 (0 turns it off), got %d", c.BusyWaitingRequests)
	}
	if c.Hold.MinBlocks < 1 {
		p.Addf("hold.min_blocks", "must be >= 1, got %d", c.Hold.MinBlocks)
	}
	if c.Hold.Margin < 0 {
		p.Addf("hold.margin", "must be >= 0, got %v", c.Hold.Margin)
	}
	if !(c.Hold.SavedWeight >= 0) || math.IsInf(c.Hold.SavedWeight, 0) {
		p.Addf("hold.saved_weight", "must be a finite number >= 0, got %v", c.Hold.SavedWeight)
	}
	if c.BusyPrefillTokens < 0 {
		p.Addf("busy_prefill_tokens", "must be >= 0 (0 turns it off), got %d", c.BusyPrefillTokens)
	}
	durations := []struct {
		key string
		v   confval.Duration
	}{
		{"metrics_interval", c.MetricsInterval},
		{"metrics_max_age", c.MetricsMaxAge},
		{"load_expiry", c.LoadExpiry},
		{"approximate.ttl", c.Approximate.TTL},
	}
	for _, d := range durations {
		if d.v <= 0 {
			p.Addf(d.key, "must be a positive duration, got %s", d.v)
		}
	}
	if c.MetricsMaxAge > 0 && c.MetricsInterval > 0 && c.MetricsMaxAge < c.MetricsInterval {
		p.Addf("metrics_max_age", "(%s) must be at least router.metrics_interval (%s), or every reading is stale before the next scrape", c.MetricsMaxAge, c.MetricsInterval)
	}
	if c.Latency.MaxNumBatchedTokens < 1 {
		p.Addf("latency.max_num_batched_tokens", "must be at least 1 token, got %d", c.Latency.MaxNumBatchedTokens)
	}
	if !(c.Latency.Forgetting > 0 && c.Latency.Forgetting <= 1) {
		p.Addf("latency.forgetting", "must be in (0, 1], got %v", c.Latency.Forgetting)
	}
	if c.Latency.ReadySamples < 1 {
		p.Addf("latency.ready_samples", "must be at least 1, got %d", c.Latency.ReadySamples)
	}
	if c.Approximate.BlockBudget < 1 {
		p.Addf("approximate.block_budget", "must be at least 1 block, got %d", c.Approximate.BlockBudget)
	}
	return p.Err()
}

// Responses bounds the Responses API pins: each response id a worker produced (and stores,
// store true) is remembered with that worker+rank, so a follow-up with previous_response_id,
// and GET/DELETE/cancel of the id, go there and nowhere else.
type Responses struct {
	// MaxPins is how many response ids are remembered, least recently used dropped first
	// (default 100000; 0 remembers none: every follow-up is answered 404).
	MaxPins int `yaml:"max_pins"`
	// PinTTL forgets a pin this long after its last use (default 24h; 0: never by age).
	PinTTL confval.Duration `yaml:"pin_ttl"`
}

// DefaultResponses returns the pin defaults.
func DefaultResponses() Responses {
	return Responses{MaxPins: 100000, PinTTL: confval.Duration(24 * time.Hour)}
}

// Validate reports negative values (keys relative to the section: max_pins, pin_ttl).
func (r Responses) Validate() error {
	var p confval.Problems
	if r.MaxPins < 0 {
		p.Addf("max_pins", "must be >= 0, got %d", r.MaxPins)
	}
	if r.PinTTL < 0 {
		p.Addf("pin_ttl", "must be >= 0, got %s", r.PinTTL.D())
	}
	return p.Err()
}
