package cluster

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
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
		Help: "Session-binding and response-pin operations on the shared buckets, by op (create, touch, rebind, end, get, keepalive, pin, pin_get, watch) and result (ok, lost, conflict, miss, error, dropped, expired, stale).",
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

// key is the bucket key of an id: a prefix and 128 bits of its SHA-256, never the raw id
// (ids are client-supplied and may hold characters a key cannot).
func key(prefix, id string) string {
	h := sha256.Sum256([]byte(id))
	return prefix + "." + hex.EncodeToString(h[:16])
}
