package router

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvgate/kvgate/kvkey"
)

// maxMetricsBody bounds how much of one /metrics response is read.
const maxMetricsBody = 8 << 20

// noEngine keys values that carry no engine (DP rank) label.
const noEngine = -1

// maxMetricsLine bounds one line of a /metrics body; a longer line fails the read.
const maxMetricsLine = 1 << 20

// wantedMetric reports whether name is one of the vLLM families ParseWorkerMetrics reads.
func wantedMetric(name string) bool {
	switch name {
	case "vllm:num_requests_running", "vllm:num_requests_waiting",
		"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cache_config_info",
		"process_start_time_seconds",
		"vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
		"vllm:request_prefill_time_seconds_sum", "vllm:request_prefill_time_seconds_count",
		"vllm:iteration_tokens_total_sum", "vllm:iteration_tokens_total_count",
		"vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count",
		"vllm:time_per_output_token_seconds_sum", "vllm:time_per_output_token_seconds_count",
		"vllm:request_prefill_kv_computed_tokens_sum", "vllm:request_prefill_kv_computed_tokens_count":
		return true
	}
	return false
}

// ParseWorkerMetrics reads a vLLM /metrics body in the Prometheus text format and returns the
// load figures per DP rank, keyed by the `engine` label (noEngine, -1, when absent). Counts of
// the same rank under different label sets (e.g. several model names) are summed; KV usage takes
// the maximum. Both vllm:kv_cache_usage_perc and the older vllm:gpu_cache_usage_perc are read,
// and process_start_time_seconds (prometheus_client's process collector) to notice restarts,
// and the _sum/_count of the TTFT, prefill-time, iteration-tokens, inter-token-latency (and its
// deprecated name time_per_output_token) and prefill-computed-tokens histograms (Timing).
//
// Only the sample lines of those families are handed to the Prometheus text parser
// (github.com/prometheus/common/expfmt), without their HELP and TYPE comments, so the many
// histograms of a vLLM page cost no parsing and one malformed sample is skipped rather than
// hiding the rest. A body that cannot be read (a failing reader, a line over 1 MiB) is an error.
func ParseWorkerMetrics(r io.Reader) (map[int]WorkerMetrics, error) {
	var samples [][]byte
	sc := bufio.NewScanner(io.LimitReader(r, maxMetricsBody))
	sc.Buffer(make([]byte, 0, 64<<10), maxMetricsLine)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if i := bytes.IndexAny(line, "{ \t"); i > 0 && wantedMetric(string(line[:i])) {
			s := make([]byte, len(line)+1) // the scanner reuses line's bytes
			copy(s, line)
			s[len(line)] = '\n'
			samples = append(samples, s)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	out := make(map[int]WorkerMetrics)
	parser := expfmt.NewTextParser(model.LegacyValidation) // vLLM's names are legacy ones (vllm:...)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(bytes.Join(samples, nil)))
	if err == nil {
		addMetricFamilies(out, families)
		return out, nil
	}
	// Some sample is malformed: parse line by line and skip the bad ones.
	for _, s := range samples {
		if families, err := parser.TextToMetricFamilies(bytes.NewReader(s)); err == nil {
			addMetricFamilies(out, families)
		}
	}
	return out, nil
}

// addMetricFamilies adds the samples of families (parsed without TYPE lines, so untyped) to out.
func addMetricFamilies(out map[int]WorkerMetrics, families map[string]*dto.MetricFamily) {
	for name, mf := range families {
		for _, metric := range mf.GetMetric() {
			value := metric.GetUntyped().GetValue()
			rank, blocks := noEngine, ""
			for _, lp := range metric.GetLabel() {
				switch lp.GetName() {
				case "engine":
					if n, err := strconv.Atoi(lp.GetValue()); err == nil && n >= 0 {
						rank = n
					} else {
						rank = noEngine
					}
				case "num_gpu_blocks":
					blocks = lp.GetValue()
				}
			}
			m := out[rank]
			switch name {
			case "vllm:num_requests_running":
				m.Running += value
			case "vllm:num_requests_waiting":
				m.Waiting += value
			case "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc":
				m.KVUsage = max(m.KVUsage, value)
			case "vllm:cache_config_info":
				if n, err := strconv.Atoi(blocks); err == nil {
					m.NumGPUBlocks = n
				}
			case "process_start_time_seconds":
				m.StartTime = max(m.StartTime, value)
			case "vllm:time_to_first_token_seconds_sum":
				m.Timing.TTFTSum += value
			case "vllm:time_to_first_token_seconds_count":
				m.Timing.TTFTCount += value
			case "vllm:request_prefill_time_seconds_sum":
				m.Timing.PrefillSum += value
			case "vllm:request_prefill_time_seconds_count":
				m.Timing.PrefillCount += value
			case "vllm:iteration_tokens_total_sum":
				m.Timing.IterTokensSum += value
			case "vllm:iteration_tokens_total_count":
				m.Timing.Iterations += value
			case "vllm:inter_token_latency_seconds_sum":
				m.Timing.ITLSum += value
			case "vllm:inter_token_latency_seconds_count":
				m.Timing.ITLCount += value
			case "vllm:time_per_output_token_seconds_sum":
				m.Timing.TPOTSum += value
			case "vllm:time_per_output_token_seconds_count":
				m.Timing.TPOTCount += value
			case "vllm:request_prefill_kv_computed_tokens_sum":
				m.Timing.ComputedSum += value
			case "vllm:request_prefill_kv_computed_tokens_count":
				m.Timing.ComputedCount += value
			}
			out[rank] = m
		}
	}
}

// FeedMetrics applies one /metrics body of worker to its targets (the given DP ranks). Values
// with an engine label go to that rank; values without one are the worker's totals, split
// evenly over its ranks (KV usage applies to each as is).
func (lt *LoadTracker) FeedMetrics(worker string, ranks []int, body io.Reader) error {
	_, err := lt.feedMetrics(worker, ranks, body, lt.now(), nil)
	return err
}

// feedMetrics is FeedMetrics for a body requested at sent, with each rank's counters marked
// then (nil: now). It returns the worker's process_start_time_seconds (0 when absent).
func (lt *LoadTracker) feedMetrics(worker string, ranks []int, body io.Reader, sent time.Time, marks map[int]metricsMark) (start float64, err error) {
	parsed, err := ParseWorkerMetrics(body)
	if err != nil {
		return 0, fmt.Errorf("worker %s: %w", worker, err)
	}
	for _, m := range parsed {
		start = max(start, m.StartTime)
	}
	shared, hasShared := parsed[noEngine]
	for _, r := range ranks {
		m, ok := parsed[r]
		if !ok && !hasShared {
			continue
		}
		if !ok {
			n := float64(len(ranks))
			m = WorkerMetrics{Running: shared.Running / n, Waiting: shared.Waiting / n,
				KVUsage: shared.KVUsage, NumGPUBlocks: shared.NumGPUBlocks, Timing: shared.Timing.scaled(1 / n)}
		}
		if m.StartTime == 0 {
			m.StartTime = shared.StartTime // a process metric: no engine label
		}
		m.At, m.mark = sent, marks[r]
		lt.UpdateMetrics(kvkey.Target{Worker: worker, DPRank: r}, m)
	}
	return start, nil
}

// Scraper polls each worker's /metrics and feeds the load tracker.
type Scraper struct {
	Tracker  *LoadTracker
	Client   *http.Client
	Interval time.Duration
	// Targets lists the targets to scrape; it is called on every round so the fleet may change.
	Targets func() []kvkey.Target
	Log     *slog.Logger
	// OnRestart, when set, hears a worker whose process_start_time_seconds changed between two
	// scrapes: the process restarted, whether or not its /health ever failed. It is called from
	// the scrape's goroutine.
	OnRestart func(worker string)

	mu      sync.Mutex
	started map[string]float64 // worker → the process_start_time_seconds of its last scrape
}

// noteStart records worker's process start time and reports whether it changed since the last
// scrape that had one (the first sighting is no change).
func (s *Scraper) noteStart(worker string, start float64) bool {
	if start <= 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started == nil {
		s.started = make(map[string]float64)
	}
	old, seen := s.started[worker]
	s.started[worker] = start
	return seen && old != start
}

// maxParallelScrapes bounds concurrent scrapes per round.
const maxParallelScrapes = 8

// Run scrapes every Interval until ctx ends.
func (s *Scraper) Run(ctx context.Context) {
	tick := time.NewTicker(s.Interval)
	defer tick.Stop()
	for {
		s.ScrapeOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// ScrapeOnce scrapes every worker once, at most maxParallelScrapes at a time, each bounded by
// the interval so a hung worker never delays the next round.
func (s *Scraper) ScrapeOnce(ctx context.Context) {
	byWorker := make(map[string][]int)
	var order []string
	for _, t := range s.Targets() {
		if _, ok := byWorker[t.Worker]; !ok {
			order = append(order, t.Worker)
		}
		byWorker[t.Worker] = append(byWorker[t.Worker], t.DPRank)
	}
	sem := make(chan struct{}, maxParallelScrapes)
	var wg sync.WaitGroup
	for _, w := range order {
		sem <- struct{}{}
		wg.Add(1)
		go func(w string, ranks []int) {
			defer func() { <-sem; wg.Done() }()
			if err := s.scrape(ctx, w, ranks); err != nil && ctx.Err() == nil && s.Log != nil {
				s.Log.Debug("metrics scrape failed", "worker", w, "err", err)
			}
		}(w, byWorker[w])
	}
	wg.Wait()
}

func (s *Scraper) scrape(ctx context.Context, worker string, ranks []int) error {
	ctx, cancel := context.WithTimeout(ctx, s.Interval)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(worker, "/")+"/metrics", nil)
	if err != nil {
		return fmt.Errorf("metrics request: %w", err)
	}
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	sent := s.Tracker.now()
	marks := make(map[int]metricsMark, len(ranks))
	for _, r := range ranks {
		marks[r] = s.Tracker.mark(kvkey.Target{Worker: worker, DPRank: r})
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("get metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("get metrics: status %d", resp.StatusCode)
	}
	start, err := s.Tracker.feedMetrics(worker, ranks, resp.Body, sent, marks)
	if err != nil {
		return err
	}
	if s.noteStart(worker, start) && s.OnRestart != nil {
		s.OnRestart(worker)
	}
	return nil
}
