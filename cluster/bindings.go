package cluster

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/sessions"
)

// Bucket sizes: memory storage reserves MaxBytes on the server, so they stay well under the
// embedded server's default max_memory (256 MiB) next to the other parts' buckets. A binding is
// about 150 B stored (key, value and JetStream's per-message overhead).
const (
	sessionsMaxBytes = 64 << 20
	pinsMaxBytes     = 32 << 20
	maxValueSize     = 512
	opQueue          = 4096
	// maxGroupTargets bounds the targets a shared sibling group remembers.
	maxGroupTargets = 8
)

// errNotReady is counted when a write or read finds the buckets not (re)created yet.
var errNotReady = errors.New("session buckets not ready (NATS unreachable or bucket being recreated)")

// BindingsOptions configure Bindings.
type BindingsOptions struct {
	// MaxEntries bounds the local cache of the fleet's bindings (oldest update dropped first);
	// a dropped binding is fetched again on the session's next write.
	MaxEntries int
	// PinTTL is the pins bucket's TTL (a pin disappears this long after its last share); 0
	// uses the session TTL.
	PinTTL time.Duration
	// MaxRequestAge is a safety net: a session whose last request in flight began this long
	// ago (its Released never came) is no longer kept alive. 0 means 1h; cmd/kvgate passes
	// router.kv.load_expiry, after which the router releases such a request's load too.
	MaxRequestAge time.Duration
	// Registerer receives kvgate_cluster_binding_* metrics; nil registers nothing.
	Registerer prometheus.Registerer
	Log        *slog.Logger
}

// Bindings is the fleet's session bindings (sessions.SharedBindings) and Responses pins
// (router.SharedPins) in two JetStream key-value buckets of the node's fleet, memory storage,
// cluster.kv_replicas replicas:
//
//   - bucket node.Bucket("sessions"), TTL cluster.session_ttl: key "s.<hex sha256(session id)[:16]>",
//     value {target, dp rank, writer replica, time}. The first turn's write is Create (the first
//     writer wins; the losers read and follow the winner), later turns touch it with Update at
//     the cached revision at most every TTL/8 (any write restarts the bucket's TTL), a turn the
//     router sent elsewhere rebinds it with the same CAS, and the end of a session deletes it.
//     A WatchAll feeds the local cache Lookup reads, so hints never wait on the network; writes
//     are done behind the routing by one goroutine, each bounded by cluster.kv_deadline.
//   - bucket node.Bucket("pins"): key "p.<hash(response id)>", value the target storing it,
//     written (within the deadline) when a worker produces a stored response, before the
//     client sees the id, rewritten behind while in use, and read (direct get, bounded by the
//     deadline) when a previous_response_id is unknown locally.
//
// Any NATS failure is counted (node.CountError "bindings" / "pins") and leaves this replica on
// its own state. After a reconnect the buckets are recreated (a memory bucket is gone if its
// server restarted) and the watch restarted. It is safe for concurrent use.
type Bindings struct {
	node     *Node
	log      *slog.Logger
	ttl      time.Duration
	pinTTL   time.Duration
	deadline time.Duration
	touch    time.Duration
	race     time.Duration // a binding another replica wrote this recently is followed, not moved
	max      int
	maxAge   time.Duration // MaxRequestAge
	now      func() time.Time

	ops    chan bindOp
	ensure chan struct{}
	kv     atomic.Pointer[buckets]
	ready  atomic.Bool
	// leaderChanges counts the sessions stream's leader elections this replica heard of;
	// with the node's reconnects it makes the generation of the watch (gen). synced is 1 + the
	// generation whose watch delivered all initial values: the cache is behind the bucket
	// while it differs from gen()+1 (see Sync).
	leaderChanges atomic.Uint64
	synced        atomic.Uint64
	advisory      *nats.Subscription
	deletedSubs   []*nats.Subscription
	// deleted is set (with why) when a bucket was found deleted, until setup recreated it.
	deleted   atomic.Bool
	deletedMu sync.Mutex
	deletedAt time.Time

	// amu guards active (a leaf lock, never held with mu).
	amu    sync.Mutex
	active map[string]*activeRec // key → requests in flight through this replica

	mu     sync.RWMutex
	cache  map[string]*list.Element // key → *bindEntry
	order  *list.List               // by last update, most recent at the front
	groups map[string]*list.Element // parent's key → *groupRec
	gorder *list.List               // groups by last update, most recent at the front

	opsTotal *prometheus.CounterVec
	stopOnce sync.Once
	stop     context.CancelFunc
	done     chan struct{}
}

type buckets struct{ sessions, pins jetstream.KeyValue }

// groupRec is a shared sibling group: where the children of one parent landed, as this
// replica learned their bindings.
type groupRec struct {
	key     string
	members []sessions.GroupMember
	seen    time.Time
}

// activeRec is a session with requests in flight through this replica (Routed not yet
// Released): its binding is kept alive while they run.
type activeRec struct {
	n      int
	target kvkey.Target
	parent string    // the parent session's key ("" without one)
	since  time.Time // when its last request began
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

// NewBindings returns the bindings of node's fleet. Start runs them.
func NewBindings(node *Node, o BindingsOptions) (*Bindings, error) {
	if node == nil {
		return nil, errors.New("cluster bindings: no node")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = 100_000
	}
	cfg := node.Config()
	b := &Bindings{node: node, log: o.Log.With("component", "cluster-bindings"), ttl: cfg.SessionTTL.D(),
		pinTTL: o.PinTTL, deadline: cfg.KVDeadline.D(), max: o.MaxEntries, now: time.Now,
		ops: make(chan bindOp, opQueue), ensure: make(chan struct{}, 1),
		active: map[string]*activeRec{},
		cache:  map[string]*list.Element{}, order: list.New(), groups: map[string]*list.Element{}, gorder: list.New(),
		done: make(chan struct{})}
	if b.pinTTL <= 0 {
		b.pinTTL = b.ttl
	}
	b.maxAge = o.MaxRequestAge
	if b.maxAge <= 0 {
		b.maxAge = time.Hour
	}
	b.touch = b.ttl / 8
	b.race = max(2*b.deadline, 20*time.Millisecond)
	b.opsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvgate_cluster_binding_ops_total",
		Help: "Session-binding and response-pin operations on the shared buckets, by op (create, touch, rebind, end, get, keepalive, pin, pin_get) and result (ok, lost, conflict, miss, error, dropped, expired).",
	}, []string{"op", "result"})
	if o.Registerer != nil {
		if err := o.Registerer.Register(b.opsTotal); err != nil {
			return nil, fmt.Errorf("cluster bindings metrics: %w", err)
		}
		if err := o.Registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvgate_cluster_binding_cache_entries",
			Help: "Session bindings of the fleet this replica holds in its local cache.",
		}, func() float64 { return float64(b.Len()) })); err != nil {
			return nil, fmt.Errorf("cluster bindings metrics: %w", err)
		}
	}
	return b, nil
}

// Start creates the buckets (retrying in the background while NATS is unreachable), watches
// the sessions bucket and runs the write-behind loop until Close or ctx ends.
func (b *Bindings) Start(ctx context.Context) {
	ctx, b.stop = context.WithCancel(ctx)
	b.node.OnReconnect(b.requestEnsure)
	// A new leader of the sessions stream: the watch's ordered consumer (jetstream/kv.go
	// watches with nats.OrderedConsumer) may have lived on the old one, and nats.go resets it
	// only after two missed 5 s heartbeats (js.go, activityCheck), so the watch is restarted
	// at once (and the cache treated as behind until it caught up).
	// The advisory is nats-server's JSAdvisoryStreamLeaderElectedPre (server/jetstream_api.go).
	sub, err := b.node.Conn().Subscribe("$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.KV_"+b.node.Bucket("sessions"), func(*nats.Msg) {
		b.leaderChanges.Add(1)
		b.requestEnsure()
	})
	if err != nil {
		b.node.CountError("bindings", fmt.Errorf("leader advisories: %w", err))
	}
	b.advisory = sub
	// A bucket deleted under the replicas (nats-server's JSAdvisoryStreamDeletedPre): noticed
	// at once, and by the periodic check (checkBuckets) if the advisory was missed.
	for _, what := range []string{"sessions", "pins"} {
		sub, err := b.node.Conn().Subscribe("$JS.EVENT.ADVISORY.STREAM.DELETED.KV_"+b.node.Bucket(what), func(*nats.Msg) { b.bucketGone(what) })
		if err != nil {
			b.node.CountError("bindings", fmt.Errorf("delete advisories: %w", err))
			continue
		}
		b.deletedSubs = append(b.deletedSubs, sub)
	}
	b.requestEnsure()
	var wg sync.WaitGroup
	wg.Go(func() { b.maintain(ctx) })
	wg.Go(func() { b.checkBuckets(ctx) })
	wg.Go(func() { b.writer(ctx) })
	wg.Go(func() { b.keeper(ctx) })
	go func() { wg.Wait(); close(b.done) }()
}

// Close stops the background work.
func (b *Bindings) Close() {
	b.stopOnce.Do(func() {
		if b.advisory != nil {
			_ = b.advisory.Unsubscribe()
		}
		for _, sub := range b.deletedSubs {
			_ = sub.Unsubscribe()
		}
		if b.stop != nil {
			b.stop()
			<-b.done
		}
	})
}

// Ready reports whether the buckets exist and the watch runs.
func (b *Bindings) Ready() bool { return b.ready.Load() }

// Len is how many bindings the local cache holds.
func (b *Bindings) Len() int {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return len(b.cache)
}

// BindingsStatus is the shared bindings' state as /health and /debug/workers show it.
type BindingsStatus struct {
	// Ready: both buckets exist and the watch feeds the cache; false while NATS is
	// unreachable or the buckets are being recreated (bindings are then this replica's own).
	Ready        bool `json:"ready"`
	CacheEntries int  `json:"cache_entries"`
	// Behind: since the last reconnect or leader election of the sessions stream the watch
	// has not replayed the bucket yet; turns read their bindings from the bucket meanwhile.
	Behind bool `json:"behind"`
	// InFlightSessions is how many sessions have requests in flight through this replica
	// (their bindings are kept alive).
	InFlightSessions int `json:"in_flight_sessions"`
}

// HealthDetail reports the bindings for the server's /health and /debug/workers
// (server.HealthDetail); not ready is degraded.
func (b *Bindings) HealthDetail() (name string, detail any, degraded bool) {
	st := BindingsStatus{Ready: b.Ready() && b.node.Connected(), CacheEntries: b.Len(), Behind: b.Behind(),
		InFlightSessions: b.InFlight()}
	return "cluster_bindings", st, !st.Ready
}

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
		for e := range w.Updates() {
			if e == nil { // the end of the initial values: the cache caught up
				b.sweep(gen)
				b.synced.Store(gen + 1)
				continue
			}
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

// key is the bucket key of an id: a prefix and 128 bits of its SHA-256, never the raw id
// (ids are client-supplied and may hold characters a key cannot).
func key(prefix, id string) string {
	h := sha256.Sum256([]byte(id))
	return prefix + "." + hex.EncodeToString(h[:16])
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
