package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/cluster/clusterconfig"
)

// Node is one replica's membership in the cluster: its NATS connection (and embedded server,
// if configured), its identity and its health. It is safe for concurrent use.
type Node struct {
	cfg      clusterconfig.Config
	id       string
	epoch    uint64 // drawn at start: a restarted replica is a new publisher to its peers
	log      *slog.Logger
	embedded *embeddedServer
	nc       *nats.Conn
	js       jetstream.JetStream

	connected   atomic.Bool
	disconnects atomic.Uint64
	reconnects  atomic.Uint64
	errs        *prometheus.CounterVec
	key         *fleetKey              // nil: messages neither signed nor checked
	unauth      *prometheus.CounterVec // kind

	mu          sync.Mutex
	lastErr     string
	lastErrAt   time.Time
	onReconnect []func()
}

// Options are what Start needs besides the config.
type Options struct {
	Log        *slog.Logger
	Registerer prometheus.Registerer // optional: kvgate_cluster_* series
}

// Start runs the embedded server (if configured) and connects to NATS. A NATS that is not
// reachable yet is not an error: the connection keeps retrying and the replica runs degraded
// until it succeeds. Only a configuration the embedded server refuses fails Start.
func Start(ctx context.Context, cfg clusterconfig.Config, o Options) (*Node, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if !cfg.Enabled() {
		return nil, errors.New("cluster: not configured (neither nats_url nor embedded_nats.listen)")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	n := &Node{cfg: cfg, id: cfg.ReplicaID, epoch: randomEpoch()}
	if n.id == "" {
		n.id = defaultReplicaID()
	}
	n.log = o.Log.With("component", "cluster", "replica", n.id)
	n.errs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvgate_cluster_errors_total",
		Help: "NATS calls that failed and fell back to local state, by component (bindings, load, snapshot, ...).",
	}, []string{"component"})
	n.unauth = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvgate_cluster_unauthenticated_messages_total",
		Help: "Replica messages dropped because their fleet-key signature was missing, wrong or outside cluster.message_window, by kind (load, approx, limits, binding, pin, snapshot).",
	}, []string{"kind"})
	if cfg.FleetKeyFile != "" {
		k, err := loadFleetKey(cfg.FleetKeyFile, cfg.MessageWindow.D())
		if err != nil {
			return nil, err
		}
		n.key = k
	} else {
		n.log.Warn("cluster.fleet_key_file is not set: replica messages are NOT authenticated; any client that can reach the NATS bus can move routing, rebind sessions and feed index snapshots (set a fleet key on every replica)")
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(n.errs, n.unauth, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvgate_cluster_connected",
			Help: "1 while this replica's NATS connection is up, 0 while it routes on local state only (degraded).",
		}, func() float64 {
			if n.connected.Load() {
				return 1
			}
			return 0
		}))
	}
	urls := cfg.URLs()
	if cfg.EmbeddedNATS.Listen != "" {
		name := cfg.EmbeddedNATS.Name
		if name == "" {
			name = n.id
		}
		e, err := startEmbedded(cfg.EmbeddedNATS, name, cfg.Fleet, n.log)
		if err != nil {
			return nil, err
		}
		n.embedded = e
		if len(urls) == 0 {
			urls = []string{e.clientURL()}
		}
	}
	secOpts, err := connectSecurity(cfg)
	if err != nil {
		n.closeEmbedded()
		return nil, err
	}
	nc, err := nats.Connect(strings.Join(urls, ","), append(secOpts,
		nats.Name("kvgate-"+n.id),
		// The fleet's own inboxes: an embedded user may subscribe to no other replies.
		nats.CustomInboxPrefix(inboxPrefix(cfg.Fleet)),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		// Nothing stale replays after a reconnect: load deltas from before the outage would
		// corrupt peers' views, and the snapshots rebuild them within one load interval.
		nats.ReconnectBufSize(-1),
		nats.RetryOnFailedConnect(true),
		nats.PingInterval(10*time.Second),
		nats.MaxPingsOutstanding(2),
		nats.ConnectHandler(func(*nats.Conn) { n.setConnected(true, "connected") }),
		nats.ReconnectHandler(func(*nats.Conn) {
			n.reconnects.Add(1)
			n.setConnected(true, "reconnected")
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			n.disconnects.Add(1)
			n.setConnected(false, "disconnected")
			if err != nil {
				n.noteErr("connection", err)
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) { n.setConnected(false, "closed") }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { n.noteErr("async", err) }),
	)...)
	if err != nil {
		n.closeEmbedded()
		return nil, fmt.Errorf("cluster: nats connect: %w", err)
	}
	n.nc = nc
	if nc.IsConnected() {
		n.connected.Store(true)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		n.closeEmbedded()
		return nil, fmt.Errorf("cluster: jetstream: %w", err)
	}
	n.js = js
	n.log.Info("cluster node started", "nats", strings.Join(urls, ","), "embedded", n.embedded != nil,
		"connected", nc.IsConnected(), "fleet", cfg.Fleet)
	return n, nil
}

// Authenticated reports whether replica messages are signed and checked with a fleet key.
func (n *Node) Authenticated() bool { return n.key != nil }

// authentic reports whether m carries a valid fleet-key signature (always, without a key);
// a message that does not is counted under kind and noted as the node's last error.
func (n *Node) authentic(m *nats.Msg, kind string) bool {
	err := n.key.checkMsg(m)
	if err == nil {
		return true
	}
	n.rejected(kind, fmt.Errorf("%s on %s: %w", kind, m.Subject, err))
	return false
}

// rejected counts an unauthenticated message of kind.
func (n *Node) rejected(kind string, err error) {
	n.unauth.WithLabelValues(kind).Inc()
	n.noteErr("auth", err)
}

// connectSecurity is the connection's authentication and TLS. With none of cluster.nats_*
// set and an embedded server requiring auth, the replica signs in to its own server as the
// first embedded user (or with its token); with no cluster.tls and an embedded server on TLS,
// it uses the embedded server's files.
func connectSecurity(cfg clusterconfig.Config) ([]nats.Option, error) {
	var o []nats.Option
	e := cfg.EmbeddedNATS
	own := e.Listen != "" && len(cfg.URLs()) == 0
	switch {
	case cfg.NATSUser != "":
		o = append(o, nats.UserInfo(cfg.NATSUser, cfg.NATSPassword))
	case cfg.NATSToken != "":
		o = append(o, nats.Token(cfg.NATSToken))
	case cfg.NATSNKeyFile != "":
		opt, err := nats.NkeyOptionFromSeed(cfg.NATSNKeyFile)
		if err != nil {
			return nil, fmt.Errorf("cluster.nats_nkey_file: %w", err)
		}
		o = append(o, opt)
	case cfg.NATSCreds != "":
		if _, err := os.Stat(cfg.NATSCreds); err != nil {
			return nil, fmt.Errorf("cluster.nats_creds: %w", err)
		}
		o = append(o, nats.UserCredentials(cfg.NATSCreds))
	case own && len(e.Users) > 0:
		o = append(o, nats.UserInfo(e.Users[0].User, e.Users[0].Password))
	case own && e.Token != "":
		o = append(o, nats.Token(e.Token))
	}
	t := cfg.TLS
	if !t.Enabled() && own {
		t = e.TLS
	}
	if t.CAFile != "" {
		o = append(o, nats.RootCAs(t.CAFile))
	}
	if t.CertFile != "" {
		o = append(o, nats.ClientCert(t.CertFile, t.KeyFile))
	}
	return o, nil
}

// Conn is the replica's NATS connection.
func (n *Node) Conn() *nats.Conn { return n.nc }

// JetStream is the JetStream context on Conn.
func (n *Node) JetStream() jetstream.JetStream { return n.js }

// Config is the cluster section the node was started with.
func (n *Node) Config() clusterconfig.Config { return n.cfg }

// ReplicaID names this replica to its peers.
func (n *Node) ReplicaID() string { return n.id }

// Epoch identifies this run of the replica: drawn at start, so peers tell a restarted replica
// from a late message of its previous run.
func (n *Node) Epoch() uint64 { return n.epoch }

// Subject is the fleet's versioned subject for the given tokens:
// kvgate.v1.<fleet>.<token>.<token>...
func (n *Node) Subject(tokens ...string) string {
	return "kvgate.v1." + n.cfg.Fleet + "." + strings.Join(tokens, ".")
}

// Bucket is the fleet's JetStream key-value bucket name for what (e.g. "sessions").
func (n *Node) Bucket(what string) string { return "kvgate-" + n.cfg.Fleet + "-" + what }

// AwaitRoutes waits, at most max and while ctx lasts, until this replica's embedded server
// has a route to a peer; it returns at once without an embedded server or peer routes.
func (n *Node) AwaitRoutes(ctx context.Context, max time.Duration) { n.embedded.awaitRoutes(ctx, max) }

// HasPeerRoutes reports whether this replica runs an embedded server routed to other servers.
func (n *Node) HasPeerRoutes() bool { return n.embedded != nil && n.embedded.peers > 0 }

// Connected reports whether the NATS connection is up.
func (n *Node) Connected() bool { return n.connected.Load() }

// OnReconnect registers f to run (on its own goroutine) after every reconnect: recreate
// buckets, republish snapshots.
func (n *Node) OnReconnect(f func()) {
	n.mu.Lock()
	n.onReconnect = append(n.onReconnect, f)
	n.mu.Unlock()
}

// CountError records a NATS call that failed and fell back to local state.
func (n *Node) CountError(component string, err error) {
	if err == nil {
		return
	}
	n.errs.WithLabelValues(component).Inc()
	n.noteErr(component, err)
}

// Status is the node's health as /health and /debug/workers show it.
type Status struct {
	ReplicaID   string `json:"replica_id"`
	Fleet       string `json:"fleet"`
	Connected   bool   `json:"connected"`
	Degraded    bool   `json:"degraded"`
	Server      string `json:"server,omitempty"`
	Embedded    bool   `json:"embedded"`
	Disconnects uint64 `json:"disconnects"`
	Reconnects  uint64 `json:"reconnects"`
	LastError   string `json:"last_error,omitempty"`
	LastErrorAt string `json:"last_error_at,omitempty"`
}

// Status reports the node's health; Degraded means NATS is unreachable and the replica routes
// on its own state only.
func (n *Node) Status() Status {
	st := Status{ReplicaID: n.id, Fleet: n.cfg.Fleet, Connected: n.connected.Load(),
		Embedded: n.embedded != nil, Disconnects: n.disconnects.Load(), Reconnects: n.reconnects.Load()}
	st.Degraded = !st.Connected
	if n.nc != nil && st.Connected {
		st.Server = n.nc.ConnectedUrlRedacted()
	}
	n.mu.Lock()
	st.LastError = n.lastErr
	if !n.lastErrAt.IsZero() {
		st.LastErrorAt = n.lastErrAt.UTC().Format(time.RFC3339)
	}
	n.mu.Unlock()
	return st
}

// HealthDetail reports the node for the server's /health and /debug/workers
// (server.HealthDetail).
func (n *Node) HealthDetail() (name string, detail any, degraded bool) {
	st := n.Status()
	return "cluster", st, st.Degraded
}

// Close drains nothing (load and bindings are soft state) and closes the connection, then the
// embedded server.
func (n *Node) Close() {
	if n.nc != nil {
		n.nc.Close()
	}
	n.closeEmbedded()
}

func (n *Node) closeEmbedded() {
	if n.embedded != nil {
		n.embedded.close()
	}
}

func (n *Node) setConnected(up bool, what string) {
	was := n.connected.Swap(up)
	if was != up {
		n.log.Info("nats "+what, "connected", up)
	}
	if up && what == "reconnected" {
		n.mu.Lock()
		fs := append([]func(){}, n.onReconnect...)
		n.mu.Unlock()
		for _, f := range fs {
			go f()
		}
	}
}

func (n *Node) noteErr(component string, err error) {
	n.mu.Lock()
	n.lastErr = component + ": " + err.Error()
	n.lastErrAt = time.Now()
	n.mu.Unlock()
}

func randomEpoch() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	var v uint64
	for _, x := range b {
		v = v<<8 | uint64(x)
	}
	return v | 1 // never 0: 0 means "no epoch" on the wire
}

func defaultReplicaID() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '-'
	}, host)
	var b [4]byte
	_, _ = rand.Read(b[:])
	if host == "" {
		host = "kvgate"
	}
	return host + "-" + hex.EncodeToString(b[:])
}
