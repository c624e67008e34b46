package tokenize

import "github.com/kvgate/kvgate/kvkey"

// The block hash is defined in the leaf package kvkey (docs/ARCHITECTURE.md, "Block hashes"),
// shared with the event index; these are thin forms of it for the request path, which carries
// chained hashes as []kvkey.BlockHash (router.Request.BlockHashes).

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

// ChainHash is one step of the sequence hash (kvkey.ChainHash) on bare uint64s, for the
// simulator, which publishes these as its own (engine) block hashes.
func ChainHash(parent, local uint64) uint64 {
	return uint64(kvkey.ChainHash(kvkey.BlockHash(parent), local))
}

// LocalHashes returns the local hash of every full block of tokens; a trailing partial block is
// not hashed.
func LocalHashes(tokens []uint32, blockSize int, opt HashOptions) []uint64 {
	return kvkey.LocalHashes(tokens, blockSize, opt)
}

// SequenceHashes chains local hashes: seq[0] = local[0], seq[i] = ChainHash(seq[i-1], local[i])
// (kvkey.SequenceHashes).
func SequenceHashes(local []uint64) []kvkey.BlockHash { return kvkey.SequenceHashes(local) }

// BlockHashes returns the chained hashes of every full block of tokens (kvkey.BlockHashes).
func BlockHashes(tokens []uint32, blockSize int, opt HashOptions) []kvkey.BlockHash {
	return kvkey.BlockHashes(tokens, blockSize, opt)
}
