package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/sessions"
)

// groupRec is a shared sibling group: where the children of one parent landed, as this
// replica learned their bindings.
type groupRec struct {
	key     string
	members []sessions.GroupMember
	seen    time.Time
}

// bindEntry is one cached binding.
type bindEntry struct {
	key    string
	target kvkey.Target
	writer string
	rev    uint64
	seen   time.Time // when this replica learned this revision (its own clock)
	gen    uint64    // the watch generation (gen) when it was learned
}

// gen is the watch generation: it changes with every reconnect and every leader election of
// the sessions stream.
func (b *Bindings) gen() uint64 { return b.node.reconnects.Load() + b.leaderChanges.Load() }

// Behind reports whether the cache is known to lag the bucket: since the last reconnect or
// leader change of the sessions stream, the restarted watch has not delivered all initial
// values yet.
func (b *Bindings) Behind() bool { return b.synced.Load() != b.gen()+1 }

// Sync implements sessions.SharedBindings: while the cache is known to be behind (Behind),
// the bindings of sessionID and parentID that this replica did not learn since are read from
// the bucket (a direct get, within cluster.kv_deadline) into the cache, so the turn follows
// a binding another replica wrote meanwhile. Otherwise it returns at once. A failure is
// counted and leaves the cache as it was.
func (b *Bindings) Sync(ctx context.Context, sessionID, parentID string) {
	if !b.Behind() {
		return
	}
	kv := b.kv.Load()
	if kv == nil || !b.node.Connected() {
		return
	}
	g := b.gen()
	for _, id := range [2]string{sessionID, parentID} {
		if id == "" {
			continue
		}
		k := key("s", id)
		if e, ok := b.cached(k); ok && e.gen == g {
			continue
		}
		if err := b.fetch(ctx, kv.sessions, k); err != nil {
			b.opsTotal.WithLabelValues("get", "error").Inc()
			b.node.CountError("bindings", fmt.Errorf("get: %w", err))
			return
		}
	}
}

// fetch reads binding k from the bucket into the cache.
func (b *Bindings) fetch(ctx context.Context, kv jetstream.KeyValue, k string) error {
	ctx, cancel := context.WithTimeout(ctx, b.deadline)
	defer cancel()
	e, err := kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		b.opsTotal.WithLabelValues("get", "miss").Inc()
		return nil // nothing newer than what this replica knows
	}
	if err != nil {
		return err
	}
	v, ok := b.decode(e, "binding")
	if !ok {
		return nil
	}
	b.opsTotal.WithLabelValues("get", "ok").Inc()
	b.put(k, v, e.Revision())
	return nil
}

// sweep drops the cached bindings learned before generation g that its watch's initial values
// did not deliver again: they are gone from the bucket.
func (b *Bindings) sweep(g uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for el := b.order.Back(); el != nil; {
		prev := el.Prev()
		if e := el.Value.(*bindEntry); e.gen < g {
			b.order.Remove(el)
			delete(b.cache, e.key)
		}
		el = prev
	}
}

// watched applies one watch entry to the cache.
func (b *Bindings) watched(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		b.drop(e.Key())
		b.forget(e.Key()) // the session ended fleet-wide: nothing keeps it alive any more
		return
	}
	v, ok := b.decode(e, "binding")
	if !ok {
		return // not ours, a newer schema, or not signed with the fleet key: ignore
	}
	b.put(e.Key(), v, e.Revision())
}

func (b *Bindings) cached(k string) (bindEntry, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if el, ok := b.cache[k]; ok {
		return *el.Value.(*bindEntry), true
	}
	return bindEntry{}, false
}

// put caches a binding at rev (an older revision than the cached one is ignored: the watch may
// deliver our own write after we cached it).
func (b *Bindings) put(k string, v bindValue, rev uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	t := kvkey.Target{Worker: v.Worker, DPRank: v.Rank}
	g := b.gen()
	if el, ok := b.cache[k]; ok {
		e := el.Value.(*bindEntry)
		if e.gen == g {
			if rev < e.rev {
				return
			}
			if rev == e.rev && e.target == t {
				return // our own write echoed by the watch: keep when we learned it
			}
		}
		// Newer, or learned again after a reset (its revision may belong to a bucket that is
		// gone): the bucket's binding, learned now, wins over this replica's routing before.
		e.target, e.writer, e.rev, e.seen, e.gen = t, v.Writer, rev, now, g
		b.order.MoveToFront(el)
		return
	}
	b.cache[k] = b.order.PushFront(&bindEntry{key: k, target: t, writer: v.Writer, rev: rev, seen: now, gen: g})
	if v.Parent != "" {
		b.joinGroupLocked(v.Parent, t, now) // a child's first binding this replica learned
	}
	for b.order.Len() > b.max {
		old := b.order.Back()
		b.order.Remove(old)
		delete(b.cache, old.Value.(*bindEntry).key)
	}
}

// joinGroupLocked counts a child of the parent keyed pk on t; b.mu must be held.
func (b *Bindings) joinGroupLocked(pk string, t kvkey.Target, now time.Time) {
	var g *groupRec
	if el, ok := b.groups[pk]; ok {
		g = el.Value.(*groupRec)
		if now.Sub(g.seen) > b.ttl {
			g.members = g.members[:0]
		}
		b.gorder.MoveToFront(el)
	} else {
		g = &groupRec{key: pk}
		b.groups[pk] = b.gorder.PushFront(g)
		for b.gorder.Len() > b.max {
			old := b.gorder.Back()
			b.gorder.Remove(old)
			delete(b.groups, old.Value.(*groupRec).key)
		}
	}
	g.seen = now
	for i := range g.members {
		if g.members[i].Target == t {
			g.members[i].Members++
			return
		}
	}
	if len(g.members) >= maxGroupTargets {
		fewest := 0
		for i := range g.members {
			if g.members[i].Members < g.members[fewest].Members {
				fewest = i
			}
		}
		g.members = append(g.members[:fewest], g.members[fewest+1:]...)
	}
	g.members = append(g.members, sessions.GroupMember{Target: t, Members: 1})
}

// refresh marks the cached binding k as learned at now.
func (b *Bindings) refresh(k string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if el, ok := b.cache[k]; ok {
		el.Value.(*bindEntry).seen = now
	}
}

func (b *Bindings) drop(k string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if el, ok := b.cache[k]; ok {
		b.order.Remove(el)
		delete(b.cache, k)
	}
}
