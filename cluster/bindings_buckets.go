package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// bucketCheckEvery is how often a replica checks that the fleet's buckets still exist.
const bucketCheckEvery = 2 * time.Second

// bucketGone records that the what bucket was deleted and asks for it to be recreated.
func (b *Bindings) bucketGone(what string) {
	if b.deleted.CompareAndSwap(false, true) {
		b.deletedMu.Lock()
		b.deletedAt = b.now()
		b.deletedMu.Unlock()
		b.opsTotal.WithLabelValues("bucket", "deleted").Inc()
		b.log.Error("a shared bucket was deleted under the fleet; recreating it (a NATS user allowed to delete streams did it: see cluster.embedded_nats.users)",
			"bucket", b.node.Bucket(what))
	}
	b.ready.Store(false)
	b.requestEnsure()
}

// checkBuckets looks the buckets' streams up every bucketCheckEvery while they are ready.
func (b *Bindings) checkBuckets(ctx context.Context) {
	t := time.NewTicker(bucketCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !b.ready.Load() || !b.node.Connected() {
			continue
		}
		for _, what := range []string{"sessions", "pins"} {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := b.node.JetStream().Stream(cctx, "KV_"+b.node.Bucket(what))
			cancel()
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				b.bucketGone(what)
			}
		}
	}
}

// Readiness implements server.ReadinessCheck: not ready while a bucket found deleted is not
// recreated yet (bindings and pins are then this replica's own; a Responses follow-up through
// another replica would not find its pin). NATS merely unreachable keeps the replica ready:
// it routes on its own state, degraded in /health.
func (b *Bindings) Readiness() (name string, ready bool, reason string) {
	if !b.deleted.Load() {
		return "cluster_bindings", true, ""
	}
	b.deletedMu.Lock()
	at := b.deletedAt
	b.deletedMu.Unlock()
	return "cluster_bindings", false, "the shared session/pin bucket was deleted at " + at.UTC().Format(time.RFC3339) + "; recreating it"
}

func (b *Bindings) requestEnsure() {
	select {
	case b.ensure <- struct{}{}:
	default:
	}
}

// maintain (re)creates the buckets and the watch whenever asked (start, reconnect), retrying
// every second until it succeeds.
func (b *Bindings) maintain(ctx context.Context) {
	var stopWatch func()
	defer func() {
		if stopWatch != nil {
			stopWatch()
		}
	}()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.ensure:
		case <-retry.C:
		}
		if stopWatch != nil {
			stopWatch()
			stopWatch = nil
		}
		b.ready.Store(false)
		sw, err := b.setup(ctx)
		if err != nil {
			b.node.CountError("bindings", err)
			if failures++; failures == 1 || failures%60 == 0 {
				b.log.Warn("session buckets not ready; bindings stay local, retrying every second", "err", err, "attempts", failures)
			}
			retry.Reset(time.Second)
			continue
		}
		if failures > 0 {
			b.log.Info("session buckets ready", "after_attempts", failures+1)
		}
		failures = 0
		stopWatch = sw
		b.ready.Store(true)
		if b.deleted.CompareAndSwap(true, false) {
			b.log.Info("shared buckets recreated after a deletion")
		}
	}
}

// setup creates (or updates) both buckets and starts the watch of the sessions bucket.
func (b *Bindings) setup(ctx context.Context) (stopWatch func(), err error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second) // retried every second (maintain)
	defer cancel()
	js, cfg := b.node.JetStream(), b.node.Config()
	sess, err := js.CreateOrUpdateKeyValue(cctx, jetstream.KeyValueConfig{
		Bucket: b.node.Bucket("sessions"), Description: "kvgate session bindings",
		TTL: b.ttl, History: 1, Storage: jetstream.MemoryStorage, Replicas: cfg.KVReplicas,
		MaxValueSize: maxValueSize, MaxBytes: sessionsMaxBytes})
	if err != nil {
		return nil, fmt.Errorf("sessions bucket: %w", err)
	}
	pins, err := js.CreateOrUpdateKeyValue(cctx, jetstream.KeyValueConfig{
		Bucket: b.node.Bucket("pins"), Description: "kvgate Responses API pins",
		TTL: b.pinTTL, History: 1, Storage: jetstream.MemoryStorage, Replicas: cfg.KVReplicas,
		MaxValueSize: maxValueSize, MaxBytes: pinsMaxBytes})
	if err != nil {
		return nil, fmt.Errorf("pins bucket: %w", err)
	}
	// The leader's last sequence before the watch starts: the watch has caught up only once it
	// delivered it, or the leader no longer has it (see watchStale).
	st, err := sess.Status(cctx)
	if err != nil {
		return nil, fmt.Errorf("sessions bucket status: %w", err)
	}
	var lastAtStart uint64
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		lastAtStart = bs.StreamInfo().State.LastSeq
	}
	gen := b.gen()
	wctx, wcancel := context.WithCancel(ctx)
	w, err := sess.WatchAll(wctx)
	if err != nil {
		wcancel()
		return nil, fmt.Errorf("sessions watch: %w", err)
	}
	b.kv.Store(&buckets{sessions: sess, pins: pins})
	// The watch delivers every live binding first. The cache keeps answering meanwhile (no
	// blind window), but what it learned before this generation may be stale or come from a
	// bucket that is gone (its server restarted): such an entry is replaced by what the watch
	// (or Sync) delivers, and dropped at the end of the initial values if neither did.
	done := make(chan struct{})
	go func() {
		defer close(done)
		var delivered uint64 // the highest stream sequence (revision) the watch delivered
		for e := range w.Updates() {
			if e == nil { // the end of the initial values: the cache caught up, unless stale
				if b.watchStale(wctx, delivered, lastAtStart) {
					b.opsTotal.WithLabelValues("watch", "stale").Inc()
					b.log.Info("the sessions watch started on a stream replica still catching up; restarting it",
						"delivered_to", delivered, "leader_last_seq", lastAtStart)
					time.AfterFunc(time.Second, b.requestEnsure)
					continue
				}
				b.sweep(gen)
				b.synced.Store(gen + 1)
				continue
			}
			delivered = max(delivered, e.Revision())
			b.watched(e)
		}
	}()
	// Stopping cancels the watch's context rather than calling w.Stop: Stop unsubscribes and
	// then deletes the ordered consumer with a JetStream API request (nats.go, file nats.go,
	// Subscription.Unsubscribe → deleteConsumer) that, while the consumer's server is gone or
	// the meta leader is being elected, waits out the 5 s API timeout, and the restarted watch
	// with it. On cancellation nats.go unsubscribes in its own goroutine (js.go, subscribe:
	// <-ctx.Done(), sub.Unsubscribe()): Updates closes at once and the delete finishes behind
	// (an ephemeral consumer the server would drop anyway).
	return func() { wcancel(); <-done }, nil
}

// watchStale reports whether a watch whose initial values ended at stream sequence delivered
// missed writes the leader had when it started (lastAtStart). The watch's ordered consumer may
// live on any replica of the sessions stream: nats-server places an R1 consumer on a random
// active peer (server/jetstream_cluster.go, createGroupForConsumer), and a replica that
// restarted (the stream is in memory) serves what it has caught up so far, which can lack the
// latest bindings; ended there, the watch would sweep and call the cache current without them.
// The leader still holding lastAtStart proves the watch stale; that message deleted or expired
// (a key's later delete, the bucket's TTL) proves nothing, nor does an unanswered request: the
// watch then counts as caught up, as it did before this check.
func (b *Bindings) watchStale(ctx context.Context, delivered, lastAtStart uint64) bool {
	if delivered >= lastAtStart {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, max(b.deadline, time.Second))
	defer cancel()
	// The plain message-get API, answered by the stream leader (not the direct get, which any
	// replica answers, the lagging one included).
	prefix := b.node.JetStream().Options().APIPrefix // kvgate's node uses jetstream.New: the default
	if prefix == "" {
		prefix = jetstream.DefaultAPIPrefix
	}
	subj := prefix + "STREAM.MSG.GET.KV_" + b.node.Bucket("sessions")
	req, _ := json.Marshal(struct {
		Seq uint64 `json:"seq"`
	}{lastAtStart})
	msg, err := b.node.Conn().RequestWithContext(ctx, subj, req)
	if err != nil {
		return false
	}
	var resp struct {
		Message *struct {
			Seq uint64 `json:"seq"`
		} `json:"message"`
	}
	return json.Unmarshal(msg.Data, &resp) == nil && resp.Message != nil && resp.Message.Seq == lastAtStart
}
