// Package indexers owns the vLLM KV-event wire format (decode, and encode for the simulator),
// the ZMQ subscription per worker and DP rank with replay-based gap recovery, and the tiered
// (GPU, host, disk) block index that answers prefix-match queries.
//
// The Index is a pure data structure: it calls nobody. Index.ApplyTo, ResetTo and
// RemoveTargetTo record what they changed in a caller-owned ChangeSet while holding the
// target's lock; the Subscriber (or the Subscribers, for a forgotten target) hands that set to its
// ChangeConsumer only after the call returned, on the goroutine that applied it.
//
// Lock order (a lock may be taken while holding the ones listed before it, never the reverse):
//
//  1. Subscribers.mu (subscriptions registry): held only for map updates; nothing index-side is
//     taken under it.
//  2. Index.regMu (target registry): held while registering or removing a target; takes
//     targetState.mu (RemoveTarget's reset) and the table shard locks.
//  3. targetState.mu (one per worker+rank): held by the single writer of that target for one
//     batch; takes the table shard locks and routedQueue's lock, nothing outside the package.
//  4. rwTable shard locks and routedQueue.mu: leaves, held for one map or queue update.
//
// Readers (Match, IsResidentG1, DeepestG1, ResidencyVersion) take only shard read locks. A
// ChangeConsumer runs with none of these held, so it may take its own locks (the sessions
// package's) and call any Index method, reads and writes alike.
package indexers
