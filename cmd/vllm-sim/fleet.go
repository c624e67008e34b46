package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/sim"
	"github.com/kvgate/kvgate/tokenize"
)

// runFleet starts N workers in one process on consecutive HTTP ports, each with its own KV
// event and replay endpoints, and writes the matching kvgate config.
func runFleet(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("vllm-sim fleet", flag.ContinueOnError)
	n := fs.Int("workers", 2, "number of workers")
	basePort := fs.Int("base-port", 8101, "HTTP port of worker 0; worker i uses base-port+i")
	eventsBase := fs.Int("events-base-port", 5557, "PUB port of worker 0; worker i uses events-base-port+10*i, replay +5")
	noEvents := fs.Bool("no-kv-events", false, "run the fleet without KV events")
	out := fs.String("config-out", "", "write the kvgate config YAML here (default: stdout)")
	listen := fs.String("gateway-listen", "127.0.0.1:8000", "listen address written into the config")
	policy := fs.String("router-policy", "round_robin", "router policy written into the config")
	var o sim.Options
	var c serveConfig
	finish := newServeFlags(fs, &o, &c)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := finish(); err != nil {
		return err
	}
	if *n < 1 {
		return fmt.Errorf("--workers must be >= 1, got %d", *n)
	}
	if o.DataParallelSize > 5 {
		return fmt.Errorf("fleet supports --data-parallel-size up to 5 (port layout), got %d", o.DataParallelSize)
	}
	host := c.host
	if host == "" {
		host = "127.0.0.1"
	}
	logger, err := newLogger(c.logLevel)
	if err != nil {
		return err
	}
	o.Logger = logger
	warnSpeedup(logger, o.Speedup)
	if tok := firstNonEmpty(o.Tokenizer, o.Model); tok != "" {
		t, err := tokenize.Load(tok, tokenize.Options{})
		if err != nil {
			return err
		}
		o.Tokenize = t // one tokenizer shared by every worker of the fleet
	}
	errc := make(chan error, *n)
	var servers []*http.Server
	var workers []*sim.Worker
	defer func() {
		for _, s := range servers {
			_ = s.Close()
		}
		for _, w := range workers {
			_ = w.Close()
		}
	}()
	for i := range *n {
		wo := o
		if _, ok := os.LookupEnv("PYTHONHASHSEED"); !ok {
			wo.Encoding.HashSeed += uint64(i+1) * 0xbf58476d1ce4e5b9 // separate processes in vLLM: separate ids
		}
		pub := *eventsBase + 10*i
		if !*noEvents {
			// --kv-events-config's other keys (topic, buffer_steps, hwm, ...) apply to every
			// worker; the fleet numbers the endpoints.
			wo.KVEvents = o.KVEvents
			wo.KVEvents.EnableKVCacheEvents, wo.KVEvents.Publisher = true, "zmq"
			wo.KVEvents.Endpoint = fmt.Sprintf("tcp://*:%d", pub)
			wo.KVEvents.ReplayEndpoint = fmt.Sprintf("tcp://*:%d", pub+5)
		}
		w, err := sim.New(wo)
		if err != nil {
			return fmt.Errorf("worker %d: %w", i, err)
		}
		workers = append(workers, w)
		addr := net.JoinHostPort(host, strconv.Itoa(*basePort+i))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("worker %d: listen %s: %w", i, addr, err)
		}
		srv := &http.Server{Handler: w.Handler(), ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, srv)
		go func() { errc <- srv.Serve(ln) }()
		logger.Info("vllm-sim fleet worker", "i", i, "url", "http://"+addr, "kv_events", pub, "replay", pub+5)
	}
	yaml := fleetConfig(fleetLayout{o: o, host: host, n: *n, basePort: *basePort, eventsBase: *eventsBase,
		events: !*noEvents, listen: *listen, policy: *policy})
	if *out == "" {
		fmt.Print(yaml)
	} else if err := os.WriteFile(*out, []byte(yaml), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", *out, err)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("serve: %w", err)
	}
}

// fleetLayout is where the fleet's workers listen.
type fleetLayout struct {
	o                       sim.Options
	host                    string
	n, basePort, eventsBase int
	events                  bool
	listen, policy          string
}

// fleetConfig renders the kvgate config (configs/kvgate.yaml schema) for a fleet.
func fleetConfig(l fleetLayout) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# written by vllm-sim fleet --workers %d\nlisten: %s\nmodel: %s\n", l.n, l.listen, quoteYAML(servedName(l.o)))
	if tok := firstNonEmpty(l.o.Tokenizer, l.o.Model); tok != "" {
		if abs, err := filepath.Abs(tok); err == nil {
			tok = abs // the config is read from wherever kvgate runs
		}
		fmt.Fprintf(&b, "tokenizer: %s\n", quoteYAML(tok))
	}
	fmt.Fprintf(&b, "block_size: %d\nworkers:\n", max(l.o.BlockSize, 1))
	for i := range l.n {
		fmt.Fprintf(&b, "  - url: http://%s\n", net.JoinHostPort(l.host, strconv.Itoa(l.basePort+i)))
		if l.events {
			pub := l.eventsBase + 10*i
			fmt.Fprintf(&b, "    kv_events: tcp://%s:%d\n    replay: tcp://%s:%d\n", l.host, pub, l.host, pub+5)
		}
		fmt.Fprintf(&b, "    dp_size: %d\n", max(l.o.DataParallelSize, 1))
	}
	fmt.Fprintf(&b, "router:\n  policy: %s\n", l.policy)
	return b.String()
}

func servedName(o sim.Options) string {
	return firstNonEmpty(o.ServedModelName, o.Model, "sim-model")
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// quoteYAML quotes a scalar for YAML.
func quoteYAML(s string) string { return strconv.Quote(s) }
