// Package indexers owns the vLLM KV-event wire format (decode, and encode for the simulator),
// the ZMQ subscription per worker and DP rank with replay-based gap recovery, and the tiered
// (GPU, host, disk) block index that answers prefix-match queries.
package indexers
