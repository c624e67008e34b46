package tokenize

import "github.com/kvgate/kvgate/kvkey"

// The block hash is defined in the leaf package kvkey (docs/ARCHITECTURE.md, "Block hashes"),
// shared with the event index; these are thin forms of it for the request path, which carries
// chained hashes as []uint64 (router.Request.BlockHashes).

// HashSeed is the xxh3 seed of every local block hash and of every chain step (kvkey.HashSeed).
const HashSeed = kvkey.HashSeed

// HashOptions carries what besides token ids enters a block's hash (kvkey.HashOptions).
type HashOptions = kvkey.HashOptions

// LocalSeed returns the seed of local block hashes for a LoRA name ("" for none).
func LocalSeed(loraName string) uint64 { return kvkey.LocalSeed(loraName) }

// ExtraKeyHash turns a string extra key (cache salt, multimodal identifier) into its u64.
func ExtraKeyHash(s string) uint64 { return kvkey.ExtraKeyHash(s) }

// LocalBlockHash hashes one full block with its extra keys and seed; buf is scratch space.
func LocalBlockHash(tokens []uint32, extra []uint64, seed uint64, buf []byte) uint64 {
	return kvkey.LocalBlockHash(tokens, extra, seed, buf)
}

// ChainHash is one step of the sequence hash (kvkey.ChainHash) on bare uint64s.
func ChainHash(parent, local uint64) uint64 {
	return uint64(kvkey.ChainHash(kvkey.BlockHash(parent), local))
}

// LocalHashes returns the local hash of every full block of tokens; a trailing partial block is
// not hashed.
func LocalHashes(tokens []uint32, blockSize int, opt HashOptions) []uint64 {
	return kvkey.LocalHashes(tokens, blockSize, opt)
}

// SequenceHashes chains local hashes: seq[0] = local[0], seq[i] = ChainHash(seq[i-1], local[i]).
// It is kvkey.SequenceHashes with the result as bare uint64s.
func SequenceHashes(local []uint64) []uint64 {
	out := make([]uint64, len(local))
	for i, h := range local {
		if i == 0 {
			out[i] = h
			continue
		}
		out[i] = ChainHash(out[i-1], h)
	}
	return out
}

// BlockHashes returns the chained hashes of every full block of tokens as bare uint64s
// (kvkey.BlockHashes).
func BlockHashes(tokens []uint32, blockSize int, opt HashOptions) []uint64 {
	return SequenceHashes(LocalHashes(tokens, blockSize, opt))
}
