// Command vllm-sim is a simulated vLLM worker: vLLM's OpenAI server surface, a paged prefix
// cache, KV events on ZMQ and a timing model, for testing and benchmarking kvgate without GPUs.
//
//	vllm-sim [serve] [MODEL_DIR] --port 8101 --served-model-name Qwen/Qwen3-0.6B \
//	    --kv-events-config '{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}'
//	vllm-sim fleet --workers 3 --config-out fleet.yaml
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/sim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "vllm-sim:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "fleet" {
		return runFleet(ctx, args[1:])
	}
	if len(args) > 0 && args[0] == "serve" {
		args = args[1:]
	}
	var model string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		model, args = args[0], args[1:] // vllm serve MODEL
	}
	var o sim.Options
	var c serveConfig
	fs := flag.NewFlagSet("vllm-sim", flag.ContinueOnError)
	finish := newServeFlags(fs, &o, &c)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := finish(); err != nil {
		return err
	}
	if model != "" && o.Model == "" {
		o.Model = model
	}
	logger, err := newLogger(c.logLevel)
	if err != nil {
		return err
	}
	o.Logger = logger
	warnSpeedup(logger, o.Speedup)
	return serve(ctx, o, net.JoinHostPort(c.host, strconv.Itoa(c.port)), logger)
}

// warnSpeedup says, when speedup > 1, that simulated GPU time runs faster than wall time while
// a gateway's CPU time does not: its overheads then weigh speedup times more than in front of
// real workers, and wall-clock latencies are speedup times shorter than the modelled ones.
func warnSpeedup(logger *slog.Logger, speedup float64) {
	if speedup > 1 {
		logger.Warn("speedup > 1 compresses simulated GPU time relative to gateway CPU time; "+
			"gateway overheads weigh that much more than against real workers", "speedup", speedup)
	}
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

// serve runs one worker until ctx ends.
func serve(ctx context.Context, o sim.Options, addr string, logger *slog.Logger) error {
	w, err := sim.New(o)
	if err != nil {
		return err
	}
	defer w.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: w.Handler(), ReadHeaderTimeout: 10 * time.Second}
	attrs := []any{"addr", ln.Addr().String(), "model", o.ServedModelName}
	for _, ep := range w.EventEndpoints() {
		attrs = append(attrs, "kv_events_rank"+strconv.Itoa(ep.DPRank), ep.Endpoint, "replay_rank"+strconv.Itoa(ep.DPRank), ep.Replay)
	}
	logger.Info("vllm-sim serving", attrs...)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
