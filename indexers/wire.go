package indexers

import (
	"encoding/binary"

	"github.com/kvgate/kvgate/kvkey"
)

// Event type tags as vLLM writes them (msgspec tag = class name).
const (
	TagBlockStored      = "BlockStored"
	TagBlockRemoved     = "BlockRemoved"
	TagAllBlocksCleared = "AllBlocksCleared"
)

// Media seen on the wire (vLLM's block pool and offloading connector). Anything else is dropped by
// the index.
const (
	MediumGPU       = "GPU"
	MediumCPU       = "CPU"
	MediumCPUPinned = "CPU_PINNED"
	MediumCPUTier1  = "CPU_TIER1"
	MediumDisk      = "DISK"
)

// Opt is an optional wire value: Set false means None/nil (or, in the map layout, an omitted
// optional key). It avoids a heap pointer per field on the decode hot path.
type Opt[T any] struct {
	V   T
	Set bool
}

// Some returns a set Opt holding v.
func Some[T any](v T) Opt[T] { return Opt[T]{V: v, Set: true} }

// WireHash is an engine hash as a KV event carries it: vLLM's opaque ExternalBlockHash
// (bytes | int, vllm/distributed/kv_events.py). Engine returns the kvkey.EngineHash the index
// keys it by; kvgate's own content key is kvkey.BlockHash, never one of these.
type WireHash struct {
	// U is the 64-bit value: an int's bit pattern (negative int64 bit-cast), or for a bytes
	// hash the low 64 bits of the big-endian digest, as vLLM's int mode would report it.
	U uint64
	// Neg marks an int that was negative on the wire (LMCache, pre-0.10.2 builtin hashes); the
	// encoder then writes U as a signed int64.
	Neg bool
	// Raw is the digest when the hash was bytes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
	Raw []byte
}

// Engine returns the hash's 64-bit value as the index keys it (per target).
func (h WireHash) Engine() kvkey.EngineHash { return kvkey.EngineHash(h.U) }

// IntHash returns the int form of a hash as vLLM's default int mode sends it.
func IntHash(u uint64) WireHash { return WireHash{U: u} }

// BytesHash returns a bytes-mode hash; U is derived from the digest's last 8 bytes.
func BytesHash(digest []byte) WireHash {
	return WireHash{U: bytesToU64(digest), Raw: digest}
}

func bytesToU64(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var pad [8]byte
	copy(pad[8-len(b):], b)
	return binary.BigEndian.Uint64(pad[:])
}

// EventBatch is one published batch: [ts, events, data_parallel_rank].
type EventBatch struct {
	TS     float64
	Events []Event
	// DPRank is data_parallel_rank; unset for nil or for the v0.9.0 2-element batch.
	DPRank Opt[int64]
}

// Event is one of *BlockStored, *BlockRemoved, *AllBlocksCleared.
type Event interface{ eventTag() string }

// BlockStored announces newly cached full blocks (vllm/distributed/kv_events.py, BlockStored).
// Optional fields that the current schema omits when None are Opt; ExtraKeys is written in the map
// layout only when non-nil.
type BlockStored struct {
	BlockHashes     []WireHash
	ParentBlockHash Opt[WireHash]
	TokenIDs        []uint32
	BlockSize       int64
	LoRAID          Opt[int64]
	Medium          Opt[string]
	LoRAName        Opt[string]
	// ExtraKeys is aligned with BlockHashes; a nil entry is None. Entry values are string,
	// []byte, int64, uint64, float64, bool, nil or []any (tuples such as (mm_id, offset)).
	ExtraKeys                [][]any
	GroupIdx                 Opt[int64]
	KVCacheSpecKind          Opt[string]
	KVCacheSpecSlidingWindow Opt[int64]
	Locality                 Opt[string]
	Ownership                Opt[string]
	SessionID                Opt[string]
}

// BlockRemoved announces evicted blocks.
type BlockRemoved struct {
	BlockHashes []WireHash
	Medium      Opt[string]
	GroupIdx    Opt[int64]
	Locality    Opt[string]
	Ownership   Opt[string]
}

// AllBlocksCleared announces that the engine's GPU prefix cache was reset.
type AllBlocksCleared struct{}

func (*BlockStored) eventTag() string      { return TagBlockStored }
func (*BlockRemoved) eventTag() string     { return TagBlockRemoved }
func (*AllBlocksCleared) eventTag() string { return TagAllBlocksCleared }
