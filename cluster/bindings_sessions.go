package cluster

import (
	"context"
	"sort"
	"time"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/sessions"
)

// activeRec is a session with requests in flight through this replica (Routed not yet
// Released): its binding is kept alive while they run.
type activeRec struct {
	n      int
	target kvkey.Target
	parent string    // the parent session's key ("" without one)
	since  time.Time // when its last request began
}

// Lookup implements sessions.SharedBindings: the fleet's binding of sessionID from the local
// cache (no network). A binding older than the session TTL has expired in the bucket too.
func (b *Bindings) Lookup(sessionID string) (sessions.SharedBinding, bool) {
	k := key("s", sessionID)
	b.mu.RLock()
	el, ok := b.cache[k]
	var e bindEntry
	if ok {
		e = *el.Value.(*bindEntry)
	}
	b.mu.RUnlock()
	if !ok || b.now().Sub(e.seen) > b.ttl {
		return sessions.SharedBinding{}, false
	}
	return sessions.SharedBinding{Target: e.target, Writer: e.writer, Seen: e.seen}, true
}

// Group implements sessions.SharedBindings: the targets where children of parentID landed
// across the fleet (from their bindings), most members first.
func (b *Bindings) Group(parentID string) []sessions.GroupMember {
	k := key("s", parentID)
	b.mu.RLock()
	defer b.mu.RUnlock()
	el, ok := b.groups[k]
	if !ok {
		return nil
	}
	g := el.Value.(*groupRec)
	if b.now().Sub(g.seen) > b.ttl {
		return nil
	}
	out := append([]sessions.GroupMember(nil), g.members...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Members > out[j].Members })
	return out
}

// Routed implements sessions.SharedBindings: it queues the write a routed turn needs (none
// when the binding already names t and was written less than TTL/8 ago), and counts the turn
// in flight until its Released.
func (b *Bindings) Routed(sessionID, parentID string, t kvkey.Target) {
	k := key("s", sessionID)
	pk := ""
	if parentID != "" {
		pk = key("s", parentID)
	}
	b.began(k, pk, t)
	b.mu.RLock()
	el, ok := b.cache[k]
	var e bindEntry
	if ok {
		e = *el.Value.(*bindEntry)
	}
	b.mu.RUnlock()
	now := b.now()
	if ok && now.Sub(e.seen) > b.ttl {
		ok = false // expired in the bucket too: create it again
	}
	if ok && e.target == t && now.Sub(e.seen) < b.touch {
		return
	}
	if ok && e.target != t && e.writer != b.node.ReplicaID() && now.Sub(e.seen) < b.race {
		// Another replica bound (or moved) the session just now, while this turn was being
		// routed without knowing it: a concurrent turn, not a decision to move. Follow the
		// binding, and mark it newer than this turn so the tracker's hints follow it too.
		b.refresh(k, now)
		b.opsTotal.WithLabelValues("rebind", "lost").Inc()
		return
	}
	op := bindOp{kind: opBind, key: k, target: t, parent: pk}
	if ok {
		op.known = e.rev
	}
	b.enqueue(op)
}

// Released implements sessions.SharedBindings: the request's lease ended. The binding is
// touched (at its cached target and revision: a lease end never moves it) when its last write
// is at least TTL/8 old, as a routed turn would; one this replica does not know is left alone
// (the session may have ended).
func (b *Bindings) Released(sessionID string, t kvkey.Target) {
	k := key("s", sessionID)
	b.amu.Lock()
	if a := b.active[k]; a != nil {
		if a.n--; a.n <= 0 {
			delete(b.active, k)
		}
	}
	b.amu.Unlock()
	if e, ok := b.cached(k); ok {
		b.keepAlive(k, e, b.touch)
	}
}

// began counts a request of the session keyed k in flight (bounded: beyond MaxEntries
// sessions in flight a new one is not kept alive, and counted as dropped).
func (b *Bindings) began(k, parent string, t kvkey.Target) {
	b.amu.Lock()
	defer b.amu.Unlock()
	a := b.active[k]
	if a == nil {
		if len(b.active) >= b.max {
			b.opsTotal.WithLabelValues("keepalive", "dropped").Inc()
			return
		}
		a = &activeRec{}
		b.active[k] = a
	}
	a.n++
	a.target, a.parent, a.since = t, parent, b.now()
}

// keepAlive queues a touch of the cached binding e (key k) when this replica learned its
// last write at least after ago and it has not expired.
func (b *Bindings) keepAlive(k string, e bindEntry, after time.Duration) {
	age := b.now().Sub(e.seen)
	if age < after || age > b.ttl {
		return
	}
	b.enqueue(bindOp{kind: opBind, key: k, target: e.target, known: e.rev, keep: true})
}

// forget stops keeping the session keyed k alive (it ended).
func (b *Bindings) forget(k string) {
	b.amu.Lock()
	delete(b.active, k)
	b.amu.Unlock()
}

// keeper keeps the bindings of sessions with requests in flight alive: every TTL/4 it touches
// those whose last write is at least TTL/2 old, and binds again (at the request's target) one
// that is gone from the cache (expired, or lost with its bucket), so a request that runs
// longer than the TTL keeps its session's binding.
func (b *Bindings) keeper(ctx context.Context) {
	tick := time.NewTicker(max(b.ttl/4, 10*time.Millisecond))
	defer tick.Stop()
	type inflight struct {
		key string
		rec activeRec
	}
	var batch []inflight
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		batch = batch[:0]
		now := b.now()
		b.amu.Lock()
		for k, a := range b.active {
			if now.Sub(a.since) > b.maxAge {
				delete(b.active, k) // its Released never came
				b.opsTotal.WithLabelValues("keepalive", "expired").Inc()
				continue
			}
			batch = append(batch, inflight{k, *a})
		}
		b.amu.Unlock()
		for _, f := range batch {
			e, ok := b.cached(f.key)
			if ok && b.now().Sub(e.seen) <= b.ttl {
				b.keepAlive(f.key, e, b.ttl/2)
				continue
			}
			if b.Behind() {
				continue // the watch is replaying the bucket: the binding may be there
			}
			b.enqueue(bindOp{kind: opBind, key: f.key, target: f.rec.target, parent: f.rec.parent})
		}
	}
}

// InFlight is how many sessions have requests in flight through this replica (their bindings
// are kept alive).
func (b *Bindings) InFlight() int {
	b.amu.Lock()
	defer b.amu.Unlock()
	return len(b.active)
}

// Ended implements sessions.SharedBindings: the binding is dropped here at once and deleted
// from the bucket behind.
func (b *Bindings) Ended(sessionID string) {
	k := key("s", sessionID)
	b.drop(k)
	b.forget(k)
	b.enqueue(bindOp{kind: opEnd, key: k})
}
