package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/kvgate/kvgate/cluster/clusterconfig"
)

// embeddedServer is a NATS server (JetStream on) running inside this process.
type embeddedServer struct {
	srv     *server.Server
	tempDir string // removed at close when the store dir was drawn by us
	peers   int    // routes configured to other servers
}

// startEmbedded starts the server cfg describes and waits until it accepts clients (and, with
// routes, until its route listener is up).
func startEmbedded(cfg clusterconfig.Embedded, name, fleet string, log *slog.Logger) (*embeddedServer, error) {
	host, port, err := splitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("cluster.embedded_nats.listen: %w", err)
	}
	e := &embeddedServer{}
	store := cfg.StoreDir
	if store == "" {
		if store, err = os.MkdirTemp("", "kvgate-nats-"); err != nil {
			return nil, fmt.Errorf("cluster.embedded_nats: store dir: %w", err)
		}
		e.tempDir = store
	}
	opts := &server.Options{
		ServerName:             name,
		Host:                   host,
		Port:                   port,
		NoLog:                  true,
		NoSigs:                 true,
		JetStream:              true,
		StoreDir:               store,
		JetStreamMaxMemory:     int64(cfg.MaxMemory),
		JetStreamMaxStore:      int64(cfg.MaxMemory),
		DisableJetStreamBanner: true,
	}
	if err := embeddedSecurity(opts, cfg, fleet); err != nil {
		return nil, err
	}
	warnExposure(log, "cluster.embedded_nats.listen", host, cfg.Auth(), cfg.TLS.CertFile != "")
	if cfg.ClusterListen != "" {
		ch, cp, err := splitHostPort(cfg.ClusterListen)
		if err != nil {
			return nil, fmt.Errorf("cluster.embedded_nats.cluster_listen: %w", err)
		}
		peers := 0
		var routes []*url.URL
		for _, r := range cfg.Routes {
			u, err := url.Parse("nats-route://" + strings.TrimPrefix(r, "nats-route://"))
			if err != nil {
				return nil, fmt.Errorf("cluster.embedded_nats.routes: %q: %w", r, err)
			}
			routes = append(routes, u)
			if !isOwnRoute(ch, cp, u) {
				peers++
			}
		}
		e.peers = peers
		if peers > 0 {
			opts.Cluster = server.ClusterOpts{Name: "kvgate", Host: ch, Port: cp}
			opts.Routes = routes
			if cfg.TLS.CertFile != "" {
				// Routes are mutually authenticated by the CA when one is given.
				tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile,
					CaFile: cfg.TLS.CAFile, Verify: cfg.TLS.CAFile != ""})
				if err != nil {
					return nil, fmt.Errorf("cluster.embedded_nats.tls (routes): %w", err)
				}
				// A server dials its routes as a TLS client: it checks the peer's certificate
				// against the same CA (GenTLSConfig sets it only for verifying clients).
				tc.RootCAs = tc.ClientCAs
				opts.Cluster.TLSConfig, opts.Cluster.TLSTimeout = tc, 2
			}
			warnExposure(log, "cluster.embedded_nats.cluster_listen", ch, cfg.TLS.CAFile != "", cfg.TLS.CertFile != "")
		} else {
			// A NATS cluster of this server alone never gets a JetStream meta leader: with no
			// routes JetStream refuses to start ("JetStream cluster requires configured
			// routes", nats-server server/jetstream_cluster.go), with a route to itself only its
			// raft groups wait for a remote forever (server/raft.go, "Waiting for routing to be
			// established"). One seed is a single server, so it runs as one.
			log.Warn("cluster.embedded_nats.routes lists no other server: the embedded NATS server runs standalone, without its route listener",
				"cluster_listen", cfg.ClusterListen, "routes", strings.Join(cfg.Routes, ","))
		}
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		e.removeTemp()
		return nil, fmt.Errorf("cluster: embedded NATS server: %w", err)
	}
	srv.SetLoggerV2(natsLogger{log: log.With("component", "nats-server")}, false, false, false)
	e.srv = srv
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		e.close()
		return nil, errors.New("cluster: embedded NATS server not ready after 10s")
	}
	return e, nil
}

// clientURL is the URL clients of this process use to reach the embedded server.
func (e *embeddedServer) clientURL() string { return e.srv.ClientURL() }

func (e *embeddedServer) close() {
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
	}
	e.removeTemp()
}

func (e *embeddedServer) removeTemp() {
	if e.tempDir != "" {
		_ = os.RemoveAll(e.tempDir)
	}
}

// embeddedSecurity sets the server's client authentication and TLS from cfg: users get the
// fleet's permissions (fleetPermissions), a token full access.
func embeddedSecurity(opts *server.Options, cfg clusterconfig.Embedded, fleet string) error {
	for _, u := range cfg.Users {
		opts.Users = append(opts.Users, &server.User{Username: u.User, Password: u.Password, Permissions: fleetPermissions(fleet)})
	}
	opts.Authorization = cfg.Token
	if cfg.TLS.CertFile != "" {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile,
			CaFile: cfg.TLS.CAFile, Verify: cfg.TLS.CAFile != ""})
		if err != nil {
			return fmt.Errorf("cluster.embedded_nats.tls: %w", err)
		}
		opts.TLSConfig, opts.TLS, opts.TLSVerify, opts.TLSTimeout = tc, true, cfg.TLS.CAFile != "", 2
	}
	return nil
}

// warnExposure warns when a listener is reachable beyond this host without authentication
// (loudly: anyone on the network can then join the bus) or without TLS (traffic in clear).
func warnExposure(log *slog.Logger, key, host string, auth, tls bool) {
	ip := net.ParseIP(host)
	if host == "localhost" || ip != nil && ip.IsLoopback() {
		return
	}
	if !auth {
		log.Error("SECURITY: "+key+" listens beyond this host WITHOUT authentication: anyone who can reach it can read and steer the fleet's routing state; set cluster.embedded_nats.users (and tls with ca_file for routes) or bind 127.0.0.1",
			"addr", host)
	} else if !tls {
		log.Warn(key+" listens beyond this host without TLS: credentials and routing state cross the network in clear; set cluster.embedded_nats.tls",
			"addr", host)
	}
}

// inboxPrefix is the fleet's reply-subject prefix: the embedded users may subscribe only to
// their fleet's inboxes.
func inboxPrefix(fleet string) string { return "_INBOX_kvgate." + fleet }

// fleetPermissions is what a user of fleet may do: the fleet's subjects
// (kvgate.v1.<fleet>.>), its inboxes, and on its two buckets (KV_kvgate-<fleet>-sessions and
// -pins, nats.go jetstream/kv.go) the writes and the JetStream API calls the replicas make:
// account info, stream create/update/info (CreateOrUpdateKeyValue), message and direct get,
// ordered-consumer create/delete/info and flow control (the watch), and the stream
// advisories (leader elected, deleted). Not stream delete or purge: a client with these
// credentials cannot delete the fleet's buckets. Subjects from nats-server server/jetstream_api.go.
func fleetPermissions(fleet string) *server.Permissions {
	pub := []string{"kvgate.v1." + fleet + ".>", inboxPrefix(fleet) + ".>", "$JS.API.INFO"}
	sub := []string{"kvgate.v1." + fleet + ".>", inboxPrefix(fleet) + ".>"}
	for _, what := range []string{"sessions", "pins"} {
		b := "kvgate-" + fleet + "-" + what
		st := "KV_" + b
		pub = append(pub, "$KV."+b+".>",
			"$JS.API.STREAM.INFO."+st, "$JS.API.STREAM.CREATE."+st, "$JS.API.STREAM.UPDATE."+st,
			"$JS.API.STREAM.MSG.GET."+st, "$JS.API.DIRECT.GET."+st, "$JS.API.DIRECT.GET."+st+".>",
			"$JS.API.CONSUMER.CREATE."+st, "$JS.API.CONSUMER.CREATE."+st+".>",
			"$JS.API.CONSUMER.DELETE."+st+".>", "$JS.API.CONSUMER.INFO."+st+".>", "$JS.FC."+st+".>")
		sub = append(sub, "$JS.EVENT.ADVISORY.STREAM.*."+st)
	}
	return &server.Permissions{Publish: &server.SubjectPermission{Allow: pub}, Subscribe: &server.SubjectPermission{Allow: sub}}
}

func splitHostPort(hp string) (string, int, error) {
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %w", hp, err)
	}
	if h == "" {
		h = "127.0.0.1" // loopback unless a host is given (nats-server's default is every interface)
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n > 65535 {
		return "", 0, fmt.Errorf("%q: bad port", hp)
	}
	if n == 0 {
		n = -1 // nats-server: 0 means its default port; -1 draws a free one
	}
	return h, n, nil
}

// isOwnRoute reports whether route u points at this server's own route listener (host, port):
// the same port on the same host, a loopback host counting as the same as an unspecified
// listen host. A peer reached by a name of this machine is not recognised (it is a peer).
func isOwnRoute(host string, port int, u *url.URL) bool {
	h, p, err := net.SplitHostPort(u.Host)
	if err != nil || strconv.Itoa(port) != p {
		return false
	}
	if h == host {
		return true
	}
	ip := net.ParseIP(host)
	unspecified := host == "" || (ip != nil && (ip.IsUnspecified() || ip.IsLoopback()))
	rip := net.ParseIP(h)
	return unspecified && (h == "localhost" || (rip != nil && rip.IsLoopback()))
}

// natsLogger routes nats-server's log lines into slog (warnings and errors only; notices at
// debug level).
type natsLogger struct{ log *slog.Logger }

func (l natsLogger) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l natsLogger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l natsLogger) Fatalf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l natsLogger) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l natsLogger) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l natsLogger) Tracef(format string, v ...any)  {}

// awaitRoutes waits, at most max and while ctx lasts, until the server has a route to a peer
// (when any is configured): a replica whose routes are still forming at start would otherwise
// ask its peers for snapshots before they can hear it.
func (e *embeddedServer) awaitRoutes(ctx context.Context, max time.Duration) {
	if e == nil || e.peers == 0 {
		return
	}
	deadline := time.Now().Add(max)
	for e.srv.NumRoutes() == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
}
