package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/keylimits"
)

// limitsInterval is how often a replica reports its per-key demand and requests in flight. It
// sets how fast the fleet's shares follow a key's traffic moving between replicas and how
// stale a peer's in-flight count (max_concurrent) may be; one small message per replica per
// interval either way.
const limitsInterval = 100 * time.Millisecond

// maxLimitEntries bounds the keys in one limits message (a larger report goes in several).
const maxLimitEntries = 1024

// LimitsSync makes the per-key limits (auth.keys requests_per_minute, tokens_per_minute,
// max_concurrent) fleet-wide: every limitsInterval each replica publishes, on
// kvgate.v1.<fleet>.limits.<replica>, its keylimits report (each active key's demand rates and
// requests in flight; an empty message is the heartbeat that keeps the replica counted) and
// applies the peers' reports to its keylimits.Limiter, which spends from each key's buckets in
// proportion to this replica's share of the demand (keylimits.Limiter says why shares and not
// shared consumption). Messages are signed and checked with the fleet key like the load
// sync's. A peer silent for cluster.peer_timeout stops counting; NATS being down leaves each
// replica on its last shares (stale peers expire: then each holds the whole limit, the
// fleet's worst case being one limit per replica while the bus is down).
type LimitsSync struct {
	node *Node
	pub  publisher
	lim  *keylimits.Limiter
	subj string
	log  *slog.Logger
	now  func() time.Time

	mu  sync.Mutex
	seq uint64

	sub       *nats.Subscription
	stop      context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
	msgs      *prometheus.CounterVec
}

// limitsMsg is the JSON of a limits message.
type limitsMsg struct {
	Replica string        `json:"replica"`
	Epoch   uint64        `json:"epoch"`
	Seq     uint64        `json:"seq"`
	Leave   bool          `json:"leave,omitempty"`
	Keys    []limitsEntry `json:"keys,omitempty"`
}

type limitsEntry struct {
	Name     string  `json:"n"`
	Requests float64 `json:"r,omitempty"`
	Tokens   float64 `json:"t,omitempty"`
	InFlight int     `json:"c,omitempty"`
}

// StartLimitsSync starts sharing lim's reports with the peers until Close or ctx ends; reg
// (optional) gets kvgate_cluster_limits_messages_total.
func StartLimitsSync(ctx context.Context, n *Node, lim *keylimits.Limiter, reg prometheus.Registerer, log *slog.Logger) (*LimitsSync, error) {
	return startLimitsSync(ctx, n, n.Conn(), lim, reg, log, limitsInterval)
}

func startLimitsSync(ctx context.Context, n *Node, pub publisher, lim *keylimits.Limiter, reg prometheus.Registerer, log *slog.Logger, interval time.Duration) (*LimitsSync, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &LimitsSync{node: n, pub: pub, lim: lim, subj: n.Subject("limits", n.ReplicaID()),
		log: log.With("component", "cluster-limits"), now: time.Now, done: make(chan struct{}),
		msgs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_cluster_limits_messages_total",
			Help: "Per-key limit reports between replicas: sent, publish_failed, received, invalid, unauthenticated.",
		}, []string{"event"})}
	if reg != nil {
		if err := reg.Register(s.msgs); err != nil {
			return nil, fmt.Errorf("register cluster limits metrics: %w", err)
		}
	}
	sub, err := n.Conn().Subscribe(n.Subject("limits", "*"), s.onMsg)
	if err != nil {
		return nil, fmt.Errorf("cluster: subscribe limits: %w", err)
	}
	if err := sub.SetPendingLimits(subPendingMsgs, subPendingBytes); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("cluster: limits pending limits: %w", err)
	}
	s.sub = sub
	bg, stop := context.WithCancel(ctx)
	s.stop = stop
	go s.run(bg, interval)
	return s, nil
}

// run reports every interval and expires silent peers until ctx ends.
func (s *LimitsSync) run(ctx context.Context, interval time.Duration) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	s.report()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.report()
			if n := s.lim.ExpirePeers(s.now()); n > 0 {
				s.log.Info("peer replicas silent past peer_timeout: their share of the key limits returns to the others", "peers", n)
			}
		}
	}
}

// report publishes this replica's report (at least one message: the heartbeat).
func (s *LimitsSync) report() {
	rep := s.lim.Report(s.now())
	for first := true; first || len(rep) > 0; first = false {
		part := rep[:min(len(rep), maxLimitEntries)]
		rep = rep[len(part):]
		m := limitsMsg{Keys: make([]limitsEntry, len(part))}
		for i, k := range part {
			m.Keys[i] = limitsEntry{Name: k.Name, Requests: k.Requests, Tokens: k.Tokens, InFlight: k.InFlight}
		}
		s.send(m)
	}
}

func (s *LimitsSync) send(m limitsMsg) {
	s.mu.Lock()
	s.seq++
	m.Replica, m.Epoch, m.Seq = s.node.ReplicaID(), s.node.Epoch(), s.seq
	s.mu.Unlock()
	b, err := json.Marshal(m)
	if err != nil {
		s.node.CountError("limits", err)
		return
	}
	msg := &nats.Msg{Subject: s.subj, Data: b}
	s.node.key.signMsg(msg)
	if err := s.pub.PublishMsg(msg); err != nil {
		s.msgs.WithLabelValues("publish_failed").Inc()
		s.node.CountError("limits", fmt.Errorf("publish: %w", err))
		return
	}
	s.msgs.WithLabelValues("sent").Inc()
}

// onMsg applies one peer's report (the subscription's goroutine).
func (s *LimitsSync) onMsg(msg *nats.Msg) {
	if strings.HasSuffix(msg.Subject, "."+s.node.ReplicaID()) {
		return // our own
	}
	if !s.node.authentic(msg, "limits") {
		s.msgs.WithLabelValues("unauthenticated").Inc()
		return
	}
	var m limitsMsg
	err := json.Unmarshal(msg.Data, &m)
	if err == nil && (m.Replica == "" || !strings.HasSuffix(msg.Subject, "."+m.Replica)) {
		err = fmt.Errorf("replica %q on subject %s", m.Replica, msg.Subject)
	}
	if err == nil && len(m.Keys) > maxLimitEntries {
		err = errors.New("too many keys in one message")
	}
	if err != nil {
		s.msgs.WithLabelValues("invalid").Inc()
		s.node.CountError("limits", fmt.Errorf("from %s: %w", msg.Subject, err))
		return
	}
	s.msgs.WithLabelValues("received").Inc()
	if m.Leave {
		s.lim.ForgetPeer(m.Replica, s.now())
		return
	}
	entries := make([]keylimits.PeerKey, 0, len(m.Keys))
	for _, e := range m.Keys {
		if e.Requests < 0 || e.Tokens < 0 || e.InFlight < 0 {
			continue
		}
		entries = append(entries, keylimits.PeerKey{Name: e.Name, Requests: e.Requests, Tokens: e.Tokens, InFlight: e.InFlight})
	}
	s.lim.ApplyPeer(m.Replica, entries, s.now())
}

// Close tells the peers this replica is leaving (its share returns to them at once), stops
// reporting and unsubscribes. Safe to call more than once.
func (s *LimitsSync) Close() {
	s.closeOnce.Do(func() {
		s.stop()
		<-s.done
		s.send(limitsMsg{Leave: true}) // best effort: peers expire us anyway
		_ = s.sub.Unsubscribe()
	})
}
