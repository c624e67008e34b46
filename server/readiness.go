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

// AdvisoryCheck is a ReadinessCheck whose "not ready" is a warning: GET /ready lists its
// reason under "warnings" and stays 200. One misconfigured worker (its KV events silent)
// degrades routing to that worker; answering 503 for it would take every gateway replica out
// of its Service and turn one worker's fault into an outage.
type AdvisoryCheck interface {
	ReadinessCheck
	// Advisory marks the check's reasons as warnings.
	Advisory()
}
