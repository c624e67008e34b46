// Package clusterconfig holds the cluster section of the kvgate YAML: how a replica joins the
// NATS system its peers share (an external NATS cluster, or a NATS server embedded in the
// replica) and the bounds of what travels over it. It is a leaf, so configs composes it without
// importing the NATS client.
package clusterconfig

import (
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/confval"
)

// Config is the cluster section. A replica is clustered when NATSURL or EmbeddedNATS.Listen is
// set; with neither (the default) there is one replica and no NATS at all. Every field is used
// as given (zero is a value); start from Default.
type Config struct {
	// NATSURL is the NATS server (or comma-separated servers of one cluster) to connect to;
	// "" with an embedded server connects to that one.
	// Neither set: one replica, no NATS (docs/replicas.md).
	NATSURL string `yaml:"nats_url"`
	// NATSUser and NATSPassword authenticate the connection as a NATS user.
	NATSUser     string `yaml:"nats_user"`
	NATSPassword string `yaml:"nats_password" secret:"true"`
	// NATSToken authenticates the connection with a NATS token.
	NATSToken string `yaml:"nats_token" secret:"true"`
	// NATSNKeyFile is a file holding an NKey seed (SU...) the connection signs in with.
	NATSNKeyFile string `yaml:"nats_nkey_file"`
	// NATSCreds is a NATS credentials file (JWT and NKey seed, decentralised auth).
	// Set at most one of the four ways to sign in (user and password, token, NKey file,
	// credentials file).
	NATSCreds string `yaml:"nats_creds"`
	// TLS encrypts the connection: the CA that signed the servers' certificates, and a client
	// certificate when the servers require one.
	// With an embedded server and none of these set, the embedded server's files are used.
	TLS TLSFiles `yaml:"tls"`
	// EmbeddedNATS runs a NATS server (JetStream on) inside this replica.
	EmbeddedNATS Embedded `yaml:"embedded_nats"`
	// ReplicaID names this replica to its peers; "" draws one at start (host name + random).
	// It may hold letters, digits, - and _.
	ReplicaID string `yaml:"replica_id"`
	// Fleet namespaces every subject and bucket, so several fleets can share one NATS.
	// Subjects are kvgate.v1.<fleet>.… .
	Fleet string `yaml:"fleet"`
	// KVReplicas is the JetStream replication of the session bucket: 1, or 3 on a 3-node
	// (or larger) NATS cluster.
	// It applies to the session and Responses pins buckets.
	KVReplicas int `yaml:"kv_replicas"`
	// SessionTTL is how long a session binding lives after its last use (the bucket's TTL).
	SessionTTL confval.Duration `yaml:"session_ttl"`
	// KVDeadline bounds every session-bucket call on the request path; past it the replica
	// routes on its local state.
	KVDeadline confval.Duration `yaml:"kv_deadline"`
	// LoadInterval is how often a replica publishes its absolute in-flight load (the
	// correction of lost deltas and the liveness signal).
	LoadInterval confval.Duration `yaml:"load_interval"`
	// PeerTimeout is how long a silent peer's load still counts.
	// It must exceed load_interval.
	PeerTimeout confval.Duration `yaml:"peer_timeout"`
	// SnapshotTimeout bounds a cold replica's wait for a peer's index snapshot of a target.
	// Peers that hold a snapshot answer within a fifth of it (docs/replicas.md, "Index warm
	// start").
	SnapshotTimeout confval.Duration `yaml:"snapshot_timeout"`
	// FleetKeyFile holds the fleet's shared secret (at least 32 bytes): every replica message
	// (load, bindings, snapshots) is signed with it (HMAC-SHA256) and unsigned ones dropped.
	// "" signs nothing (compatible with replicas without one; Start warns).
	// Make one with openssl rand -hex 32 and give every replica the same file (docs/replicas.md,
	// "Securing the bus").
	FleetKeyFile string `yaml:"fleet_key_file"`
	// MessageWindow is how far a signed message's time may be from the receiver's clock (or a
	// binding's from the time NATS stored it) before it counts as a replay and is dropped.
	MessageWindow confval.Duration `yaml:"message_window"`
}

// Embedded configures the NATS server a replica may run in its own process.
type Embedded struct {
	// Listen is the client address (host:port) of the embedded server; "" runs none.
	// A host left out is 127.0.0.1; with no nats_url the replica connects to this server.
	Listen string `yaml:"listen"`
	// ClusterListen is the route address (host:port) peers' embedded servers connect to; ""
	// runs a standalone server.
	ClusterListen string `yaml:"cluster_listen"`
	// Routes are the peers' route addresses (host:port, or nats-route://host:port), listing all
	// seeds (this one included is fine).
	// When they name no other server (none, or only this one's cluster_listen) the embedded server
	// runs standalone, without a route listener, since a one-node NATS cluster never gets
	// JetStream.
	Routes []string `yaml:"routes"`
	// Name is the server name (unique per server in a NATS cluster); "" uses the replica id.
	Name string `yaml:"name"`
	// StoreDir is where JetStream keeps its files; "" uses a fresh temporary directory.
	StoreDir string `yaml:"store_dir"`
	// MaxMemory caps JetStream's memory storage.
	MaxMemory confval.ByteSize `yaml:"max_memory"`
	// Users may connect with a password; each may publish and subscribe only to the fleet's
	// subjects, its two buckets and the JetStream API calls on them (no bucket deletion).
	// The replica signs in to its own server as the first user unless nats_user (or another way to
	// sign in) is set.
	Users []User `yaml:"users"`
	// Token lets clients connect with this token (full access to the server; prefer Users).
	Token string `yaml:"token" secret:"true"`
	// TLS serves clients and routes over TLS; with CAFile clients and peer servers must
	// present a certificate that CA signed.
	TLS TLSFiles `yaml:"tls"`
}

// User is one NATS user of the embedded server.
type User struct {
	// User is the NATS user name a client signs in with.
	User string `yaml:"user"`
	// Password is that user's password.
	Password string `yaml:"password" secret:"true"`
}

// TLSFiles are PEM files for a TLS endpoint.
type TLSFiles struct {
	// CAFile is the PEM bundle the peer's certificate must chain to; "" for none.
	CAFile string `yaml:"ca_file"`
	// CertFile is this side's PEM certificate (with KeyFile); "" for none.
	CertFile string `yaml:"cert_file"`
	// KeyFile is the PEM private key of CertFile.
	KeyFile string `yaml:"key_file"`
}

// Enabled reports whether any file is set.
func (t TLSFiles) Enabled() bool { return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" }

// Auth reports whether the embedded server requires clients to authenticate.
func (e Embedded) Auth() bool { return len(e.Users) > 0 || e.Token != "" }

// Default returns the built-in defaults (configs/kvgate.yaml documents the same values).
func Default() Config {
	return Config{
		Fleet:           "default",
		KVReplicas:      1,
		SessionTTL:      confval.Duration(30 * time.Minute),
		KVDeadline:      confval.Duration(25 * time.Millisecond),
		LoadInterval:    confval.Duration(time.Second),
		PeerTimeout:     confval.Duration(3 * time.Second),
		SnapshotTimeout: confval.Duration(5 * time.Second),
		MessageWindow:   confval.Duration(30 * time.Second),
		EmbeddedNATS:    Embedded{MaxMemory: 256 << 20},
	}
}

// Enabled reports whether the replica joins a cluster (a NATS URL or an embedded server).
func (c Config) Enabled() bool {
	return strings.TrimSpace(c.NATSURL) != "" || c.EmbeddedNATS.Listen != ""
}

// tokenRE is what a fleet or replica id may be: one NATS subject token and a valid bucket name.
var tokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Validate returns every invalid key, named relative to the section; configs prefixes them
// with "cluster.".
func (c Config) Validate() error {
	var p confval.Problems
	if !tokenRE.MatchString(c.Fleet) {
		p.Addf("fleet", "%q must be letters, digits, - or _ (it names NATS subjects and a bucket)", c.Fleet)
	}
	if c.ReplicaID != "" && !tokenRE.MatchString(c.ReplicaID) {
		p.Addf("replica_id", "%q must be letters, digits, - or _", c.ReplicaID)
	}
	if c.KVReplicas < 1 || c.KVReplicas > 5 {
		p.Addf("kv_replicas", "must be 1..5 (JetStream's limit), got %d", c.KVReplicas)
	}
	if c.SessionTTL < confval.Duration(time.Second) {
		p.Addf("session_ttl", "must be at least 1s, got %s", c.SessionTTL)
	}
	if c.KVDeadline <= 0 {
		p.Addf("kv_deadline", "must be a positive duration, got %s", c.KVDeadline)
	}
	if c.LoadInterval <= 0 {
		p.Addf("load_interval", "must be a positive duration, got %s", c.LoadInterval)
	}
	if c.PeerTimeout <= c.LoadInterval {
		p.Addf("peer_timeout", "must exceed load_interval (%s), got %s", c.LoadInterval, c.PeerTimeout)
	}
	if c.SnapshotTimeout <= 0 {
		p.Addf("snapshot_timeout", "must be a positive duration, got %s", c.SnapshotTimeout)
	}
	if c.MessageWindow < confval.Duration(time.Second) {
		p.Addf("message_window", "must be at least 1s, got %s", c.MessageWindow)
	}
	for _, u := range splitURLs(c.NATSURL) {
		if !strings.Contains(u, "://") {
			if _, _, err := net.SplitHostPort(u); err != nil {
				p.Addf("nats_url", "%q is not nats://host:port or host:port", u)
			}
		}
	}
	creds := 0
	for _, set := range []bool{c.NATSUser != "" || c.NATSPassword != "", c.NATSToken != "", c.NATSNKeyFile != "", c.NATSCreds != ""} {
		if set {
			creds++
		}
	}
	if creds > 1 {
		p.Addf("nats_user", "set one of nats_user+nats_password, nats_token, nats_nkey_file and nats_creds")
	}
	if (c.NATSUser == "") != (c.NATSPassword == "") {
		p.Addf("nats_password", "nats_user and nats_password go together")
	}
	checkTLS(&p, "tls", c.TLS, false)
	e := c.EmbeddedNATS
	checkTLS(&p, "embedded_nats.tls", e.TLS, true)
	if len(e.Users) > 0 && e.Token != "" {
		p.Addf("embedded_nats.token", "set users or token, not both (NATS allows one)")
	}
	seen := map[string]bool{}
	for i, u := range e.Users {
		k := "embedded_nats.users[" + strconv.Itoa(i) + "]"
		switch {
		case u.User == "" || u.Password == "":
			p.Addf(k, "needs user and password")
		case seen[u.User]:
			p.Addf(k, "user %q listed twice", u.User)
		}
		seen[u.User] = true
	}
	if e.Listen != "" && !hostPort(e.Listen) {
		p.Addf("embedded_nats.listen", "%q is not host:port", e.Listen)
	}
	if e.ClusterListen != "" {
		if e.Listen == "" {
			p.Addf("embedded_nats.cluster_listen", "needs embedded_nats.listen (no embedded server runs without it)")
		} else if !hostPort(e.ClusterListen) {
			p.Addf("embedded_nats.cluster_listen", "%q is not host:port", e.ClusterListen)
		}
	}
	if len(e.Routes) > 0 && e.ClusterListen == "" {
		p.Addf("embedded_nats.routes", "needs embedded_nats.cluster_listen (routes join a NATS cluster)")
	}
	for i, r := range e.Routes {
		if !hostPort(strings.TrimPrefix(r, "nats-route://")) {
			p.Addf("embedded_nats.routes["+strconv.Itoa(i)+"]", "%q is not host:port or nats-route://host:port", r)
		}
	}
	if e.Name != "" && !tokenRE.MatchString(e.Name) {
		p.Addf("embedded_nats.name", "%q must be letters, digits, - or _", e.Name)
	}
	if e.Listen != "" && e.MaxMemory < 1<<20 {
		p.Addf("embedded_nats.max_memory", "must be at least 1MiB, got %d", e.MaxMemory)
	}
	if c.KVReplicas > 1 && e.Listen != "" && e.ClusterListen == "" && strings.TrimSpace(c.NATSURL) == "" {
		p.Addf("kv_replicas", "%d needs a NATS cluster: a standalone embedded server holds one replica", c.KVReplicas)
	}
	return p.Err()
}

// URLs returns the NATS servers to connect to, comma-separated in NATSURL.
func (c Config) URLs() []string { return splitURLs(c.NATSURL) }

func splitURLs(s string) []string {
	var out []string
	for _, u := range strings.Split(s, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

// checkTLS checks a TLS file set: cert and key go together; a server needs them.
func checkTLS(p *confval.Problems, k string, t TLSFiles, server bool) {
	if (t.CertFile == "") != (t.KeyFile == "") {
		p.Addf(k+".cert_file", "cert_file and key_file go together")
	}
	if server && t.CAFile != "" && t.CertFile == "" {
		p.Addf(k+".cert_file", "a TLS server needs cert_file and key_file")
	}
}

func hostPort(s string) bool {
	_, port, err := net.SplitHostPort(s)
	return err == nil && port != ""
}
