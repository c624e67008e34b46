package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"

	"github.com/zeebo/xxh3"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/sim"
)

// serveConfig is what the serve command needs besides sim.Options.
type serveConfig struct {
	host     string
	port     int
	logLevel string
}

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, strings.Fields(v)...); return nil }

// newServeFlags registers vLLM's flag names (where vLLM has them) and the simulator's own
// (--sim-*, --fault-*) on fs, writing into o and c.
func newServeFlags(fs *flag.FlagSet, o *sim.Options, c *serveConfig) func() error {
	fs.StringVar(&c.host, "host", "", "host name to listen on (default: all interfaces, as vLLM)")
	fs.IntVar(&c.port, "port", 8000, "port to listen on")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug | info | warn | error")
	fs.StringVar(&o.Model, "model", "", "model folder holding tokenizer.json (also the first positional argument)")
	fs.StringVar(&o.Tokenizer, "tokenizer", "", "tokenizer folder (default: --model)")
	fs.StringVar(&o.ServedModelName, "served-model-name", "", "model name clients use (default: --model, else sim-model)")
	var loras, apiKeys stringList
	fs.Var(&apiKeys, "api-key", "require Authorization: Bearer KEY on /v1/* (repeatable; default: env VLLM_API_KEY), as vllm serve --api-key")
	fs.Var(&loras, "lora-modules", "LoRA adapters name=path (repeatable); clients select one by model name")
	fs.IntVar(&o.MaxNumSeqs, "max-num-seqs", 256, "maximum sequences per step (running batch)")
	fs.StringVar(&o.SchedulingPolicy, "scheduling-policy", sim.PolicyFCFS, "waiting-queue order, as vLLM: fcfs | priority (by each request's priority field, smaller first, then arrival)")
	fs.IntVar(&o.MaxNumBatchedTokens, "max-num-batched-tokens", 8192, "token budget per step (chunked prefill)")
	fs.IntVar(&o.MaxModelLen, "max-model-len", 0, "maximum prompt + output tokens (default: min(32768, KV cache capacity))")
	fs.IntVar(&o.BlockSize, "block-size", 16, "tokens per KV block")
	fs.IntVar(&o.NumGPUBlocks, "num-gpu-blocks", 4096, "GPU KV blocks (including vLLM's null block)")
	fs.IntVar(&o.NumGPUBlocks, "num-gpu-blocks-override", 4096, "alias of --num-gpu-blocks (vLLM's name)")
	fs.IntVar(&o.NumCPUBlocks, "num-cpu-blocks", 0, "host-memory (CPU offload) tier blocks; 0 = off")
	cpuEvents := fs.String("cpu-events", "placeholder", "host-tier BlockStored events: placeholder (token-less, vLLM's offload connector) | full")
	enablePC := fs.Bool("enable-prefix-caching", true, "prefix caching")
	noPC := fs.Bool("no-enable-prefix-caching", false, "disable prefix caching")
	fs.IntVar(&o.DataParallelSize, "data-parallel-size", 1, "DP ranks (engines); rank r publishes on port+r")
	fs.IntVar(&o.DataParallelSize, "dp", 1, "alias of --data-parallel-size")
	kvCfg := fs.String("kv-events-config", "", `vLLM KVEventsConfig JSON, e.g. '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv-events"}'`)
	layout := fs.String("kv-events-layout", "map", "event encoding: map (vLLM >= 0.24) | array (v0.22/0.23) | v0.9.0")
	hashes := fs.String("kv-events-hashes", "", "block hashes on the wire: int | bytes (default: env VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, else int)")
	opaque := fs.Bool("kv-events-opaque-hashes", true, "publish per-engine opaque block ids like vLLM (keyed by PYTHONHASHSEED when set, else random per process); false publishes kvgate's content keys")
	replay := fs.String("kv-events-replay-format", "topic", "replay replies: topic (vLLM >= 0.26) | no-topic (older)")
	promptDetails := fs.Bool("enable-prompt-tokens-details", true, "report usage.prompt_tokens_details.cached_tokens")
	preserveInline := fs.Bool("anthropic-preserve-inline-system", false, "keep system messages inside an Anthropic Messages body in place (vLLM with a --chat-template that renders them) instead of merging them into the leading system message")
	fs.IntVar(&o.OutputLen, "output-len", 64, "mean natural output length (EOS) without ignore_eos; -1 = run to max_tokens")

	fs.Float64Var(&o.Speedup, "speedup", 1, "divide every simulated duration by this")
	fs.DurationVar(&o.TTFT, "ttft", 0, "fixed time of a prefill step (replaces the perf model with --itl)")
	fs.DurationVar(&o.ITL, "itl", 0, "fixed time of a decode step (replaces the perf model with --ttft)")
	profile := fs.String("profile", sim.DefaultProfile, "timing profile: "+strings.Join(sim.PerfProfileNames(), " | ")+"; --sim-* coefficient flags override single terms")
	var coef sim.PerfModel // explicitly set --sim-* flags land here and override the profile
	coefFlags := []struct {
		name, usage string
		field       func(*sim.PerfModel) *float64
	}{
		{"sim-prefill-c", "prefill fixed cost per step (ms); prefill ms = c + b*T + attn*pairs + a*T^2, T = uncached tokens in the step", func(p *sim.PerfModel) *float64 { return &p.PrefillC }},
		{"sim-prefill-b", "prefill cost per uncached token (ms)", func(p *sim.PerfModel) *float64 { return &p.PrefillB }},
		{"sim-prefill-attn", "prefill cost per attention pair (ms); a chunk of n new tokens at context offset c has n*(c + n/2) pairs", func(p *sim.PerfModel) *float64 { return &p.PrefillAttn }},
		{"sim-prefill-a", "prefill quadratic in the step's T (ms/token^2)", func(p *sim.PerfModel) *float64 { return &p.PrefillA }},
		{"sim-decode-a", "decode ms = max(min, a*u^2 + b*u + c) + per_kv_token*sum(context) + per_seq*batch, u = KV usage", func(p *sim.PerfModel) *float64 { return &p.DecodeA }},
		{"sim-decode-b", "decode linear coefficient in u", func(p *sim.PerfModel) *float64 { return &p.DecodeB }},
		{"sim-decode-c", "decode constant (ms)", func(p *sim.PerfModel) *float64 { return &p.DecodeC }},
		{"sim-decode-min", "decode floor (ms)", func(p *sim.PerfModel) *float64 { return &p.DecodeMin }},
		{"sim-decode-per-kv-token", "decode cost per token of context of every decoding sequence (ms)", func(p *sim.PerfModel) *float64 { return &p.DecodePerKVToken }},
		{"sim-decode-per-seq", "decode cost per running sequence (ms)", func(p *sim.PerfModel) *float64 { return &p.DecodePerSeq }},
		{"sim-cpu-load-per-token", "host-tier load cost (ms/token)", func(p *sim.PerfModel) *float64 { return &p.CPULoadPerToken }},
	}
	def := sim.DefaultPerfModel()
	for _, f := range coefFlags {
		fs.Float64Var(f.field(&coef), f.name, *f.field(&def), f.usage+" (default: from --profile)")
	}
	sharedWeights := fs.Bool("sim-shared-weight-read", def.SharedWeightRead, "a mixed prefill+decode step pays the decode floor only beyond the prefill GEMMs (default: from --profile)")

	fs.BoolVar(&o.FailBeforeFirstByte, "fail-before-first-byte", false, "fault: fail every completion request before the first byte")
	fs.IntVar(&o.DieMidStreamAfter, "die-mid-stream-after", 0, "fault: cut every stream after N tokens (0 = never)")
	fs.Float64Var(&o.Faults.FailRate, "fault-fail-rate", 0, "fault: fraction of requests failed before the first byte")
	fs.Float64Var(&o.Faults.StallHeadersRate, "fault-stall-headers-rate", 0, "fault: fraction of requests that wait --fault-stall-headers-for before any response header")
	fs.DurationVar(&o.Faults.StallHeadersFor, "fault-stall-headers-for", 0, "fault: how long such a request stalls before its headers (simulated time)")
	fs.IntVar(&o.Faults.FailStatus, "fault-fail-status", 0, "fault: HTTP status of injected failures (0 = close the connection)")
	fs.Float64Var(&o.Faults.DropEventRate, "fault-drop-events", 0, "fault: fraction of event messages not sent (still replayable)")
	fs.IntVar(&o.Faults.SkipSeqEvery, "fault-skip-seq-every", 0, "fault: skip a sequence number after every N messages")
	fs.DurationVar(&o.Faults.RestartPublisherEvery, "fault-restart-every", 0, "fault: restart the engine and publisher (seq 0, cache lost) at this interval")
	fs.DurationVar(&o.Faults.StallEvery, "fault-stall-every", 0, "fault: stall the engine at this interval")
	fs.DurationVar(&o.Faults.StallFor, "fault-stall-for", 0, "fault: length of a stall")
	fs.Int64Var(&o.Faults.Seed, "fault-seed", 1, "seed of the fault dice")

	return func() error {
		var errs []error
		perf, err := sim.PerfProfile(*profile)
		if err != nil {
			errs = append(errs, fmt.Errorf("--profile: %w", err))
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for _, f := range coefFlags {
			if set[f.name] {
				*f.field(&perf) = *f.field(&coef)
			}
		}
		if set["sim-shared-weight-read"] {
			perf.SharedWeightRead = *sharedWeights
		}
		o.Perf = perf
		o.APIKeys = apiKeys
		if len(o.APIKeys) == 0 {
			if k := os.Getenv("VLLM_API_KEY"); k != "" {
				o.APIKeys = []string{k}
			}
		}
		// vLLM serves /v1/load_lora_adapter and /v1/unload_lora_adapter only with this
		// variable "1" or "true" (vllm/envs.py).
		switch strings.ToLower(strings.TrimSpace(os.Getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING"))) {
		case "1", "true":
			o.AllowRuntimeLoRAUpdating = true
		}
		o.LoRAModules = nil
		for _, l := range loras {
			name, _, _ := strings.Cut(l, "=")
			o.LoRAModules = append(o.LoRAModules, name)
		}
		o.DisablePrefixCaching = *noPC || !*enablePC
		o.HidePromptTokensDetails = !*promptDetails
		o.PreserveInlineSystem = *preserveInline
		switch *cpuEvents {
		case "placeholder":
		case "full":
			o.CPUEventsFull = true
		default:
			errs = append(errs, fmt.Errorf("--cpu-events: want placeholder or full, got %q", *cpuEvents))
		}
		if *kvCfg != "" {
			dec := json.NewDecoder(strings.NewReader(*kvCfg))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&o.KVEvents); err != nil {
				errs = append(errs, fmt.Errorf("--kv-events-config: %w", err))
			}
		}
		l, err := indexers.ParseLayout(*layout)
		if err != nil {
			errs = append(errs, fmt.Errorf("--kv-events-layout: %w", err))
		}
		o.Encoding.Layout = l
		h := *hashes
		if h == "" {
			h = "int"
			if os.Getenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES") == "0" {
				h = "bytes"
			}
		}
		switch h {
		case "int":
		case "bytes":
			o.Encoding.BytesHashes = true
		default:
			errs = append(errs, fmt.Errorf("--kv-events-hashes: want int or bytes, got %q", h))
		}
		o.Encoding.OpaqueHashes = *opaque
		if seed, ok := os.LookupEnv("PYTHONHASHSEED"); ok {
			o.Encoding.HashSeed = xxh3.HashString(seed) // same seed, same ids, as in vLLM
		} else {
			o.Encoding.HashSeed = rand.Uint64() // vLLM: random NONE_HASH per process
		}
		switch *replay {
		case "topic":
			o.Encoding.Replay = indexers.ReplayWithTopic
		case "no-topic":
			o.Encoding.Replay = indexers.ReplayNoTopic
		default:
			errs = append(errs, fmt.Errorf("--kv-events-replay-format: want topic or no-topic, got %q", *replay))
		}
		if o.Faults.StallEvery < 0 || o.Faults.RestartPublisherEvery < 0 {
			errs = append(errs, errors.New("fault intervals must be >= 0"))
		}
		if c.port < 0 || c.port > 65535 {
			errs = append(errs, fmt.Errorf("--port: %d out of range", c.port))
		}
		return errors.Join(errs...)
	}
}
