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

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/server"
	"github.com/kvgate/kvgate/workers"
)

// runServe loads the config (file, KVGATE_* env, flags), probes the fleet once, then serves
// until ctx ends and shuts down gracefully.
func runServe(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, err := configs.Load(args, os.Getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("invalid configuration:\n  %s", strings.ReplaceAll(err.Error(), "\n", "\n  "))
	}
	log := newLogger(cfg.LogLevel, stderr)

	reg, err := workers.NewRegistry(cfg, log)
	if err != nil {
		return err
	}
	defer reg.Close()
	prom := prometheus.NewRegistry()
	rt, err := buildRouting(ctx, cfg, reg, prom, log)
	if err != nil {
		return fmt.Errorf("invalid configuration:\n  %w", err)
	}
	defer rt.close()
	srv, err := server.New(server.Options{Config: cfg, Registry: reg, Policy: rt.policy, Enricher: rt.enricher,
		Logger: log, Sessions: rt.sessions, Events: rt.events, Metrics: prom})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}

	probeCtx, stopProbes := context.WithCancel(ctx)
	defer stopProbes()
	reg.ProbeAll(probeCtx) // know the fleet before the first request
	go reg.Run(probeCtx)

	log.Info("kvgate listening", "addr", ln.Addr().String(), "model", cfg.Model,
		"policy", rt.policy.Name(), "workers", len(cfg.Workers), "routable", reg.RoutableCount())
	return srv.Serve(ctx, ln)
}

func newLogger(level string, w io.Writer) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level)) // validated by configs
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}
