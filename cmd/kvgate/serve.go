package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/cluster"
	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/server"
)

// runServe loads the config (file, KVGATE_* env, flags), probes the fleet once, then serves
// until ctx ends and shuts down gracefully. With --check-config it only checks the
// configuration (checkConfig).
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	args, check, err := checkConfigFlag(args)
	if err != nil {
		return err
	}
	cfg, err := configs.Load(args, os.Getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if check {
		return checkConfig(cfg, err, stdout, stderr)
	}
	if err != nil {
		return fmt.Errorf("invalid configuration:\n  %s", strings.ReplaceAll(err.Error(), "\n", "\n  "))
	}
	log := newLogger(cfg.LogLevel, cfg.LogFormat, stderr)

	prom := prometheus.NewRegistry()
	var details []server.HealthDetail
	var node *cluster.Node
	if cfg.Cluster.Enabled() {
		if node, err = cluster.Start(ctx, cfg.Cluster, cluster.Options{Log: log, Registerer: prom}); err != nil {
			return err
		}
		defer node.Close()
		details = append(details, node)
	}
	ps, err := buildPools(ctx, cfg, prom, log, node)
	if err != nil {
		return fmt.Errorf("invalid configuration:\n  %w", err)
	}
	defer ps.close()
	details = append(details, ps.healthDetails()...)
	srv, err := server.New(server.Options{Config: cfg, Pools: ps.serverPools(), Logger: log, Metrics: prom,
		Details: details, Readiness: ps.readiness()})
	if err != nil {
		return err
	}
	ps.forgetRemovedWorkers(srv)
	if lim := srv.KeyLimiter(); node != nil && lim != nil {
		// The per-key limits hold fleet-wide: each replica spends its share of every bucket.
		ls, err := cluster.StartLimitsSync(ctx, node, lim, prom, log)
		if err != nil {
			return err
		}
		defer ls.Close()
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	var adminLn net.Listener
	if cfg.AdminListen != "" {
		if adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
			ln.Close()
			return fmt.Errorf("admin_listen: %w", err)
		}
		if cfg.AdminToken == "" && !isLoopback(adminLn.Addr()) {
			log.Warn("the admin listener is reachable beyond this host without admin_token; its /debug endpoints reveal routing and cache state",
				"admin_listen", adminLn.Addr().String())
		}
	}

	probeCtx, stopProbes := context.WithCancel(ctx)
	defer stopProbes()
	ps.probe(probeCtx) // know the fleet before the first request

	keys, _ := cfg.ClientAPIKeys() // validated; server.New read them too
	for _, p := range ps.list {
		log.Info("serving model", "model", p.cfg.Model, "aliases", p.cfg.Aliases, "policy", p.rt.dispatcher.Name(),
			"workers", len(p.reg.Workers()), "routable", p.reg.RoutableCount())
	}
	log.Info("kvgate listening", "addr", ln.Addr().String(), "models", len(ps.list),
		"client_keys", len(keys), "routing_headers", cfg.Proxy.ExposeRoutingHeaders)
	if adminLn == nil {
		return srv.Serve(ctx, ln)
	}
	log.Info("kvgate admin listening", "addr", adminLn.Addr().String(), "token", cfg.AdminToken != "")
	// Either listener failing stops both; on a signal the admin listener stays up while the
	// client listener drains and shuts down, then stops.
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	actx, stopAdmin := context.WithCancel(context.WithoutCancel(ctx))
	defer stopAdmin()
	adminErr := make(chan error, 1)
	go func() {
		err := srv.ServeAdmin(actx, adminLn)
		stop()
		adminErr <- err
	}()
	err = srv.Serve(sctx, ln)
	stopAdmin()
	if aerr := <-adminErr; aerr != nil && err == nil {
		err = fmt.Errorf("admin listener: %w", aerr)
	}
	return err
}

// isLoopback reports whether addr is a loopback IP address.
func isLoopback(addr net.Addr) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

func newLogger(level, format string, w io.Writer) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level)) // validated by configs
	o := &slog.HandlerOptions{Level: l}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, o))
	}
	return slog.New(slog.NewTextHandler(w, o))
}
