// Package sessions owns session identity (session, parent, end of session), affinity, the
// session prefix index of lineages and per-worker frontiers, and parent-aware placement.
//
// Lock order (a lock may be taken while holding the ones listed before it, never the reverse):
//
//  1. Tracker.mu, the state lock: identity slab and LRU, forest, frontiers, reverse index,
//     pending chains. Held by Observe, End, OnRouted, the event methods (ApplyStored,
//     ApplyRemoved, ApplyCleared), the debug views and the sibling-prefix part of
//     HintsWithPrefix. Under it the tracker reads the physical index (ResidencyVersion,
//     DeepestG1: indexers shard read locks only) and takes 2.
//  2. hintTable.mu (RWMutex), the hint side: written only by publish, under 1; Hints and
//     HintsWithPrefix take its read lock alone, so routing decisions never wait on event
//     application.
//
// Counters are atomics and take no lock. Callers must not hold an indexers lock while calling
// the event methods: indexers hands its change sets over after releasing them.
package sessions
