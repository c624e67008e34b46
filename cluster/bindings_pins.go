package cluster

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvgate/kvgate/kvkey"
)

// SharePin implements router.SharedPins: the response id is pinned to t fleet-wide before it
// returns, within cluster.kv_deadline (the client learns the id only afterwards, so its
// follow-up finds the pin on any replica). A failure is counted and returned.
func (b *Bindings) SharePin(ctx context.Context, responseID string, t kvkey.Target) error {
	kv := b.kv.Load()
	if kv == nil || !b.node.Connected() {
		b.opsTotal.WithLabelValues("pin", "error").Inc()
		b.node.CountError("pins", errNotReady)
		return errNotReady
	}
	ctx, cancel := context.WithTimeout(ctx, b.deadline)
	defer cancel()
	if _, err := kv.pins.Put(ctx, key("p", responseID), b.encode(b.node.Bucket("pins"), key("p", responseID), t, "")); err != nil {
		b.opsTotal.WithLabelValues("pin", "error").Inc()
		b.node.CountError("pins", err)
		return fmt.Errorf("share pin: %w", err)
	}
	b.opsTotal.WithLabelValues("pin", "ok").Inc()
	return nil
}

// TouchPin implements router.SharedPins: a pin still in use is rewritten behind, restarting
// the bucket's TTL.
func (b *Bindings) TouchPin(responseID string, t kvkey.Target) {
	b.enqueue(bindOp{kind: opPin, key: key("p", responseID), target: t})
}

// LookupPin implements router.SharedPins: the fleet's pin of responseID, read from the bucket
// (a direct get) within cluster.kv_deadline. ok is false with a nil error when no replica
// pinned it.
func (b *Bindings) LookupPin(ctx context.Context, responseID string) (kvkey.Target, bool, error) {
	kv := b.kv.Load()
	if kv == nil || !b.node.Connected() {
		b.opsTotal.WithLabelValues("pin_get", "error").Inc()
		b.node.CountError("pins", errNotReady)
		return kvkey.Target{}, false, errNotReady
	}
	ctx, cancel := context.WithTimeout(ctx, b.deadline)
	defer cancel()
	e, err := kv.pins.Get(ctx, key("p", responseID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		b.opsTotal.WithLabelValues("pin_get", "miss").Inc()
		return kvkey.Target{}, false, nil
	}
	if err != nil {
		b.opsTotal.WithLabelValues("pin_get", "error").Inc()
		b.node.CountError("pins", err)
		return kvkey.Target{}, false, fmt.Errorf("shared pin: %w", err)
	}
	v, ok := b.decode(e, "pin")
	if !ok {
		b.opsTotal.WithLabelValues("pin_get", "error").Inc()
		return kvkey.Target{}, false, fmt.Errorf("shared pin: bad or unsigned value %q", e.Value())
	}
	b.opsTotal.WithLabelValues("pin_get", "ok").Inc()
	return kvkey.Target{Worker: v.Worker, DPRank: v.Rank}, true, nil
}
