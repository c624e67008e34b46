// Command kvbench replays aiperf trace formats (mooncake_trace, Weka / cc-traces agentic traces,
// multi_turn, single_turn) against an OpenAI-compatible endpoint and writes aiperf-style metrics
// (JSON, CSV, per-request JSONL) and an HTML report; `kvbench compare` puts runs side by side.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/bench"
	"github.com/kvgate/kvgate/tokenize"
)

const usage = `kvbench — replay aiperf traces against an OpenAI endpoint

usage:
  kvbench run --url URL --model NAME --tokenizer DIR --trace FILE|DIR --out DIR [flags]
  kvbench compare [--html FILE] [--png FILE] [--title T] RUN.json|RUNDIR ...
  kvbench sweep [--html FILE] [--md FILE] [--title T] USERS:SCALE=RUN.json|RUNDIR ...
  kvbench capacity [--ttft-p90 2s] [--multiples 1,1.5,2] RUN.json|RUNDIR ...
  kvbench overload [--md FILE] [--baseline round_robin] LEVEL=RUN.json|RUNDIR ...

run "kvbench <command> -h" for the flags.
`

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, logger); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "kvbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, logger *slog.Logger) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("missing command")
	}
	switch args[0] {
	case "run":
		return runCmd(ctx, args[1:], stdout, stderr, logger)
	case "compare":
		return compareCmd(args[1:], stdout, stderr)
	case "sweep":
		return sweepCmd(args[1:], stdout, stderr)
	case "capacity":
		return capacityCmd(args[1:], stdout, stderr)
	case "overload":
		return overloadCmd(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

// headerFlags collects repeated -H "Name: value" flags.
type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ", ") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

func runCmd(ctx context.Context, args []string, stdout, stderr io.Writer, logger *slog.Logger) (retErr error) {
	fs := flag.NewFlagSet("kvbench run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "http://127.0.0.1:8000", "base URL of the OpenAI-compatible server")
	model := fs.String("model", "", "model name to send (default: the first id of GET /v1/models)")
	tokDir := fs.String("tokenizer", "", "HF model folder of the served model (tokenizer.json); prompts are checked against it")
	tracePath := fs.String("trace", "", "trace file (or directory of weka traces)")
	api := fs.String("api", "chat", "request format: chat (/v1/chat/completions) | messages (Anthropic /v1/messages) | responses (stateless /v1/responses)")
	format := fs.String("format", "", "mooncake|weka|multi_turn|single_turn (default: detected)")
	blockSize := fs.Int("block-size", 0, "tokens per trace hash_id block (default: mooncake 512, weka from the file)")
	timeScale := fs.Float64("time-scale", 1, "multiply all trace times by X (0.1 = ten times faster)")
	maxReq := fs.Int("max-requests", 0, "stop after N requests (0 = whole trace)")
	out := fs.String("out", "", "output directory (required)")
	mode := fs.String("mode", "fixed", "fixed (trace timestamps) | concurrency | rate")
	conc := fs.Int("concurrency", 0, "session trees in flight (implies --mode concurrency)")
	rate := fs.Float64("request-rate", 0, "sessions started per second (implies --mode rate)")
	sessHdr := fs.String("session-headers", "none", "extra session headers: none|plain (X-Session-ID)|dynamo (X-Dynamo-Session-ID)|both")
	nvext := fs.Bool("nvext-session", false, "add nvext.session_control (bind on every turn, close on the last) to request bodies")
	ignoreEOS := fs.Bool("ignore-eos", true, "send ignore_eos so workers generate max_completion_tokens")
	maxOut := fs.Int("max-output-tokens", 0, "cap max_completion_tokens (0 = as recorded)")
	timeout := fs.Duration("timeout", 10*time.Minute, "per-request timeout")
	label := fs.String("label", "", "run label in reports (default: the --out directory name)")
	policy := fs.String("policy", "", "router policy under test, recorded in the summary")
	verify := fs.Int("verify-blocks", 32, "check this many synthetic blocks against --tokenizer for exact size and stable boundaries")
	quiet := fs.Bool("quiet", false, "no progress display")
	repeat := fs.Int("repeat", 1, "replay every session tree N times as independent users (own hash namespaces)")
	repeatFrom := fs.Int("repeat-first", 0, "number the --repeat copies from this one (copy 0 is the trace itself): processes given disjoint ranges never share prompts")
	stagger := fs.Duration("repeat-stagger", 0, "start copy i of --repeat this much later than copy i-1 (trace time, scaled)")
	capacity := fs.Int("capacity-tokens", 0, "the fleet's whole GPU cache in tokens (workers × num_gpu_blocks × block_size): also report the hit a pooled LRU cache of that size would have had, and the fraction of it the run captured (0 = off)")
	goodTTFT := fs.Duration("goodput-ttft", 2*time.Second, "a successful request counts towards goodput when its TTFT is under this (0 = no goodput)")
	bodiesOut := fs.String("bodies-out", "", "write every request body sent to this file, one JSON object a line (to replay the same prompts elsewhere, e.g. POST /debug/route)")
	var hdrs headerFlags
	fs.Var(&hdrs, "H", `extra request header "Name: value" (repeatable)`)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *tracePath == "" || *out == "" {
		fs.Usage()
		return errors.New("--trace and --out are required")
	}
	apiKind, err := bench.ParseAPI(*api)
	if err != nil {
		return err
	}
	f, err := bench.ParseFormat(*format)
	if err != nil {
		return err
	}
	tr, err := bench.Load(*tracePath, bench.LoadOptions{Format: f, BlockSize: *blockSize})
	if err != nil {
		return err
	}
	if *repeatFrom < 0 {
		return fmt.Errorf("--repeat-first %d: want >= 0", *repeatFrom)
	}
	tr = tr.RepeatFrom(*repeatFrom, *repeat, *stagger)
	synth, enc, err := newSynth(*tokDir, tr.BlockSize)
	if err != nil {
		return err
	}
	if enc != nil && *verify > 0 {
		if err := verifyTrace(tr, synth, enc, *verify); err != nil {
			return fmt.Errorf("prompt synthesis is not exact for %s: %w", *tokDir, err)
		}
	}
	m := bench.Mode(*mode)
	switch {
	case *conc > 0:
		m = bench.ModeConcurrency
	case *rate > 0:
		m = bench.ModeRate
	}
	headers, err := parseHeaders(hdrs)
	if err != nil {
		return err
	}
	if *label == "" {
		*label = filepath.Base(filepath.Clean(*out))
	}
	total := tr.RequestCount()
	if *maxReq > 0 {
		total = min(total, *maxReq)
	}
	logger.Info("replaying", "trace", *tracePath, "format", tr.Format, "sessions", len(tr.Sessions),
		"requests", total, "block_size", tr.BlockSize, "api", apiKind, "mode", m, "time_scale", *timeScale)
	opts := bench.ReplayOptions{URL: *url, Model: *model, API: apiKind, Mode: m, Concurrency: *conc, RequestRate: *rate,
		TimeScale: *timeScale, MaxRequests: *maxReq, MaxOutputTokens: *maxOut, SessionHeaders: *sessHdr,
		NvextSession: *nvext, IgnoreEOS: *ignoreEOS, Timeout: *timeout, APIKey: os.Getenv("OPENAI_API_KEY"), Headers: headers, Logger: logger,
		CapacityBlocks: *capacity / max(tr.BlockSize, 1)}
	if *goodTTFT < 0 {
		return fmt.Errorf("--goodput-ttft %v: want 0 (off) or a duration", *goodTTFT)
	}
	if *capacity < 0 {
		return fmt.Errorf("--capacity-tokens %d: want 0 (off) or a token count", *capacity)
	}
	if *bodiesOut != "" {
		f, err := os.Create(*bodiesOut)
		if err != nil {
			return fmt.Errorf("bodies-out: %w", err)
		}
		defer f.Close()
		tp := http.DefaultTransport.(*http.Transport).Clone()
		tp.MaxIdleConnsPerHost = 256 // as bench.Replay's own client
		bl := newBodyLog(tp, f)
		defer func() {
			if ferr := bl.Flush(); ferr != nil && retErr == nil {
				retErr = ferr
			}
		}()
		opts.Client = &http.Client{Transport: bl}
	}
	var prog *bench.Progress
	if !*quiet {
		prog = bench.NewProgress(stderr, *label, total)
		opts.OnRecord = prog.Record
	}
	res, err := bench.Replay(ctx, tr, synth, opts)
	if prog != nil {
		prog.Stop()
	}
	if err != nil && res == nil {
		return err
	}
	cfg := bench.InputConfig{URL: *url, Model: opts.Model, Trace: *tracePath, Format: tr.Format, API: apiKind, BlockSize: tr.BlockSize,
		Mode: m, Concurrency: *conc, RequestRate: *rate, TimeScale: *timeScale, MaxRequests: *maxReq,
		SessionHeaders: *sessHdr, Policy: *policy, Repeat: *repeat, GoodputTTFTMS: float64(*goodTTFT) / float64(time.Millisecond)}
	if m == bench.ModeFixed && (*maxReq == 0 || *maxReq >= tr.RequestCount()) {
		cfg.OfferedRequestRate = tr.OfferedRate(total, *timeScale)
	}
	sum := bench.Summarize(*label, cfg, res)
	if werr := bench.WriteOutputs(*out, sum, res); werr != nil {
		return werr
	}
	runData, lerr := bench.LoadRun(*out)
	if lerr != nil {
		return lerr
	}
	if rerr := writeReports(*out, "kvbench: "+*label, []*bench.Run{runData}); rerr != nil {
		return rerr
	}
	if cerr := bench.WriteCompare(stdout, []*bench.Run{runData}); cerr != nil {
		return cerr
	}
	fmt.Fprintf(stdout, "results: %s  report: %s\n", filepath.Join(*out, bench.SummaryFile), filepath.Join(*out, bench.ReportFile))
	if err != nil {
		return fmt.Errorf("replay interrupted: %w", err)
	}
	return nil
}

func newSynth(dir string, blockSize int) (*bench.Synth, bench.TokenEncoder, error) {
	if dir == "" {
		s, err := bench.NewSynth(nil, blockSize)
		return s, nil, err
	}
	tk, err := tokenize.Load(dir, tokenize.Options{})
	if err != nil {
		return nil, nil, fmt.Errorf("load tokenizer: %w", err)
	}
	s, err := bench.NewSynth(tk, blockSize)
	return s, tk, err
}

// verifyTrace checks the first n blocks of the first session (and every child namespace)
// with the real tokenizer: each block exactly blockSize tokens, no merge across boundaries.
func verifyTrace(tr *bench.Trace, s *bench.Synth, enc bench.TokenEncoder, n int) error {
	for _, sess := range tr.Sessions {
		for _, t := range sess.Turns {
			if len(t.HashIDs) > 0 {
				return s.CheckExact(enc, sess.Namespace, t.HashIDs[:min(n, len(t.HashIDs))])
			}
		}
	}
	return nil
}

func parseHeaders(hs []string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, h := range hs {
		k, v, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("bad header %q: want \"Name: value\"", h)
		}
		k = strings.TrimSpace(k)
		out[k] = append(out[k], strings.TrimSpace(v))
	}
	return out, nil
}

func writeReports(dir, title string, runs []*bench.Run) error {
	return writeReportFiles(filepath.Join(dir, bench.ReportFile), filepath.Join(dir, bench.PNGFile), title, runs)
}

func writeReportFiles(htmlPath, pngPath, title string, runs []*bench.Run) error {
	if htmlPath != "" {
		if err := writeWith(htmlPath, func(w io.Writer) error { return bench.WriteReport(w, title, runs) }); err != nil {
			return err
		}
	}
	if pngPath != "" {
		return writeWith(pngPath, func(w io.Writer) error { return bench.WritePNG(w, runs) })
	}
	return nil
}

func writeWith(path string, fill func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if err := fill(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	return nil
}

func compareCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	htmlOut := fs.String("html", "", "also write the comparison HTML report here")
	pngOut := fs.String("png", "", "also write the headline chart PNG here")
	title := fs.String("title", "kvbench policy comparison", "report title")
	if err := fs.Parse(flagsFirst(args, map[string]bool{})); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("compare needs at least one summary JSON (or run directory)")
	}
	var runs []*bench.Run
	for _, p := range fs.Args() {
		r, err := bench.LoadRun(p)
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	if err := bench.WriteCompare(stdout, runs); err != nil {
		return err
	}
	if err := writeReportFiles(*htmlOut, *pngOut, *title, runs); err != nil {
		return err
	}
	if *htmlOut != "" {
		fmt.Fprintf(stdout, "report: %s\n", *htmlOut)
	}
	return nil
}

// sweepCmd draws a load sweep: each argument is one run (its label is the policy) at load
// level USERS:SCALE. It prints the markdown table and optionally writes HTML and markdown.
func sweepCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench sweep", flag.ContinueOnError)
	fs.SetOutput(stderr)
	htmlOut := fs.String("html", "", "also write the sweep HTML report (curves against load) here")
	mdOut := fs.String("md", "", "also write the markdown table here")
	title := fs.String("title", "kvbench load sweep", "report title")
	if err := fs.Parse(flagsFirst(args, map[string]bool{})); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("sweep needs at least one USERS:SCALE=RUN argument")
	}
	var points []bench.SweepPoint
	for _, a := range fs.Args() {
		level, path, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("sweep argument %q: want USERS:SCALE=RUN", a)
		}
		users, scale, err := bench.ParseSweepLevel(level)
		if err != nil {
			return err
		}
		r, err := bench.LoadRun(path)
		if err != nil {
			return err
		}
		points = append(points, bench.SweepPoint{Users: users, TimeScale: scale, Run: r})
	}
	if err := bench.WriteSweepMarkdown(stdout, points); err != nil {
		return err
	}
	if *mdOut != "" {
		if err := writeWith(*mdOut, func(w io.Writer) error { return bench.WriteSweepMarkdown(w, points) }); err != nil {
			return err
		}
	}
	if *htmlOut != "" {
		if err := writeWith(*htmlOut, func(w io.Writer) error { return bench.WriteSweepReport(w, *title, points) }); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "report: %s\n", *htmlOut)
	}
	return nil
}

// flagsFirst moves flags (and their values) before positional arguments, so that
// "compare a.json b.json --html r.html" works with the standard flag package.
func flagsFirst(args []string, boolFlags map[string]bool) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if strings.HasPrefix(a, "-") && len(a) > 1 {
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if !strings.Contains(name, "=") && !boolFlags[name] && i+1 < len(args) {
				flags = append(flags, args[i+1])
				i++
			}
			continue
		}
		pos = append(pos, a)
	}
	return append(flags, pos...)
}
