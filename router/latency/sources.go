package latency

import "math"

// Source names where a fit sample came from.
type Source int

// The sample sources, in the order of SourceNames.
const (
	// SourceTTFT: a streamed request's TTFT as the gateway measured it (Features).
	SourceTTFT Source = iota
	// SourceWorkerPrefill: a scrape interval's mean vllm:request_prefill_time_seconds against
	// the mean prefill it computed (PrefillFeatures).
	SourceWorkerPrefill
	// SourceWorkerStep: a scrape interval's mean vllm:inter_token_latency_seconds (one engine
	// step as a decode sees it) against the interval's mean decode batch (StepFeatures).
	SourceWorkerStep
	// SourceGatewayITL: a streamed response's mean time between relayed events after its first
	// token, against the decode batch the gateway accounted meanwhile (StepFeatures).
	SourceGatewayITL
	NumSources
)

// SourceNames names the sources in Source order (for debug views and metric labels).
func SourceNames() [NumSources]string {
	return [NumSources]string{"gateway_ttft", "worker_prefill", "worker_step", "gateway_itl"}
}

// String is the source's name.
func (s Source) String() string {
	if s < 0 || s >= NumSources {
		return "unknown"
	}
	return SourceNames()[s]
}

// constantFeature is the value FFrontend must have in a sample from s: the gateway's TTFT
// includes the per-request constant; the worker's prefill time (first scheduled to first
// token) and a step time do not.
func (s Source) constantFeature() float64 {
	if s == SourceTTFT {
		return 1
	}
	return 0
}

// spreads reports whether samples from s carry a request's prefill tokens in FTokens (the
// spread Ready asks for); a step sample carries the prefill share of one step instead.
func (s Source) spreads() bool { return s == SourceTTFT || s == SourceWorkerPrefill }

// PrefillFeatures are the features of the prefill of u uncached tokens after c cached ones,
// from its first scheduling to its first token, on a target running bDec decodes of kDec KV
// tokens in all: the own-prefill and decode-interference terms of PredictTTFT, without the
// frontend constant and with nothing queued ahead (vLLM's request_prefill_time_seconds starts
// when the request is first scheduled: vllm/v1/metrics/stats.py, update_from_finished_request).
func PrefillFeatures(u, c, bDec, kDec float64, p Params) [NumFeatures]float64 {
	steps := Steps(u, bDec, p.MaxBatchedTokens)
	return [NumFeatures]float64{
		FTokens:  u,
		FPairs:   Pairs(u, c),
		FSteps:   steps,
		FStepsKV: steps * kDec,
	}
}

// StepFeatures are the features of one engine step that carries tokens of prefill (with pairs
// attention pairs) besides running decodes of kDec KV tokens in all: θ_tokens·tokens +
// θ_pairs·pairs + θ_step + θ_kv·kDec. A decode's inter-token latency is such a step.
func StepFeatures(tokens, pairs, kDec float64) [NumFeatures]float64 {
	return [NumFeatures]float64{
		FTokens:  math.Max(tokens, 0),
		FPairs:   math.Max(pairs, 0),
		FSteps:   1,
		FStepsKV: math.Max(kDec, 0),
	}
}

// StepMs is the time of one engine step as StepFeatures prices it.
func StepMs(th Theta, tokens, pairs, kDec float64) float64 {
	return Dot(th, StepFeatures(tokens, pairs, kDec))
}
