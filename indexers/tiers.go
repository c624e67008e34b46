package indexers

import (
	"github.com/kvgate/kvgate/kvkey"
	"github.com/zeebo/xxh3"
)

// Tier is where a block is resident on a worker.
type Tier uint8

const (
	// G1 is GPU memory (medium "GPU", or no medium: pre-0.10 events and non-vLLM producers).
	G1 Tier = iota
	// G2 is host memory ("CPU", "CPU_PINNED", "CPU_TIER1").
	G2
	// G3 is local disk ("DISK").
	G3
	numTiers = 3
)

// String names the tier as in metrics labels.
func (t Tier) String() string {
	switch t {
	case G1:
		return "G1"
	case G2:
		return "G2"
	case G3:
		return "G3"
	}
	return "unknown"
}

// TierOf maps a wire medium to a tier; ok is false for any other medium, which the index drops
// and counts (fail closed; docs/ARCHITECTURE.md, "The tiered index").
func TierOf(medium Opt[string]) (Tier, bool) {
	if !medium.Set {
		return G1, true
	}
	switch medium.V {
	case MediumGPU:
		return G1, true
	case MediumCPU, MediumCPUPinned, MediumCPUTier1:
		return G2, true
	case MediumDisk:
		return G3, true
	}
	return 0, false
}

// mainAttentionKind reports whether a BlockStored's kv_cache_spec_kind describes a reusable prefix
// (vllm/v1/core/kv_cache_manager.py stamps the group's kind): full or MLA attention, or no kind
// given.
func mainAttentionKind(k Opt[string]) bool {
	if !k.Set {
		return true
	}
	switch k.V {
	case "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

// foldExtraKeys turns one block's wire extra keys into the u64 extra keys of docs/ARCHITECTURE.md,
// "Block hashes": the LoRA name (first item equal to lora_name) is skipped because it already moved
// the seed; strings (cache salt on block 0, older bare multimodal ids) and the identifier of
// (identifier, offset) tuples enter as kvkey.ExtraKeyHash; prompt-embeds bytes enter as xxh3 of
// the digest, so such blocks never match text-only requests; ints enter as-is.
func foldExtraKeys(keys []any, loraName string, out []uint64) []uint64 {
	skippedLoRA := false
	for _, k := range keys {
		switch x := k.(type) {
		case string:
			if !skippedLoRA && loraName != "" && x == loraName {
				skippedLoRA = true
				continue
			}
			out = append(out, kvkey.ExtraKeyHash(x))
		case []any:
			if len(x) > 0 {
				if id, ok := x[0].(string); ok {
					out = append(out, kvkey.ExtraKeyHash(id))
				}
			}
		case []byte:
			out = append(out, xxh3.Hash(x))
		case uint64:
			out = append(out, x)
		case int64:
			out = append(out, uint64(x))
		}
	}
	return out
}
