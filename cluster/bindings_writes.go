package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvgate/kvgate/kvkey"
)

type opKind uint8

const (
	opBind opKind = iota
	opEnd
	opPin
)

// bindOp is one write done behind the routing.
type bindOp struct {
	kind   opKind
	key    string
	parent string // the parent session's key ("" without one)
	target kvkey.Target
	known  uint64 // the cached revision when the turn was routed (0: none known)
	keep   bool   // a keep-alive touch: it never binds a session whose binding is gone
}

// bindValue is the stored value (JSON, well under 100 bytes for a typical worker URL).
type bindValue struct {
	V      int    `json:"v"`
	Worker string `json:"w"`
	Rank   int    `json:"r"`
	Writer string `json:"by"`
	AtMs   int64  `json:"at"`
	// Parent is the parent session's key, for the shared sibling groups.
	Parent string `json:"p,omitempty"`
	// MAC is the fleet-key signature (cluster/msgauth.go) over the bucket, the key and the
	// fields above; absent without a fleet key.
	MAC string `json:"mac,omitempty"`
}

// macFields are the signed fields of v, in order.
func (v bindValue) macFields() []string {
	return []string{strconv.Itoa(v.V), v.Worker, strconv.Itoa(v.Rank), v.Writer, strconv.FormatInt(v.AtMs, 10), v.Parent}
}

func (b *Bindings) enqueue(op bindOp) {
	select {
	case b.ops <- op:
	default:
		b.opsTotal.WithLabelValues(op.kind.String(), "dropped").Inc()
	}
}

func (k opKind) String() string {
	switch k {
	case opEnd:
		return "end"
	case opPin:
		return "pin"
	}
	return "bind"
}

// writer runs the queued writes in order, one at a time.
func (b *Bindings) writer(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case op := <-b.ops:
			b.apply(ctx, op)
		}
	}
}

// apply does one queued write against the bucket.
func (b *Bindings) apply(ctx context.Context, op bindOp) {
	kv := b.kv.Load()
	name := op.kind.String()
	if op.kind == opBind {
		name = "create"
		if op.known != 0 {
			name = "touch"
			if e, ok := b.cached(op.key); ok && e.target != op.target {
				name = "rebind"
			}
		}
	}
	component := "bindings"
	if op.kind == opPin {
		component = "pins"
	}
	if kv == nil || !b.node.Connected() {
		b.opsTotal.WithLabelValues(name, "error").Inc()
		b.node.CountError(component, errNotReady)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, b.deadline)
	defer cancel()
	bucket := b.node.Bucket("sessions")
	if op.kind == opPin {
		bucket = b.node.Bucket("pins")
	}
	val := b.encode(bucket, op.key, op.target, op.parent)
	var err error
	switch op.kind {
	case opPin:
		_, err = kv.pins.Put(ctx, op.key, val)
	case opEnd:
		err = kv.sessions.Delete(ctx, op.key)
	case opBind:
		err = b.bind(ctx, kv.sessions, op, val, name)
		if err == nil {
			return // bind counts its own outcomes
		}
	}
	if err != nil {
		b.opsTotal.WithLabelValues(name, "error").Inc()
		b.node.CountError(component, fmt.Errorf("%s: %w", name, err))
		return
	}
	b.opsTotal.WithLabelValues(name, "ok").Inc()
}

// bind creates (no known revision) or CAS-updates the binding; on a conflict it adopts the
// binding the bucket holds (the first writer, or a concurrent rebind, wins).
func (b *Bindings) bind(ctx context.Context, kv jetstream.KeyValue, op bindOp, val []byte, name string) error {
	var rev uint64
	var err error
	if op.known == 0 {
		rev, err = kv.Create(ctx, op.key, val)
	} else {
		rev, err = kv.Update(ctx, op.key, val, op.known)
	}
	if err == nil {
		b.put(op.key, bindValue{Worker: op.target.Worker, Rank: op.target.DPRank, Writer: b.node.ReplicaID(), Parent: op.parent}, rev)
		b.opsTotal.WithLabelValues(name, "ok").Inc()
		return nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return err
	}
	e, gerr := kv.Get(ctx, op.key)
	switch {
	case op.keep && (errors.Is(gerr, jetstream.ErrKeyNotFound) || errors.Is(gerr, jetstream.ErrKeyDeleted)):
		// Ended (or expired) since: a keep-alive does not bring it back.
		b.opsTotal.WithLabelValues("keepalive", "miss").Inc()
		return nil
	case errors.Is(gerr, jetstream.ErrKeyNotFound) || errors.Is(gerr, jetstream.ErrKeyDeleted):
		// It expired or ended since our revision: bind it afresh.
		rev, err = kv.Create(ctx, op.key, val)
		if err != nil {
			return err
		}
		b.put(op.key, bindValue{Worker: op.target.Worker, Rank: op.target.DPRank, Writer: b.node.ReplicaID(), Parent: op.parent}, rev)
		b.opsTotal.WithLabelValues(name, "ok").Inc()
		return nil
	case gerr != nil:
		return gerr
	}
	b.watched(e)
	result := "conflict" // someone else moved it: follow them
	if op.known == 0 {
		result = "lost" // another replica's first write won
	}
	b.opsTotal.WithLabelValues(name, result).Inc()
	return nil
}

// encode is the stored value of key k in bucket, signed with the fleet key (if any).
func (b *Bindings) encode(bucket, k string, t kvkey.Target, parent string) []byte {
	v := bindValue{V: 1, Worker: t.Worker, Rank: t.DPRank, Writer: b.node.ReplicaID(),
		AtMs: b.now().UnixMilli(), Parent: parent}
	if b.node.key != nil {
		v.MAC = b.node.key.kvMAC(bucket, k, v.macFields()...)
	}
	out, _ := json.Marshal(v)
	return out
}

// decode reads a stored value; with a fleet key it must be signed for its bucket and key, at
// the time the server stored it (a replayed old value fails), else it is counted under kind
// and refused.
func (b *Bindings) decode(e jetstream.KeyValueEntry, kind string) (bindValue, bool) {
	var v bindValue
	if err := json.Unmarshal(e.Value(), &v); err != nil || v.Worker == "" {
		return v, false
	}
	if err := b.node.key.checkKV(v.MAC, v.AtMs, e.Created(), e.Bucket(), e.Key(), v.macFields()...); err != nil {
		b.node.rejected(kind, fmt.Errorf("%s %s: %w", kind, e.Key(), err))
		return v, false
	}
	return v, true
}
