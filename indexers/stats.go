package indexers

import "sync/atomic"

// Event kinds as metric label values.
const (
	kindStored = iota
	kindRemoved
	kindCleared
	numKinds
)

var kindNames = [numKinds]string{"stored", "removed", "cleared"}

// Reasons a block (or event) is not applied, as metric label values.
const (
	dropMedium         = iota // medium outside GPU/CPU*/DISK (fail closed)
	dropRemote                // locality REMOTE
	dropKind                  // non-prefix KV-cache group (sliding window, mamba, ...)
	dropInvalid               // self-referencing chain, token count ≠ blocks × block_size
	dropBlockSize             // block_size differs from the index's
	dropParentNotFound        // parent hash never seen on this target, nor recoverable from routed prompts
	dropUnresolved            // token-less lower-tier store of an unknown hash
	dropNotFound              // removal of a hash that is not resident in that tier
	dropConflict              // a hash re-stored with different content
	dropCapacity              // MaxBlocksPerTarget reached
	numDrops
)

var dropNames = [numDrops]string{"unknown_medium", "remote", "non_prefix_group", "invalid",
	"block_size_mismatch", "parent_not_found", "unresolved_hash", "block_not_found",
	"hash_conflict", "capacity"}

// targetStats are per-target counters, updated by the applier and read by metrics.
type targetStats struct {
	events [numKinds][numTiers]atomic.Int64 // events applied
	blocks [numKinds][numTiers]atomic.Int64 // blocks in applied events
	drops  [numDrops]atomic.Int64           // blocks dropped by reason
	resets atomic.Int64
	// Stores whose parent was unknown: placed under a recently routed prompt (recovered) or
	// dropped as parent_not_found (unrecovered).
	recovered, unrecovered atomic.Int64
}

func (s *targetStats) drop(reason, n int) { s.drops[reason].Add(int64(n)) }
