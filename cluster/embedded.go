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
func startEmbedded(cfg clusterconfig.Embedded, name string, log *slog.Logger) (*embeddedServer, error) {
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

func splitHostPort(hp string) (string, int, error) {
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %w", hp, err)
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
	unspecified := host == "" || (ip != nil && ip.IsUnspecified())
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
