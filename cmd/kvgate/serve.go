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
	"github.com/kvgate/kvgate/workers"
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

	reg, err := workers.NewRegistry(cfg, log)
	if err != nil {
		return err
	}
	defer reg.Close()
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
	rt, err := buildRouting(ctx, cfg, reg, prom, log, node)
	if err != nil {
		return fmt.Errorf("invalid configuration:\n  %w", err)
	}
	defer rt.close()
	var readiness []server.ReadinessCheck
	if rt.bindings != nil {
		details = append(details, rt.bindings)
		readiness = append(readiness, rt.bindings) // a deleted bucket holds the replica out until recreated
	}
	disc, err := newDiscovery(cfg, reg, prom, log)
	if err != nil {
		return fmt.Errorf("invalid configuration:\n  %w", err)
	}
	if disc != nil {
		readiness = append(readiness, disc)
	}
	if rt.events != nil {
		readiness = append(readiness, rt.events) // a subscription silent while its worker serves
	}
	srv, err := server.New(server.Options{Config: cfg, Registry: reg, Router: rt.dispatcher, Enricher: rt.enricher,
		Logger: log, Metrics: prom, Details: details, Readiness: readiness})
	if err != nil {
		return err
	}
	forgetRemovedWorkers(reg, srv)
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
	reg.ProbeAll(probeCtx) // know the fleet before the first request
	go reg.Run(probeCtx)
	if disc != nil {
		// Started once every membership listener is registered (routing, server metrics).
		go disc.Run(probeCtx)
	}

	keys, _ := cfg.ClientAPIKeys() // validated; server.New read them too
	log.Info("kvgate listening", "addr", ln.Addr().String(), "model", cfg.Model,
		"policy", rt.dispatcher.Name(), "workers", len(cfg.Workers), "routable", reg.RoutableCount(),
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
