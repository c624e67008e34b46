package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
)

// loadBatchWindow is how long a replica gathers its load deltas before publishing them as
// one message (the herding window is about this plus one NATS hop).
const loadBatchWindow = 2 * time.Millisecond

// Bounds of what waits to be published.
const (
	maxPendingApprox = 1024 // prompts routed in approximate mode not yet published; more are dropped
	subPendingMsgs   = 65536
	subPendingBytes  = 64 << 20
)

// publisher is the part of *nats.Conn the load sync publishes with (tests wrap it to lose
// chosen messages).
type publisher interface {
	PublishMsg(m *nats.Msg) error
}

// LoadSync shares this replica's in-flight load and approximate-mode routing with its peers
// over core NATS, and keeps their load (router.PeerLoads) for scoring. It implements
// router.LoadPublisher and router.ApproxPublisher.
//
// Sending: every change of the replica's own load arrives as a signed increment (LoadDelta);
// increments are summed per target for loadBatchWindow and published as one delta message on
// kvgate.v1.<fleet>.load.<replica>; every cluster.load_interval (and at once after a reconnect)
// the absolute totals follow as a snapshot on the same subject. The totals are the sum of every
// increment ever published, taken under the same lock, so a snapshot is exactly consistent
// with the delta stream before it. Every message carries the replica's epoch and a sequence
// number consecutive across both kinds; a message that fails to publish (NATS down: no reconnect
// buffer) still uses its number, so peers see the gap and mark this replica approximate until
// the next snapshot.
//
// Receiving: one fan-out subscription to kvgate.v1.<fleet>.load.* (NATS keeps one publisher's
// messages in order), own messages ignored, applied to the PeerLoads state machine in the
// subscription's goroutine. Peers silent for cluster.peer_timeout are dropped.
type LoadSync struct {
	node   *Node
	pub    publisher
	peers  *router.PeerLoads
	approx *indexers.ApproxIndex // peers' approximate-mode routing is recorded here (nil: ignored)
	known  func(kvkey.Target) bool
	log    *slog.Logger

	loadSubj, approxSubj string
	interval, timeout    time.Duration

	mu        sync.Mutex
	pending   map[kvkey.Target]router.LoadVector
	totals    map[kvkey.Target]router.LoadVector
	seq       uint64
	approxQ   []approxEntry
	approxSeq uint64

	kick, resnap chan struct{}
	subs         []*nats.Subscription
	stop         context.CancelFunc
	done         chan struct{}
	closeOnce    sync.Once

	m *loadMetrics
}

// LoadSyncOptions are what StartLoadSync needs besides the node.
type LoadSyncOptions struct {
	// Approx receives the peers' approximate-mode routing (the policy's approximate index).
	Approx *indexers.ApproxIndex
	// KnownTarget, when set, filters the peers' approximate-mode routing to this replica's
	// own targets (a peer with another fleet list must not grow the index without bound).
	KnownTarget func(kvkey.Target) bool
	// Registerer receives the kvgate_cluster_peers and load-message series (optional).
	Registerer prometheus.Registerer
	Log        *slog.Logger
}

// StartLoadSync subscribes to the peers' load and starts publishing this replica's; it runs
// until Close or ctx ends. A NATS that is down is not an error: the subscription is
// re-established by the client when it reconnects.
func StartLoadSync(ctx context.Context, n *Node, o LoadSyncOptions) (*LoadSync, error) {
	return startLoadSync(ctx, n, n.Conn(), o)
}

func startLoadSync(ctx context.Context, n *Node, pub publisher, o LoadSyncOptions) (*LoadSync, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	cfg := n.Config()
	ls := &LoadSync{node: n, pub: pub, approx: o.Approx, known: o.KnownTarget, log: o.Log.With("component", "cluster-load"),
		peers:    router.NewPeerLoads(cfg.PeerTimeout.D()),
		loadSubj: n.Subject("load", n.ReplicaID()), approxSubj: n.Subject("approx", n.ReplicaID()),
		interval: cfg.LoadInterval.D(), timeout: cfg.PeerTimeout.D(),
		pending: make(map[kvkey.Target]router.LoadVector), totals: make(map[kvkey.Target]router.LoadVector),
		kick: make(chan struct{}, 1), resnap: make(chan struct{}, 1), done: make(chan struct{})}
	m, err := newLoadMetrics(o.Registerer, ls.peers)
	if err != nil {
		return nil, err
	}
	ls.m = m
	for _, s := range []struct {
		subj string
		cb   nats.MsgHandler
	}{{n.Subject("load", "*"), ls.onLoad}, {n.Subject("approx", "*"), ls.onApprox}} {
		sub, err := n.Conn().Subscribe(s.subj, s.cb)
		if err != nil {
			ls.unsubscribe()
			return nil, fmt.Errorf("cluster: subscribe %s: %w", s.subj, err)
		}
		if err := sub.SetPendingLimits(subPendingMsgs, subPendingBytes); err != nil {
			ls.unsubscribe()
			return nil, fmt.Errorf("cluster: %s pending limits: %w", s.subj, err)
		}
		ls.subs = append(ls.subs, sub)
	}
	n.OnReconnect(func() {
		select {
		case ls.resnap <- struct{}{}:
		default:
		}
	})
	bg, stop := context.WithCancel(ctx)
	ls.stop = stop
	go ls.run(bg)
	return ls, nil
}

// Peers is the peers' load, for router.Fleet.
func (ls *LoadSync) Peers() *router.PeerLoads { return ls.peers }

// Fleet is what the router shares through this load sync.
func (ls *LoadSync) Fleet() router.Fleet {
	return router.Fleet{Peers: ls.peers, Load: ls, Approx: ls}
}

// LoadDelta implements router.LoadPublisher: it adds d to the next batch and to the totals.
func (ls *LoadSync) LoadDelta(t kvkey.Target, d router.LoadVector) {
	if d.IsZero() {
		return
	}
	ls.mu.Lock()
	p, had := ls.pending[t]
	p.Add(d)
	ls.pending[t] = p
	v := ls.totals[t]
	v.Add(d)
	if v.IsZero() {
		delete(ls.totals, t)
	} else {
		ls.totals[t] = v
	}
	first := !had && len(ls.pending) == 1
	ls.mu.Unlock()
	if first {
		select {
		case ls.kick <- struct{}{}:
		default:
		}
	}
}

// RoutedApprox implements router.ApproxPublisher: the prompt's head (at most maxApproxHashes
// blocks, a prefix of the chain, so what peers record is still a prefix) goes out with the
// next batch; past maxPendingApprox prompts waiting, it is dropped and counted.
func (ls *LoadSync) RoutedApprox(t kvkey.Target, hashes []kvkey.BlockHash) {
	if len(hashes) == 0 {
		return
	}
	hs := append([]kvkey.BlockHash(nil), hashes[:min(len(hashes), maxApproxHashes)]...)
	ls.mu.Lock()
	full := len(ls.approxQ) >= maxPendingApprox
	if !full {
		ls.approxQ = append(ls.approxQ, approxEntry{target: t, hashes: hs})
	}
	ls.mu.Unlock()
	if full {
		ls.m.approx.WithLabelValues("dropped").Inc()
		return
	}
	select {
	case ls.kick <- struct{}{}:
	default:
	}
}

// run publishes batches and snapshots and expires silent peers until ctx ends.
func (ls *LoadSync) run(ctx context.Context) {
	defer close(ls.done)
	snap := time.NewTicker(ls.interval)
	defer snap.Stop()
	expire := time.NewTicker(max(ls.timeout/4, time.Millisecond))
	defer expire.Stop()
	ls.publishSnapshot() // announce this replica at once
	for {
		select {
		case <-ctx.Done():
			return
		case <-ls.kick:
			t := time.NewTimer(loadBatchWindow)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			ls.flush()
		case <-snap.C:
			ls.publishSnapshot()
		case <-ls.resnap:
			ls.publishSnapshot()
		case <-expire.C:
			if n := ls.peers.Expire(time.Now()); n > 0 {
				ls.log.Info("peer replicas silent past peer_timeout: their load no longer counts", "peers", n)
			}
			ls.countDropped()
		}
	}
}

// flush publishes the pending deltas and approximate-mode prompts.
func (ls *LoadSync) flush() {
	ls.mu.Lock()
	msgs := ls.deltaMsgsLocked()
	approx := ls.approxMsgsLocked()
	ls.mu.Unlock()
	ls.send(msgs, "delta")
	ls.sendApprox(approx)
}

// publishSnapshot publishes the pending deltas, then the totals they add up to.
func (ls *LoadSync) publishSnapshot() {
	ls.mu.Lock()
	msgs := ls.deltaMsgsLocked()
	entries := make([]router.TargetLoadVector, 0, len(ls.totals))
	for t, v := range ls.totals {
		if len(entries) == maxWireEntries {
			break // more targets than a message holds: the rest count only through deltas
		}
		entries = append(entries, router.TargetLoadVector{Target: t, Load: v})
	}
	ls.seq++
	msgs = append(msgs, encodeLoad(kindSnapshot, ls.node.ReplicaID(), ls.node.Epoch(), ls.seq, entries))
	ls.mu.Unlock()
	ls.send(msgs, "snapshot")
}

// deltaMsgsLocked encodes and clears the pending deltas, numbering each message.
func (ls *LoadSync) deltaMsgsLocked() [][]byte {
	if len(ls.pending) == 0 {
		return nil
	}
	var msgs [][]byte
	batch := make([]router.TargetLoadVector, 0, min(len(ls.pending), maxDeltaEntries))
	emit := func() {
		ls.seq++
		msgs = append(msgs, encodeLoad(kindDelta, ls.node.ReplicaID(), ls.node.Epoch(), ls.seq, batch))
		batch = batch[:0]
	}
	for t, v := range ls.pending {
		if !v.IsZero() {
			batch = append(batch, router.TargetLoadVector{Target: t, Load: v})
		}
		if len(batch) == maxDeltaEntries {
			emit()
		}
	}
	if len(batch) > 0 {
		emit()
	}
	clear(ls.pending)
	return msgs
}

// approxMsgsLocked encodes and clears the pending approximate-mode prompts.
func (ls *LoadSync) approxMsgsLocked() [][]byte {
	if len(ls.approxQ) == 0 {
		return nil
	}
	var msgs [][]byte
	start, total := 0, 0
	emit := func(end int) {
		ls.approxSeq++
		msgs = append(msgs, encodeApprox(ls.node.ReplicaID(), ls.node.Epoch(), ls.approxSeq, ls.approxQ[start:end]))
		start, total = end, 0
	}
	for i, e := range ls.approxQ {
		if total+len(e.hashes) > maxApproxTotal {
			emit(i)
		}
		total += len(e.hashes)
	}
	emit(len(ls.approxQ))
	ls.approxQ = nil
	return msgs
}

// publish signs b with the fleet key and publishes it on subj.
func (ls *LoadSync) publish(subj string, b []byte) error {
	m := &nats.Msg{Subject: subj, Data: b}
	ls.node.key.signMsg(m)
	return ls.pub.PublishMsg(m)
}

func (ls *LoadSync) send(msgs [][]byte, what string) {
	for _, b := range msgs {
		if err := ls.publish(ls.loadSubj, b); err != nil {
			ls.m.load.WithLabelValues("publish_failed").Inc()
			ls.node.CountError("load", fmt.Errorf("publish %s: %w", what, err))
			continue
		}
		ls.m.load.WithLabelValues("sent").Inc()
	}
}

func (ls *LoadSync) sendApprox(msgs [][]byte) {
	for _, b := range msgs {
		if err := ls.publish(ls.approxSubj, b); err != nil {
			ls.m.approx.WithLabelValues("publish_failed").Inc()
			ls.node.CountError("approx", fmt.Errorf("publish: %w", err))
			continue
		}
		ls.m.approx.WithLabelValues("sent").Inc()
	}
}

// onLoad applies one peer load message (the subscription's goroutine).
func (ls *LoadSync) onLoad(msg *nats.Msg) {
	if strings.HasSuffix(msg.Subject, "."+ls.node.ReplicaID()) {
		return // our own
	}
	if !ls.node.authentic(msg, "load") {
		ls.m.load.WithLabelValues("unauthenticated").Inc()
		return
	}
	m, err := decodeMsg(msg.Data)
	if err == nil && m.kind == kindApprox {
		err = errors.New("an approx message on the load subject")
	}
	if err == nil && !strings.HasSuffix(msg.Subject, "."+m.replica) {
		err = fmt.Errorf("replica %q on another replica's subject", m.replica)
	}
	if err != nil {
		ls.m.load.WithLabelValues("invalid").Inc()
		ls.node.CountError("load", fmt.Errorf("from %s: %w", msg.Subject, err))
		return
	}
	if m.replica == ls.node.ReplicaID() {
		return
	}
	ls.m.load.WithLabelValues("received").Inc()
	now := time.Now()
	switch m.kind {
	case kindDelta:
		ls.peers.ApplyDelta(m.replica, m.epoch, m.seq, m.load, now)
	case kindSnapshot:
		ls.peers.ApplySnapshot(m.replica, m.epoch, m.seq, m.load, now)
	case kindLeave:
		ls.peers.Forget(m.replica)
	}
}

// onApprox records one peer's approximate-mode routing (the subscription's goroutine).
func (ls *LoadSync) onApprox(msg *nats.Msg) {
	if strings.HasSuffix(msg.Subject, "."+ls.node.ReplicaID()) {
		return
	}
	if !ls.node.authentic(msg, "approx") {
		ls.m.approx.WithLabelValues("unauthenticated").Inc()
		return
	}
	m, err := decodeMsg(msg.Data)
	if err == nil && m.kind != kindApprox {
		err = fmt.Errorf("kind %d on the approx subject", m.kind)
	}
	if err == nil && !strings.HasSuffix(msg.Subject, "."+m.replica) {
		err = fmt.Errorf("replica %q on another replica's subject", m.replica)
	}
	if err != nil {
		ls.m.approx.WithLabelValues("invalid").Inc()
		ls.node.CountError("approx", fmt.Errorf("from %s: %w", msg.Subject, err))
		return
	}
	if m.replica == ls.node.ReplicaID() {
		return
	}
	ls.m.approx.WithLabelValues("received").Inc()
	if ls.approx == nil {
		return
	}
	for _, e := range m.approx {
		if ls.known != nil && !ls.known(e.target) {
			ls.m.approx.WithLabelValues("unknown_target").Inc()
			continue
		}
		ls.approx.Record(e.target, e.hashes)
	}
}

// countDropped moves the subscriptions' slow-consumer drops into the metrics.
func (ls *LoadSync) countDropped() {
	for i, sub := range ls.subs {
		n, err := sub.Dropped()
		if err != nil {
			continue
		}
		c := ls.m.load
		if i == 1 {
			c = ls.m.approx
		}
		ls.m.dropMu.Lock()
		if d := n - ls.m.dropped[i]; d > 0 {
			c.WithLabelValues("dropped").Add(float64(d))
			ls.m.dropped[i] = n
		}
		ls.m.dropMu.Unlock()
	}
}

// Close tells the peers this replica is leaving (so its load stops counting at once), stops
// publishing and unsubscribes. Safe to call more than once.
func (ls *LoadSync) Close() {
	ls.closeOnce.Do(func() {
		ls.stop()
		<-ls.done
		ls.mu.Lock()
		ls.seq++
		b := encodeLoad(kindLeave, ls.node.ReplicaID(), ls.node.Epoch(), ls.seq, nil)
		ls.mu.Unlock()
		_ = ls.publish(ls.loadSubj, b) // best effort: peers expire us anyway
		ls.unsubscribe()
	})
}

func (ls *LoadSync) unsubscribe() {
	for _, s := range ls.subs {
		_ = s.Unsubscribe()
	}
}

// loadMetrics are the load sync's series.
type loadMetrics struct {
	load, approx *prometheus.CounterVec
	dropMu       sync.Mutex
	dropped      [2]int
}

func newLoadMetrics(reg prometheus.Registerer, peers *router.PeerLoads) (*loadMetrics, error) {
	m := &loadMetrics{
		load: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_cluster_load_messages_total",
			Help: "Load-sync messages (in-flight load deltas and snapshots): sent, publish_failed, received from peers, dropped (slow consumer), invalid, unauthenticated (no valid fleet-key signature).",
		}, []string{"event"}),
		approx: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_cluster_approx_messages_total",
			Help: "Approximate-mode routing messages: sent, publish_failed, received from peers, dropped (queue full or slow consumer), invalid, unauthenticated; unknown_target counts prompts for a target this replica does not have.",
		}, []string{"event"}),
	}
	if reg == nil {
		return m, nil
	}
	cs := []prometheus.Collector{m.load, m.approx,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvgate_cluster_peers",
			Help: "Peer replicas whose in-flight load this replica currently adds to its own.",
		}, func() float64 { return float64(peers.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kvgate_cluster_load_gaps_total",
			Help: "Sequence gaps in peers' load messages (lost messages; the peer counts as approximate until its next snapshot).",
		}, func() float64 { return float64(peers.Stats().Gaps) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kvgate_cluster_peers_expired_total",
			Help: "Peer replicas dropped after being silent for cluster.peer_timeout.",
		}, func() float64 { return float64(peers.Stats().Expired) }),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register cluster load metrics: %w", err)
		}
	}
	return m, nil
}
