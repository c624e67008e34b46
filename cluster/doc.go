// Package cluster lets several kvgate replicas act as one over NATS: it runs the optional
// embedded NATS server (nats-server as a library), holds the replica's one NATS connection and
// its health (connected or degraded), and names the subjects and bucket the replicas share.
// What travels over it (session bindings, in-flight load, approximate predictions, index
// snapshots for a cold start) is built on Node; with no cluster section none of it runs.
//
// Every NATS call on a request path has a deadline and a local fallback: NATS being down makes
// a replica route on its own state (degraded, counted), never fail a client.
package cluster
