package sim

import (
	"fmt"
	"slices"
	"strings"
)

// DefaultProfile is the name of the profile DefaultPerfModel returns.
const DefaultProfile = "mocker"

// perfProfiles returns the named timing profiles. The Llama-3.1-8B ones are fits to a sum of
// measured per-kernel latencies from NVIDIA AIConfigurator's vLLM 0.24 tables
// (https://github.com/ai-dynamo/aiconfigurator, systems/data/{h200_sxm,h100_sxm}: gemm_perf,
// context_attention_perf, generation_attention_perf for bf16 Llama-3.1-8B, TP1): one forward
// pass is the QKV, O, gate-up and down GEMMs plus FlashAttention-3 per layer and the LM head.
// Prefill fits c + b·T + a·T² within 4 % for T = 512…16384; the pair coefficient is 2a
// (a·s·(s + 2P) is the attention of s new tokens after P cached ones, as AIConfigurator's
// prefix correction prices it); decode is weight read + KV read (128 KiB per token) + a small
// per-sequence term; a mixed step pays the weight read once (SharedWeightRead). They leave out norms, activations, sampling and CPU scheduling, so they
// are a lower bound on a real step. Host-tier loads assume 64 GB/s for 128 KiB per token.
func perfProfiles() map[string]PerfModel {
	return map[string]PerfModel{
		DefaultProfile: DefaultPerfModel(),
		"llama3.1-8b-bf16-h200": {
			PrefillC: 1.11, PrefillB: 0.01718, PrefillAttn: 2 * 5.22e-7,
			DecodeC: 4.8, DecodePerKVToken: 2.9e-5, DecodePerSeq: 0.01,
			CPULoadPerToken: 0.00205, SharedWeightRead: true,
		},
		"llama3.1-8b-bf16-h100": {
			PrefillC: 1.12, PrefillB: 0.01739, PrefillAttn: 2 * 5.13e-7,
			DecodeC: 6.0, DecodePerKVToken: 4.0e-5,
			CPULoadPerToken: 0.00205, SharedWeightRead: true,
		},
	}
}

// PerfProfileNames lists the named timing profiles, sorted.
func PerfProfileNames() []string {
	profiles := perfProfiles()
	names := make([]string, 0, len(profiles))
	for n := range profiles {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// PerfProfile returns the timing profile called name (see PerfProfileNames).
func PerfProfile(name string) (PerfModel, error) {
	p, ok := perfProfiles()[name]
	if !ok {
		return PerfModel{}, fmt.Errorf("unknown timing profile %q (have %s)", name, strings.Join(PerfProfileNames(), ", "))
	}
	return p, nil
}
