package router

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/workers"
)

// maxMetricsBody bounds how much of one /metrics response is read.
const maxMetricsBody = 8 << 20

// noEngine keys values that carry no engine (DP rank) label.
const noEngine = -1

// ParseWorkerMetrics reads a vLLM /metrics body in the Prometheus text format and returns the
// load figures per DP rank, keyed by the `engine` label (noEngine, -1, when absent). Counts of
// the same rank under different label sets (e.g. several model names) are summed; KV usage takes
// the maximum. Both vllm:kv_cache_usage_perc and the older vllm:gpu_cache_usage_perc are read.
func ParseWorkerMetrics(r io.Reader) (map[int]WorkerMetrics, error) {
	out := make(map[int]WorkerMetrics)
	sc := bufio.NewScanner(io.LimitReader(r, maxMetricsBody))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || !strings.HasPrefix(line, "vllm:") {
			continue
		}
		name, labels, value, err := parseSample(line)
		if err != nil {
			continue // one odd line must not hide the rest
		}
		rank := noEngine
		if e, ok := labels["engine"]; ok {
			if n, err := strconv.Atoi(e); err == nil && n >= 0 {
				rank = n
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
			if n, err := strconv.Atoi(labels["num_gpu_blocks"]); err == nil {
				m.NumGPUBlocks = n
			}
		default:
			continue
		}
		out[rank] = m
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return out, nil
}

// parseSample splits `name{k="v",...} value [timestamp]`.
func parseSample(line string) (string, map[string]string, float64, error) {
	var labels map[string]string
	rest := line
	i := strings.IndexAny(rest, "{ \t")
	if i < 0 {
		return "", nil, 0, errors.New("no value")
	}
	name := rest[:i]
	rest = rest[i:]
	if rest[0] == '{' {
		var err error
		labels, rest, err = parseLabels(rest[1:])
		if err != nil {
			return "", nil, 0, err
		}
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return "", nil, 0, errors.New("no value")
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return "", nil, 0, fmt.Errorf("value %q: %w", fields[0], err)
	}
	return name, labels, v, nil
}

// parseLabels parses `k="v",k2="v2"}` and returns the text after the closing brace.
func parseLabels(s string) (map[string]string, string, error) {
	labels := make(map[string]string, 4)
	for {
		s = strings.TrimLeft(s, " \t,")
		if s == "" {
			return nil, "", errors.New("unterminated labels")
		}
		if s[0] == '}' {
			return labels, s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return nil, "", errors.New("bad label")
		}
		key := strings.TrimSpace(s[:eq])
		s = s[eq+2:]
		var b strings.Builder
		closed := false
		for j := 0; j < len(s); j++ {
			c := s[j]
			if c == '\\' && j+1 < len(s) {
				j++
				switch s[j] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(s[j])
				}
				continue
			}
			if c == '"' {
				s = s[j+1:]
				closed = true
				break
			}
			b.WriteByte(c)
		}
		if !closed {
			return nil, "", errors.New("unterminated label value")
		}
		labels[key] = b.String()
	}
}

// FeedMetrics applies one /metrics body of worker to its targets (the given DP ranks). Values
// with an engine label go to that rank; values without one are the worker's totals, split
// evenly over its ranks (KV usage applies to each as is).
func (lt *LoadTracker) FeedMetrics(worker string, ranks []int, body io.Reader) error {
	return lt.feedMetrics(worker, ranks, body, lt.now(), nil)
}

// feedMetrics is FeedMetrics for a body requested at sent, with each rank's counters marked
// then (nil: now).
func (lt *LoadTracker) feedMetrics(worker string, ranks []int, body io.Reader, sent time.Time, marks map[int]metricsMark) error {
	parsed, err := ParseWorkerMetrics(body)
	if err != nil {
		return fmt.Errorf("worker %s: %w", worker, err)
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
				KVUsage: shared.KVUsage, NumGPUBlocks: shared.NumGPUBlocks}
		}
		m.At, m.mark = sent, marks[r]
		lt.UpdateMetrics(workers.Target{Worker: worker, DPRank: r}, m)
	}
	return nil
}

// Scraper polls each worker's /metrics and feeds the load tracker.
type Scraper struct {
	Tracker  *LoadTracker
	Client   *http.Client
	Interval time.Duration
	// Targets lists the targets to scrape; it is called on every round so the fleet may change.
	Targets func() []workers.Target
	Log     *slog.Logger
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
		marks[r] = s.Tracker.mark(workers.Target{Worker: worker, DPRank: r})
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
	return s.Tracker.feedMetrics(worker, ranks, resp.Body, sent, marks)
}
