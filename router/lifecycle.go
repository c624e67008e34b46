package router

// Tracker is implemented by policies that account each routed request themselves (beyond the
// gateway's in-flight count). The server calls Begin right after Pick with the decision; the
// returned lifecycle hears FirstToken when the first response byte reaches the gateway and
// Done when the request ends for any reason (finished, failed, cancelled, retried elsewhere).
type Tracker interface {
	Begin(d Decision, req *Request) Lifecycle
}

// Lifecycle is one routed request's load record; both methods must be idempotent.
type Lifecycle interface {
	FirstToken()
	Done()
}
