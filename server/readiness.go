package server

// ReadinessCheck is a component that can hold the gateway out of service: a discovery source
// that has not synced yet, a model pool with no routable worker, a KV-event subscription that
// hears nothing. GET /ready asks every check and answers 503 with the reasons of those not
// ready. Checks must be quick and safe for concurrent use. GET /ready is unauthenticated (the
// kubelet sends no key): a reason must not name a worker's address or anything a client could
// learn other clients' state from.
type ReadinessCheck interface {
	// Readiness names the component and says whether it is ready; reason explains why not
	// (empty when ready).
	Readiness() (name string, ready bool, reason string)
}
