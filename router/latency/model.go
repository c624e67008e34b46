// Package latency predicts how long a vLLM worker will take to produce a request's first
// token (TTFT), and learns the prediction's coefficients online per worker.
//
// The model follows how vLLM v1 schedules a step (vllm/v1/core/sched/scheduler.py,
// Scheduler.schedule): running decodes are scheduled first, one token each, and the rest of the
// max_num_batched_tokens budget goes to prefill in FCFS order, chunked. A request's first token
// therefore comes after every step that drains the prefill queued ahead of it plus its own
// uncached tokens, and each of those steps also carries the running decode batch. Summed over
// those steps, TTFT is linear in five features (Features).
//
// Everything here is pure: no I/O, no clock, no locks. Theta, Params, State, Req and the
// functions over them are values and safe for concurrent use; a Fitter is not (its owner
// serialises Observe and Reset, and hands out copies of its Theta for reading).
package latency

import "math"

// Feature indices of Theta and Features.
const (
	FFrontend = iota // 1: the per-request constant (HTTP, tokenization, scheduling)
	FTokens          // prefill tokens computed before the first token: queued ahead + own
	FPairs           // attention pairs of those tokens (new token × context before it)
	FSteps           // engine steps until the request's last prefill chunk
	FStepsKV         // steps × the KV tokens of the running decodes each step reads
	NumFeatures
)

// FeatureNames names the coefficients in Theta order (for debug views).
func FeatureNames() [NumFeatures]string {
	return [NumFeatures]string{"frontend_ms", "prefill_ms_per_token", "attention_ms_per_pair", "step_ms", "step_ms_per_kv_token"}
}

// Theta holds the model's coefficients in milliseconds per unit of each feature (FFrontend …
// FStepsKV). A valid Theta is finite and nonnegative.
type Theta [NumFeatures]float64

// Params are the model's fixed, non-learned parameters.
type Params struct {
	// MaxBatchedTokens is vLLM's --max-num-batched-tokens: the token budget of one step.
	MaxBatchedTokens int
	// KVPressureStart is the KV cache usage (0..1) above which a target risks preemption and
	// admission stalls; KVPressureWeight scales the prefill time added at full usage.
	KVPressureStart  float64
	KVPressureWeight float64
}

// State is what a target carries at routing time.
type State struct {
	AheadTokens    float64 // uncached prefill tokens routed there that have not produced a first token
	AheadPairs     float64 // their attention pairs, Σ u·(c + u/2)
	DecodeRequests float64 // running decodes (B_dec)
	DecodeKVTokens float64 // their summed KV length (K_dec)
	KVUsage        float64 // the worker's reported KV cache usage 0..1; 0 when unknown
}

// Req is the request as one target would see it.
type Req struct {
	Uncached float64 // prompt tokens the target must compute (u)
	Cached   float64 // prompt tokens it finds in its prefix cache (c)
}

// Prediction is a TTFT prediction in ms with its named terms; TotalMs is their sum.
type Prediction struct {
	FrontendMs float64 // the per-request constant
	QueuedMs   float64 // prefill queued ahead on the target
	OwnMs      float64 // the request's own prefill: uncached tokens and their attention
	DecodeMs   float64 // the steps' share of the running decodes (count via steps, KV length)
	PressureMs float64 // preemption / admission risk when the KV cache is nearly full
	TotalMs    float64
}

// Pairs is the attention work of u new tokens after c cached ones: each new token attends to
// the cached context and to the new tokens before it, u·c + u²/2.
func Pairs(u, c float64) float64 { return u * (c + u/2) }

// Steps is how many engine steps drain tokens of prefill when each step first gives one token
// to each of bDec running decodes: ceil(tokens / (maxBatched − bDec)). The prefill budget is
// floored at an eighth of the step budget (vLLM's max_num_seqs keeps the batch well below the
// token budget in practice). No prefill is zero steps.
func Steps(tokens, bDec float64, maxBatched int) float64 {
	if tokens <= 0 {
		return 0
	}
	m := float64(max(maxBatched, 1))
	budget := math.Max(m-math.Max(bDec, 0), m/8)
	return math.Ceil(tokens / math.Max(budget, 1))
}

// Features returns the regression features of r on a target in state s.
func Features(s State, r Req, p Params) [NumFeatures]float64 {
	tokens := s.AheadTokens + r.Uncached
	steps := Steps(tokens, s.DecodeRequests, p.MaxBatchedTokens)
	return [NumFeatures]float64{
		FFrontend: 1,
		FTokens:   tokens,
		FPairs:    s.AheadPairs + Pairs(r.Uncached, r.Cached),
		FSteps:    steps,
		FStepsKV:  steps * s.DecodeKVTokens,
	}
}

// PrefillMs is the prefill time of u uncached tokens after c cached ones, with no queue and
// no decodes (what a cache hit of u tokens saves).
func PrefillMs(th Theta, u, c float64) float64 {
	return th[FTokens]*u + th[FPairs]*Pairs(u, c)
}

// PressureFactor is 0 below p.KVPressureStart and rises linearly to p.KVPressureWeight at a
// full KV cache. Near full, vLLM admits a new prompt only when its blocks fit and otherwise
// preempts running requests, whose prefill is recomputed later (scheduler.py, _preempt_request).
func PressureFactor(kvUsage float64, p Params) float64 {
	if p.KVPressureStart >= 1 || kvUsage <= p.KVPressureStart {
		return 0
	}
	f := (math.Min(kvUsage, 1) - p.KVPressureStart) / (1 - p.KVPressureStart)
	return f * p.KVPressureWeight
}

// PredictTTFT predicts r's time to first token on a target in state s:
//
//	frontend + queued prefill ahead + own prefill + decode interference + KV pressure
//
// where the prefill terms are θ_tokens·tokens + θ_pairs·pairs, the decode term θ_step·n +
// θ_kv·n·K_dec over the n steps that drain the queued and own tokens, and the pressure term
// scales the prefill terms by PressureFactor.
func PredictTTFT(th Theta, p Params, s State, r Req) Prediction {
	steps := Steps(s.AheadTokens+r.Uncached, s.DecodeRequests, p.MaxBatchedTokens)
	var out Prediction
	out.FrontendMs = th[FFrontend]
	out.QueuedMs = th[FTokens]*s.AheadTokens + th[FPairs]*s.AheadPairs
	out.OwnMs = PrefillMs(th, r.Uncached, r.Cached)
	out.DecodeMs = th[FSteps]*steps + th[FStepsKV]*steps*s.DecodeKVTokens
	out.PressureMs = PressureFactor(s.KVUsage, p) * (out.QueuedMs + out.OwnMs)
	out.TotalMs = out.FrontendMs + out.QueuedMs + out.OwnMs + out.DecodeMs + out.PressureMs
	return out
}

// FleetMs is the delay a request's prefill imposes on others on the target: decodes are
// scheduled in every step, so each of the target's running streams waits through every step
// that carries a chunk of this prefill, about prefillMs in all. weight converts that stall,
// summed over the streams, into ms of this request's TTFT. A cache hit shrinks prefillMs, so
// the term also prices the prefill a better-cached target would have saved; unlike pricing
// only that difference, it does not treat the best candidate's own prefill as free for the
// decodes already running there.
func FleetMs(prefillMs, decodeRequests, weight float64) float64 {
	if prefillMs <= 0 || decodeRequests <= 0 {
		return 0
	}
	return weight * prefillMs * decodeRequests
}

// QueueLossBlocks is how many blocks of a request's cached prefix (cached blocks on the GPU)
// the prefill queued ahead of it on a target (ahead blocks) evicts before the request is
// scheduled there: vLLM looks a waiting request's prefix up only when it admits it
// (vllm/v1/core/sched/scheduler.py, Scheduler.schedule, kv_cache_manager.get_computed_blocks),
// and every block the queue ahead allocates comes from the free queue, cached blocks least
// recently used first (vllm/v1/core/block_pool.py, BlockPool.get_new_blocks). The prefix
// survives while the blocks used after it (newer, the queue ahead's included) and the prefix
// itself fit in the cache; the excess, max(0, newer + cached − capacity), is lost, at most
// the prefix and at most what the queue ahead allocates (the index says the prefix is there
// now, so whatever excess is not yet allocated is the queue's). No capacity known (≤ 0) or
// nothing ahead loses nothing.
func QueueLossBlocks(cached, ahead, newer, capacity float64) float64 {
	if capacity <= 0 || cached <= 0 || ahead <= 0 {
		return 0
	}
	return math.Min(math.Min(cached, ahead), math.Max(0, newer+cached-capacity))
}

// RecomputeMs prices prefilling tokens that another target already holds in its cache: weight
// times their prefill after context cached tokens. Choosing such a target spends that GPU
// time on work a hit elsewhere would have saved, and every request queued behind it there
// waits for it; the request's own TTFT (PredictTTFT) counts it only once, for itself.
func RecomputeMs(th Theta, tokens, context, weight float64) float64 {
	if tokens <= 0 || weight <= 0 {
		return 0
	}
	return weight * PrefillMs(th, tokens, context)
}

// Dot is xᵀθ.
func Dot(th Theta, x [NumFeatures]float64) float64 {
	s := 0.0
	for i := range th {
		s += th[i] * x[i]
	}
	return s
}

// Valid reports whether every coefficient is finite and nonnegative.
func (th Theta) Valid() bool {
	for _, v := range th {
		if !(v >= 0) || math.IsInf(v, 0) {
			return false
		}
	}
	return true
}

// EvictBlocks is how many blocks of a working set the target's cache must keep (prefixes that
// will be asked for again) a prefill of newBlocks pushes out of a KV cache of capacity blocks:
// the part of its own footprint beyond the room the working set leaves,
// min(newBlocks, max(0, workingSet + newBlocks − capacity)). vLLM allocates a prefill's
// blocks from the free queue, whose cached blocks go least recently used first
// (vllm/v1/core/block_pool.py, BlockPool.get_new_blocks), so once the working set fills the
// cache every new block costs one of them. No capacity known (≤ 0) is no eviction.
func EvictBlocks(newBlocks, workingSet, capacity float64) float64 {
	if capacity <= 0 || newBlocks <= 0 {
		return 0
	}
	return math.Min(newBlocks, math.Max(0, workingSet+newBlocks-capacity))
}

// OverflowBlocks is the rest of a target's overflow that a prompt of promptBlocks, newBlocks of
// them computed there, shares in: with the working set plus the new blocks beyond capacity,
// the overflow O = max(0, workingSet + newBlocks − capacity) is pushed out again each time the
// sessions that hold it come back (an LRU cache cycled by a working set larger than itself
// misses on every pass), and this prompt's cached prefix is part of that cycle. It is the
// overflow up to the whole prompt less what EvictBlocks already counts:
// min(promptBlocks, O) − EvictBlocks. A prompt on a target with room, or one that brings all
// its blocks (nothing cached there), has none.
func OverflowBlocks(newBlocks, promptBlocks, workingSet, capacity float64) float64 {
	if capacity <= 0 || promptBlocks <= newBlocks {
		return 0
	}
	o := math.Max(0, workingSet+newBlocks-capacity)
	return math.Min(promptBlocks, o) - EvictBlocks(newBlocks, workingSet, capacity)
}

// EvictMs prices evicting tokens of prefixes that will be asked for again: weight times their
// prefill when they are, after context tokens each (the evicted blocks are the deep ends of
// prompts, the last blocks a finished request frees).
func EvictMs(th Theta, tokens, context, weight float64) float64 {
	if tokens <= 0 || weight <= 0 {
		return 0
	}
	return weight * PrefillMs(th, tokens, context)
}
