package sim

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/tokenize"
)

// Options configures a simulated worker. The zero value of every field means "vLLM's default"
// (or "off" for fault injection); New fills defaults in.
type Options struct {
	// ServedModelName is the model name clients use (vLLM --served-model-name).
	ServedModelName string
	// Model is the folder with tokenizer.json (+ tokenizer_config.json), vLLM --model.
	Model string
	// Tokenizer overrides Model as the tokenizer folder (vLLM --tokenizer).
	Tokenizer string
	// Tokenize, when set, is the loaded tokenizer to use instead of loading Tokenizer/Model
	// (a fleet in one process shares one).
	Tokenize *tokenize.Tokenizer
	// LoRAModules are adapter names clients may use as "model" (vLLM --lora-modules name=path).
	LoRAModules []string
	// AllowRuntimeLoRAUpdating serves POST /v1/load_lora_adapter and /v1/unload_lora_adapter
	// (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING=True).
	AllowRuntimeLoRAUpdating bool
	// APIKeys, when any is set, are the keys every /v1/* request must carry as
	// Authorization: Bearer (vLLM --api-key, which may be given several times); other paths
	// (/health, /metrics, ...) stay open, as in vLLM.
	APIKeys []string

	// TTFT and ITL, when either is set, replace the performance model with a fixed one: a step
	// that carries prefill work takes TTFT, a decode-only step takes ITL.
	TTFT, ITL time.Duration
	// Speedup divides every simulated duration (vLLM-sim --speedup; mocker speedup_ratio).
	Speedup float64
	// Perf holds the performance-model coefficients used when TTFT and ITL are zero.
	Perf PerfModel

	// MaxNumSeqs bounds the running batch (vLLM --max-num-seqs, default 256).
	MaxNumSeqs int
	// MaxNumBatchedTokens is the token budget of one step (chunked prefill), default 8192.
	MaxNumBatchedTokens int
	// MaxModelLen bounds prompt + output tokens (default 32768).
	MaxModelLen int
	// MaxWaiting bounds the waiting queue per DP rank; beyond it requests get 503 (default 4096).
	MaxWaiting int
	// SchedulingPolicy orders each engine's waiting queue (vLLM --scheduling-policy): "fcfs"
	// (the default) by arrival, "priority" by the requests' priority field, then arrival, and
	// it then also preempts the least urgent running request instead of the newest.
	SchedulingPolicy string
	// BlockSize is tokens per KV block (vLLM --block-size, default 16).
	BlockSize int
	// NumGPUBlocks is the size of the GPU block pool including vLLM's null block (default 4096).
	NumGPUBlocks int
	// NumCPUBlocks is the size of the host-memory tier; 0 disables it.
	NumCPUBlocks int
	// CPUEventsFull makes host-tier BlockStored events carry tokens, parent and block size
	// (vLLM's self-describing offload events); otherwise they are token-less placeholders.
	CPUEventsFull bool
	// DisablePrefixCaching turns prefix caching off (vLLM --no-enable-prefix-caching).
	DisablePrefixCaching bool
	// DataParallelSize is the number of engines (DP ranks), default 1.
	DataParallelSize int
	// OutputLen gives every request without ignore_eos a deterministic natural length (its
	// EOS) in [OutputLen/2, 3*OutputLen/2), derived from the prompt; default 64, < 0 disables.
	// Without EOS the output runs to max_tokens (or what max_model_len leaves, as in vLLM).
	OutputLen int
	// HidePromptTokensDetails drops usage.prompt_tokens_details (vLLM without
	// --enable-prompt-tokens-details).
	HidePromptTokensDetails bool
	// PreserveInlineSystem keeps role "system" messages inside an Anthropic Messages body in
	// place, as vLLM does with a --chat-template that renders them; false merges them into the
	// leading system message (vLLM's choice without --chat-template).
	PreserveInlineSystem bool

	// KVEvents is vLLM's --kv-events-config.
	KVEvents KVEventsConfig
	// Encoding selects the wire variant of the events and of replay replies.
	Encoding EventEncoding

	// Faults injects failures for tests; all off by default.
	Faults Faults
	// FailBeforeFirstByte makes every completion request fail before any byte (see
	// Faults.FailStatus for how).
	FailBeforeFirstByte bool
	// DieMidStreamAfter, when > 0, aborts every stream after this many content tokens by
	// closing the connection without a terminator (a crashed worker).
	DieMidStreamAfter int

	// OnRequestDone, if set, is called (from the engine goroutine; keep it fast) for every
	// request that leaves an engine.
	OnRequestDone func(RequestRecord)

	// Logger receives the worker's logs (default slog.Default()).
	Logger *slog.Logger
}

// PerfModel is the step-time model, in ms (PerfModel.stepMillis is the whole formula).
//
// A step with prefill work costs PrefillC + PrefillB·T + PrefillAttn·Σpairs + PrefillA·T²,
// where T is the step's new (uncached) prompt tokens and, for every request's chunk of n new
// tokens at context offset c (its prefix-cache hit plus earlier chunks), pairs = n·(c + n/2):
// causal attention of the new tokens over the cached context and over each other. So a short
// suffix after a long cached prefix still pays for reading that prefix, and a step batching
// several short prompts pays the attention of each, not of one long concatenated prompt.
// PrefillA is an optional quadratic in the step's total T (the Dynamo mocker's form); the
// built-in profiles leave it at 0 and carry their quadratic in PrefillAttn instead.
//
// A step with decoding sequences adds max(DecodeMin, DecodeA·u² + DecodeB·u + DecodeC) +
// DecodePerKVToken·ΣK + DecodePerSeq·B, where u is the fraction of the KV pool in use, ΣK the
// summed context length of the B decoding sequences (decode is memory-bound: it reads the
// weights once and every sequence's KV). Blocks loaded back from the host tier cost
// CPULoadPerToken per token instead of prefill.
type PerfModel struct {
	PrefillA, PrefillB, PrefillC float64
	// PrefillAttn is the cost of one (new token, context token) attention pair.
	PrefillAttn               float64
	DecodeA, DecodeB, DecodeC float64
	DecodeMin                 float64
	// DecodePerKVToken is the cost of reading one token of KV in a decode step.
	DecodePerKVToken float64
	DecodePerSeq     float64
	CPULoadPerToken  float64
	// SharedWeightRead makes a step with prefill and decode work pay the decode floor (the
	// weight read) only beyond the prefill GEMMs, which read the same weights:
	// floor becomes max(0, floor − PrefillB·T).
	SharedWeightRead bool
}

// DefaultPerfModel returns the "mocker" profile: the Dynamo mocker's polynomials
// (https://github.com/ai-dynamo/dynamo, lib/mocker, docs/mocker/mocker.md) with their prefill
// quadratic 4.209989e-7·T² expressed as attention pairs (a lone uncached prompt of T tokens
// has T²/2 pairs, so it costs exactly the mocker's polynomial), a small per-sequence decode
// term and a host-to-GPU load cost of 64 GB/s for a 0.6B-class model. Its decode cost follows
// KV usage, not the decoding sequences' context length.
func DefaultPerfModel() PerfModel {
	return PerfModel{
		PrefillB: 1.518344e-02, PrefillC: 16.50142, PrefillAttn: 2 * 4.209989e-07,
		DecodeA: -25.74, DecodeB: 54.01, DecodeC: 5.74, DecodeMin: 1,
		DecodePerSeq:    0.01,
		CPULoadPerToken: 0.0018,
	}
}

// KVEventsConfig mirrors vLLM's KVEventsConfig (vllm/config/kv_events.py); JSON keys are vLLM's.
type KVEventsConfig struct {
	EnableKVCacheEvents bool   `json:"enable_kv_cache_events"`
	Publisher           string `json:"publisher,omitempty"`
	Endpoint            string `json:"endpoint,omitempty"`
	ReplayEndpoint      string `json:"replay_endpoint,omitempty"`
	BufferSteps         int    `json:"buffer_steps,omitempty"`
	HWM                 int    `json:"hwm,omitempty"`
	MaxQueueSize        int    `json:"max_queue_size,omitempty"`
	Topic               string `json:"topic"`
}

// EventEncoding selects which vLLM version's wire format the publisher speaks.
type EventEncoding struct {
	// Layout is the event schema: map (vLLM >= 0.24, default), array (v0.22/0.23) or v0.9.0.
	Layout indexers.Layout
	// BytesHashes writes 32-byte bin hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
	BytesHashes bool
	// Replay is the replay reply shape: with topic frame (vLLM >= 0.26, default) or without.
	Replay indexers.ReplayFormat
	// OpaqueHashes puts per-engine opaque block ids on the wire instead of kvgate's content
	// keys, like vLLM (whose ids differ per process and DP rank unless PYTHONHASHSEED is set):
	// consumers must key their index by token_ids and map ids for removals and parents.
	OpaqueHashes bool
	// HashSeed keys the opaque ids (vLLM's PYTHONHASHSEED); ranks derive their own from it.
	HashSeed uint64
}

// Faults are failure injections for tests.
type Faults struct {
	// DropEventRate drops this fraction of event messages after they got a sequence number
	// (what a PUB socket at its HWM does); they stay in the replay buffer.
	DropEventRate float64
	// SkipSeqEvery, when > 0, skips one sequence number after every N published messages.
	SkipSeqEvery int
	// RestartPublisherEvery, when > 0, restarts the publisher (seq back to 0, replay buffer and
	// prefix cache cleared, as an engine restart does) at this simulated interval.
	RestartPublisherEvery time.Duration
	// StallEvery and StallFor pause the engine for StallFor every StallEvery (simulated time).
	StallEvery, StallFor time.Duration
	// StallHeadersRate is the fraction of completion requests that wait StallHeadersFor
	// (simulated time) before anything happens, so no response header is sent meanwhile: a
	// worker hung before answering. The request is then served normally.
	StallHeadersRate float64
	StallHeadersFor  time.Duration
	// FailRate fails this fraction of completion requests before the first byte.
	FailRate float64
	// FailStatus is how such a failure looks: 0 closes the connection without a response (a
	// crashed worker), otherwise an OpenAI error body with this HTTP status.
	FailStatus int
	// Seed seeds the fault dice (0 = 1).
	Seed int64
}

// withDefaults returns o with vLLM's defaults filled in and validates it.
func (o Options) withDefaults() (Options, error) {
	if o.ServedModelName == "" {
		switch {
		case o.Model != "":
			o.ServedModelName = o.Model
		default:
			o.ServedModelName = "sim-model"
		}
	}
	if o.Tokenizer == "" {
		o.Tokenizer = o.Model
	}
	if o.Speedup == 0 {
		o.Speedup = 1
	}
	if o.Perf == (PerfModel{}) {
		o.Perf = DefaultPerfModel()
	}
	setDefault(&o.MaxNumSeqs, 256)
	setDefault(&o.MaxNumBatchedTokens, 8192)
	setDefault(&o.MaxWaiting, 4096)
	setDefault(&o.BlockSize, 16)
	if o.SchedulingPolicy == "" {
		o.SchedulingPolicy = PolicyFCFS
	}
	setDefault(&o.NumGPUBlocks, 4096)
	capacity := (o.NumGPUBlocks - 1) * o.BlockSize
	if o.MaxModelLen == 0 {
		// vLLM refuses to start when one max-length sequence does not fit in the KV cache; the
		// simulator's default shrinks to the pool instead so small test pools just work.
		o.MaxModelLen = min(32768, capacity)
	}
	setDefault(&o.DataParallelSize, 1)
	setDefault(&o.OutputLen, 64)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	kv := &o.KVEvents
	if kv.Publisher == "" {
		kv.Publisher = "null"
		if kv.EnableKVCacheEvents {
			kv.Publisher = "zmq"
		}
	}
	if kv.Endpoint == "" {
		kv.Endpoint = "tcp://*:5557"
	}
	setDefault(&kv.BufferSteps, 10000)
	setDefault(&kv.HWM, 100000)
	setDefault(&kv.MaxQueueSize, 100000)

	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(o.Speedup > 0, "speedup must be > 0, got %v", o.Speedup)
	check(o.MaxNumSeqs > 0, "max-num-seqs must be > 0, got %d", o.MaxNumSeqs)
	check(o.MaxNumBatchedTokens > 0, "max-num-batched-tokens must be > 0, got %d", o.MaxNumBatchedTokens)
	check(o.MaxModelLen > 0, "max-model-len must be > 0, got %d", o.MaxModelLen)
	check(o.BlockSize > 0, "block-size must be > 0, got %d", o.BlockSize)
	if err := validPolicy(o.SchedulingPolicy); err != nil {
		errs = append(errs, err)
	}
	check(o.NumGPUBlocks >= 2, "num-gpu-blocks must be >= 2, got %d", o.NumGPUBlocks)
	check(o.NumCPUBlocks >= 0, "num-cpu-blocks must be >= 0, got %d", o.NumCPUBlocks)
	check(o.DataParallelSize >= 1, "data-parallel-size must be >= 1, got %d", o.DataParallelSize)
	check(o.DieMidStreamAfter >= 0, "die-mid-stream-after must be >= 0, got %d", o.DieMidStreamAfter)
	check(kv.Publisher == "null" || kv.Publisher == "zmq", "kv-events-config.publisher must be \"zmq\" or \"null\", got %q", kv.Publisher)
	check(kv.BufferSteps > 0, "kv-events-config.buffer_steps must be > 0, got %d", kv.BufferSteps)
	check(o.Faults.DropEventRate >= 0 && o.Faults.DropEventRate <= 1, "fault drop rate must be in [0,1], got %v", o.Faults.DropEventRate)
	check(o.Faults.FailRate >= 0 && o.Faults.FailRate <= 1, "fault fail rate must be in [0,1], got %v", o.Faults.FailRate)
	check(o.Faults.StallHeadersRate >= 0 && o.Faults.StallHeadersRate <= 1, "fault stall-headers rate must be in [0,1], got %v", o.Faults.StallHeadersRate)
	check(o.Faults.StallHeadersFor >= 0, "fault stall-headers duration must not be negative, got %v", o.Faults.StallHeadersFor)
	if err := errors.Join(errs...); err != nil {
		return o, fmt.Errorf("sim options: %w", err)
	}
	return o, nil
}

// eventsEnabled reports whether a ZMQ publisher runs (vLLM needs prefix caching for events).
func (o Options) eventsEnabled() bool {
	return o.KVEvents.EnableKVCacheEvents && o.KVEvents.Publisher == "zmq" && !o.DisablePrefixCaching
}

func setDefault(v *int, d int) {
	if *v == 0 {
		*v = d
	}
}
