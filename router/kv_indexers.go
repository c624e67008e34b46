package router

import "github.com/kvgate/kvgate/indexers"

// SubscriberHealth reports a target's KV event stream healthy while its subscription is live or
// replaying and its index is exact, not approximate after lost batches
// (indexers.Subscribers.EventsHealthy: atomic state per target, no lock, no polling). A target with
// no subscription is not healthy (scored in approximate mode).
func SubscriberHealth(m *indexers.Subscribers) EventHealth {
	return EventHealthFunc(m.EventsHealthy)
}
