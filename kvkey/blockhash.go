package kvkey

import (
	"encoding/binary"
	"slices"

	"github.com/zeebo/xxh3"
)

// BlockHash is kvgate's content key of a block: the chained xxh3 hash of the block and every
// block before it (SequenceHashes), so it names the whole prefix 0..i. The request side and the
// event side compute it the same way, bit for bit; it is what the event index is keyed by.
type BlockHash uint64

// EngineHash is vLLM's own block hash of one engine (worker + DP rank) as decoded from its KV
// events (the low 64 bits of ExternalBlockHash in vllm/distributed/kv_events.py). It is opaque:
// its algorithm, PYTHONHASHSEED and NONE_HASH vary per engine and change on restart, so it is only
// meaningful within one target and never compared with a BlockHash.
type EngineHash uint64

// HashSeed is the xxh3 seed of every local block hash and of every chain step (docs/ARCHITECTURE.md,
// "Block hashes").
const HashSeed uint64 = 1337

// HashOptions carries what besides token ids enters a block's hash.
type HashOptions struct {
	// LoRAName, when set, moves the local-hash seed (see LocalSeed).
	LoRAName string
	// CacheSalt, when set, is an extra key of block 0 only.
	CacheSalt string
	// ExtraKeys holds further extra keys per block index (e.g. multimodal ids), already as u64.
	ExtraKeys map[int][]uint64
}

// LocalSeed returns the seed of local block hashes for a LoRA name ("" for none).
func LocalSeed(loraName string) uint64 {
	if loraName == "" {
		return HashSeed
	}
	return HashSeed + xxh3.HashSeed([]byte(loraName), 0) // wrapping add
}

// ExtraKeyHash turns a string extra key (cache salt, multimodal identifier) into its u64:
// xxh3_64 of all of its bytes. vLLM puts the salt string itself into block 0's extra keys
// (vllm/v1/core/kv_cache_utils.py, generate_block_hash_extra_keys), so every byte of it must
// count: two different salts (or identifiers) must never fold to the same key, whatever their
// form (a 64-hex digest that shared its first 16 digits with another used to).
func ExtraKeyHash(s string) uint64 {
	return xxh3.Hash([]byte(s))
}

// LocalBlockHash hashes one full block: its tokens as u32 little-endian followed by its extra
// keys sorted ascending as u64 little-endian. buf is scratch space and may be nil.
func LocalBlockHash(tokens []uint32, extra []uint64, seed uint64, buf []byte) uint64 {
	buf = buf[:0]
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, t)
	}
	if len(extra) > 0 {
		keys := slices.Clone(extra)
		slices.Sort(keys)
		for _, k := range keys {
			buf = binary.LittleEndian.AppendUint64(buf, k)
		}
	}
	return xxh3.HashSeed(buf, seed)
}

// ChainHash is one step of the sequence hash: xxh3(le64(parent) ‖ le64(local), 1337).
func ChainHash(parent BlockHash, local uint64) BlockHash {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], uint64(parent))
	binary.LittleEndian.PutUint64(b[8:], local)
	return BlockHash(xxh3.HashSeed(b[:], HashSeed))
}

// LocalHashes returns the local hash of every full block of tokens; a trailing partial block is
// not hashed.
func LocalHashes(tokens []uint32, blockSize int, opt HashOptions) []uint64 {
	if blockSize <= 0 {
		return nil
	}
	n := len(tokens) / blockSize
	out := make([]uint64, n)
	seed := LocalSeed(opt.LoRAName)
	buf := make([]byte, 0, blockSize*4+64)
	var extra []uint64
	for i := range n {
		extra = extra[:0]
		if i == 0 && opt.CacheSalt != "" {
			extra = append(extra, ExtraKeyHash(opt.CacheSalt))
		}
		extra = append(extra, opt.ExtraKeys[i]...)
		out[i] = LocalBlockHash(tokens[i*blockSize:(i+1)*blockSize], extra, seed, buf)
	}
	return out
}

// SequenceHashes chains local hashes: seq[0] = local[0], seq[i] = ChainHash(seq[i-1], local[i]).
func SequenceHashes(local []uint64) []BlockHash {
	out := make([]BlockHash, len(local))
	for i, h := range local {
		if i == 0 {
			out[i] = BlockHash(h)
			continue
		}
		out[i] = ChainHash(out[i-1], h)
	}
	return out
}

// BlockHashes returns the chained sequence hashes of every full block of tokens: the keys that
// request-side matching and event-side indexing share (docs/ARCHITECTURE.md, "Block hashes").
func BlockHashes(tokens []uint32, blockSize int, opt HashOptions) []BlockHash {
	return SequenceHashes(LocalHashes(tokens, blockSize, opt))
}
