package sim

import (
	"slices"

	"github.com/kvgate/kvgate/tokenize"
)

// seqState is the KV view of one request: its tokens (prompt then output), the chained hashes
// of its full blocks, and the physical blocks it holds.
type seqState struct {
	tokens    []uint32
	hashes    []uint64
	salt      string
	loraName  string
	loraID    int
	blocks    []*block
	numCached int // leading blocks already registered in the prefix cache
	buf       []byte
}

// extendHashes hashes every newly full block of s.tokens. The simulator's block ids are the chained
// hashes of docs/ARCHITECTURE.md "Block hashes" (salt and LoRA folded in), so they equal the keys
// kvgate computes; consumers must still treat them as opaque, as they must vLLM's.
func (s *seqState) extendHashes(blockSize int) {
	seed := tokenize.LocalSeed(s.loraName)
	var extra []uint64
	for len(s.hashes) < len(s.tokens)/blockSize {
		i := len(s.hashes)
		extra = extra[:0]
		if i == 0 && s.salt != "" {
			extra = append(extra, tokenize.ExtraKeyHash(s.salt))
		}
		local := tokenize.LocalBlockHash(s.tokens[i*blockSize:(i+1)*blockSize], extra, seed, s.buf)
		if i == 0 {
			s.hashes = append(s.hashes, local)
			continue
		}
		s.hashes = append(s.hashes, tokenize.ChainHash(s.hashes[i-1], local))
	}
}

// extraKeys returns block i's extra keys as vLLM lists them: the LoRA name on every block,
// then the cache salt on block 0 (vllm/v1/core/kv_cache_utils.py,
// generate_block_hash_extra_keys); nil when there are none.
func (s *seqState) extraKeys(i int) []string {
	var out []string
	if s.loraName != "" {
		out = append(out, s.loraName)
	}
	if i == 0 && s.salt != "" {
		out = append(out, s.salt)
	}
	return slices.Clip(out)
}
