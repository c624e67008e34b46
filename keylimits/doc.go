// Package keylimits is the state machine behind the per-key limits of auth.keys
// (requests_per_minute, tokens_per_minute, max_concurrent, burst): for each limited client key
// a requests bucket, a tokens bucket and an in-flight count and, with replicas, what the peer
// replicas report of the same key, which sets this replica's share of each bucket. It does no
// I/O and reads no clock: every call is given the time (the server passes time.Now, tests a
// fake clock); the server answers HTTP and cluster.LimitsSync carries the reports over NATS.
package keylimits
