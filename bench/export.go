package bench

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Output file names inside --out DIR (aiperf-like).
const (
	SummaryFile = "profile_export_kvbench.json"
	CSVFile     = "profile_export_kvbench.csv"
	RecordsFile = "profile_export.jsonl"
	ReportFile  = "report.html"
	PNGFile     = "report.png"
)

// valueUnit is one per-request metric in profile_export.jsonl.
type valueUnit struct {
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
}

// RecordLine is one line of profile_export.jsonl.
type RecordLine struct {
	Metadata struct {
		XRequestID          string  `json:"x_request_id"`
		XCorrelationID      string  `json:"x_correlation_id"`
		ParentCorrelationID string  `json:"parent_correlation_id,omitempty"`
		ConversationID      string  `json:"conversation_id"`
		TurnIndex           int     `json:"turn_index"`
		RequestStartMS      float64 `json:"request_start_ms"` // since the run started
		WorkerID            string  `json:"worker_id,omitempty"`
		HTTPStatus          int     `json:"http_status"`
		// TraceBlocks, TheoreticalHitBlocks, CapacityHitBlocks and OptimalHitBlocks are the
		// request's blocks in the trace's block size (input_config.block_size), the leading ones
		// seen earlier in its namespace, and those a pooled LRU and a clairvoyant cache of the
		// fleet's size still held (Record): the per-request terms of the summary's captured
		// fractions. Omitted when 0.
		TraceBlocks          int `json:"trace_blocks,omitempty"`
		TheoreticalHitBlocks int `json:"theoretical_hit_blocks,omitempty"`
		CapacityHitBlocks    int `json:"capacity_hit_blocks,omitempty"`
		OptimalHitBlocks     int `json:"optimal_hit_blocks,omitempty"`
	} `json:"metadata"`
	Metrics map[string]valueUnit `json:"metrics"`
	Error   *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

func recordLine(r *Record) RecordLine {
	var l RecordLine
	m := &l.Metadata
	m.XRequestID, m.XCorrelationID, m.ParentCorrelationID = r.RequestID, r.CorrelationID, r.ParentCorrID
	m.ConversationID, m.TurnIndex, m.RequestStartMS = r.ConversationID, r.TurnIndex, ms(r.StartOffset)
	m.WorkerID, m.HTTPStatus = r.Worker, r.Status
	m.TraceBlocks, m.TheoreticalHitBlocks, m.CapacityHitBlocks = r.TraceBlocks, r.TheoreticalHit, r.CapacityHit
	m.OptimalHitBlocks = r.OptimalHit
	l.Metrics = map[string]valueUnit{}
	if !r.OK() {
		l.Error = &struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		}{r.ErrorKind, r.Error}
		l.Metrics["time_to_error"] = valueUnit{ms(r.Latency), "ms"}
		return l
	}
	l.Metrics["time_to_first_token"] = valueUnit{ms(r.TTFT), "ms"}
	l.Metrics["request_latency"] = valueUnit{ms(r.Latency), "ms"}
	if v, ok := r.ITL(); ok {
		l.Metrics["inter_token_latency"] = valueUnit{ms(v), "ms"}
	}
	l.Metrics["output_sequence_length"] = valueUnit{float64(r.OutputTokens), "tokens"}
	if r.HasUsage {
		l.Metrics["input_sequence_length"] = valueUnit{float64(r.PromptTokens), "tokens"}
		l.Metrics["usage_prompt_cache_read_tokens"] = valueUnit{float64(r.CachedTokens), "tokens"}
	}
	return l
}

// WriteOutputs writes the summary JSON, the CSV and the per-request JSONL into dir.
func WriteOutputs(dir string, sum *Summary, res *Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create output dir: %w", err)
	}
	js, err := json.MarshalIndent(sum, "", "  ")
	if err != nil {
		return fmt.Errorf("encode summary: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, SummaryFile), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	if err := writeFile(filepath.Join(dir, CSVFile), func(w io.Writer) error { return WriteCSV(w, sum) }); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, RecordsFile), func(w io.Writer) error {
		enc := json.NewEncoder(w)
		for i := range res.Records {
			if err := enc.Encode(recordLine(&res.Records[i])); err != nil {
				return err
			}
		}
		return nil
	})
}

func writeFile(path string, fill func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	bw := bufio.NewWriter(f)
	if err := fill(bw); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	return nil
}

// metricRows lists the distribution metrics in display order.
func (s *Summary) metricRows() []struct {
	name, title string
	st          Stat
} {
	return []struct {
		name, title string
		st          Stat
	}{
		{"time_to_first_token", "Time to First Token", s.TimeToFirstToken},
		{"inter_token_latency", "Inter Token Latency", s.InterTokenLatency},
		{"request_latency", "Request Latency", s.RequestLatency},
		{"input_sequence_length", "Input Sequence Length", s.InputSequenceLength},
		{"output_sequence_length", "Output Sequence Length", s.OutputSequenceLength},
		{"output_token_throughput", "Output Token Throughput", s.OutputTokenThroughput},
		{"request_throughput", "Request Throughput", s.RequestThroughput},
	}
}

// WriteCSV writes aiperf's CSV layout: "Metric (unit)" rows with statistics columns, then a
// Metric,Value block for the scalar results.
func WriteCSV(w io.Writer, s *Summary) error {
	cw := csv.NewWriter(w)
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	_ = cw.Write([]string{"Metric", "avg", "min", "max", "p50", "p90", "p99", "std", "count"})
	for _, r := range s.metricRows() {
		_ = cw.Write([]string{fmt.Sprintf("%s (%s)", r.title, r.st.Unit), f(r.st.Avg), f(r.st.Min), f(r.st.Max),
			f(r.st.P50), f(r.st.P90), f(r.st.P99), f(r.st.Std), strconv.Itoa(r.st.Count)})
	}
	_ = cw.Write(nil)
	_ = cw.Write([]string{"Metric", "Value"})
	_ = cw.Write([]string{"Request Count", strconv.Itoa(s.RequestCount)})
	_ = cw.Write([]string{"Error Count", strconv.Itoa(s.ErrorCount)})
	_ = cw.Write([]string{"Cached Token Ratio", f(s.CachedTokenRatio)})
	_ = cw.Write([]string{"Theoretical Prefix Cache Hit", f(s.TheoreticalPrefixCacheHit)})
	_ = cw.Write([]string{"Theoretical Cacheable Tokens", strconv.Itoa(s.TheoreticalCacheableTokens)})
	_ = cw.Write([]string{"Captured Cache Fraction", f(s.CapturedCacheFraction)})
	if s.CapacityCacheableTokens > 0 {
		_ = cw.Write([]string{"Capacity Cacheable Tokens", strconv.Itoa(s.CapacityCacheableTokens)})
		_ = cw.Write([]string{"Captured Of Capacity", f(s.CapturedOfCapacity)})
	}
	if s.OptimalCacheableTokens > 0 {
		_ = cw.Write([]string{"Optimal Cacheable Tokens", strconv.Itoa(s.OptimalCacheableTokens)})
		_ = cw.Write([]string{"Captured Of Optimal", f(s.CapturedOfOptimal)})
	}
	if m := s.Missed; m != nil {
		_ = cw.Write([]string{"Missed Same Worker Tokens", strconv.Itoa(m.SameWorkerTokens)})
		_ = cw.Write([]string{"Missed Moved Tokens", strconv.Itoa(m.MovedTokens)})
		_ = cw.Write([]string{"Missed First Turn Tokens", strconv.Itoa(m.FirstTurnTokens)})
	}
	_ = cw.Write([]string{"Total Usage Prompt Tokens", strconv.Itoa(s.TotalUsagePromptTokens)})
	_ = cw.Write([]string{"Total Usage Prompt Cache Read Tokens", strconv.Itoa(s.TotalUsagePromptCacheReadTokens)})
	_ = cw.Write([]string{"Benchmark Duration (sec)", f(s.BenchmarkDuration)})
	_ = cw.Write([]string{"Run Duration (sec)", f(s.RunDuration)})
	if s.InputConfig.GoodputTTFTMS > 0 {
		_ = cw.Write([]string{"Goodput TTFT Limit (ms)", f(s.InputConfig.GoodputTTFTMS)})
		_ = cw.Write([]string{"Good Request Count", strconv.Itoa(s.GoodRequestCount)})
		_ = cw.Write([]string{"Goodput (requests/sec)", f(s.Goodput)})
	}
	_ = cw.Write([]string{"Oldest Request Age (ms)", f(s.OldestRequestAgeMS)})
	for _, k := range sortedCounts(s.ErrorSummary) {
		_ = cw.Write([]string{"Errors: " + k, strconv.Itoa(s.ErrorSummary[k])})
	}
	for _, k := range sortedCounts(s.WorkerDistribution) {
		_ = cw.Write([]string{"Worker: " + k, strconv.Itoa(s.WorkerDistribution[k])})
	}
	cw.Flush()
	return cw.Error()
}

func sortedCounts(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Run is a summary with its per-request records (for plots), loaded from disk.
type Run struct {
	Path    string
	Summary *Summary
	Lines   []RecordLine // nil when profile_export.jsonl is not beside the summary
}

// LoadRun reads a summary JSON (a file, or a --out directory holding one) and, when present,
// the profile_export.jsonl beside it.
func LoadRun(path string) (*Run, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, SummaryFile)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read summary: %w", err)
	}
	var s Summary
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("%s: invalid summary JSON: %w", path, err)
	}
	if s.Schema != SchemaVersion {
		return nil, fmt.Errorf("%s: not a kvbench summary (schema %q)", path, s.Schema)
	}
	if s.Label == "" {
		s.Label = strings.TrimSuffix(filepath.Base(filepath.Dir(path)), "/")
	}
	run := &Run{Path: path, Summary: &s}
	f, err := os.Open(filepath.Join(filepath.Dir(path), RecordsFile))
	if errors.Is(err, os.ErrNotExist) {
		return run, nil
	} else if err != nil {
		return nil, fmt.Errorf("open records: %w", err)
	}
	defer f.Close()
	err = forEachLine(f, func(line int, b []byte) error {
		var l RecordLine
		if err := json.Unmarshal(b, &l); err != nil {
			return fmt.Errorf("%s:%d: %w", RecordsFile, line, err)
		}
		run.Lines = append(run.Lines, l)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read records: %w", err)
	}
	return run, nil
}

// compareRow is one line of the comparison table; lower says whether smaller is better.
type compareRow struct {
	title string
	get   func(*Summary) float64
	lower bool
	unit  string
}

// compareRows lists the comparison table's rows in display order.
func compareRows() []compareRow {
	return []compareRow{
		{"TTFT avg", func(s *Summary) float64 { return s.TimeToFirstToken.Avg }, true, "ms"},
		{"TTFT p50", func(s *Summary) float64 { return s.TimeToFirstToken.P50 }, true, "ms"},
		{"TTFT p90", func(s *Summary) float64 { return s.TimeToFirstToken.P90 }, true, "ms"},
		{"TTFT p99", func(s *Summary) float64 { return s.TimeToFirstToken.P99 }, true, "ms"},
		{"ITL avg", func(s *Summary) float64 { return s.InterTokenLatency.Avg }, true, "ms"},
		{"latency avg", func(s *Summary) float64 { return s.RequestLatency.Avg }, true, "ms"},
		{"latency p90", func(s *Summary) float64 { return s.RequestLatency.P90 }, true, "ms"},
		{"output tok/s", func(s *Summary) float64 { return s.OutputTokenThroughput.Avg }, false, "tok/s"},
		{"requests/s", func(s *Summary) float64 { return s.RequestThroughput.Avg }, false, "req/s"},
		{"goodput", func(s *Summary) float64 { return s.Goodput }, false, "req/s"},
		{"cached ratio", func(s *Summary) float64 { return s.CachedTokenRatio }, false, ""},
		{"theoretical hit", func(s *Summary) float64 { return s.TheoreticalPrefixCacheHit }, false, ""},
		{"captured of theoretical", func(s *Summary) float64 { return s.CapturedCacheFraction }, false, ""},
		{"captured of pooled LRU", func(s *Summary) float64 { return s.CapturedOfCapacity }, false, ""},
		{"captured of optimal", func(s *Summary) float64 { return s.CapturedOfOptimal }, false, ""},
		{"missed: same worker", func(s *Summary) float64 { return s.Missed.or().SameWorkerFraction }, true, ""},
		{"missed: moved", func(s *Summary) float64 { return s.Missed.or().MovedFraction }, true, ""},
		{"missed: first turn", func(s *Summary) float64 { return s.Missed.or().FirstTurnFraction }, true, ""},
		{"requests ok", func(s *Summary) float64 { return float64(s.RequestCount) }, false, ""},
		{"errors", func(s *Summary) float64 { return float64(s.ErrorCount) }, true, ""},
	}
}

// WriteCompare prints the side-by-side table; every column after the first also shows its
// ratio to the first run (the baseline, e.g. round robin).
func WriteCompare(w io.Writer, runs []*Run) error {
	if len(runs) == 0 {
		return errors.New("compare: no runs")
	}
	header := []string{"metric"}
	for _, r := range runs {
		header = append(header, r.Summary.Label)
	}
	rows := [][]string{header}
	for _, cr := range compareRows() {
		row := []string{cr.title}
		if cr.unit != "" {
			row[0] += " (" + cr.unit + ")"
		}
		base := cr.get(runs[0].Summary)
		for i, r := range runs {
			v := cr.get(r.Summary)
			cell := formatNum(v)
			if i > 0 && base != 0 {
				cell += fmt.Sprintf(" (%.2fx)", v/base)
			}
			row = append(row, cell)
		}
		rows = append(rows, row)
	}
	widths := make([]int, len(header))
	for _, row := range rows {
		for i, c := range row {
			widths[i] = max(widths[i], len(c))
		}
	}
	var b strings.Builder
	for n, row := range rows {
		for i, c := range row {
			if i == 0 {
				fmt.Fprintf(&b, "%-*s", widths[i], c)
			} else {
				fmt.Fprintf(&b, "  %*s", widths[i], c)
			}
		}
		b.WriteByte('\n')
		if n == 0 {
			total := len(widths) * 2
			for _, w := range widths {
				total += w
			}
			b.WriteString(strings.Repeat("-", total-2) + "\n")
		}
	}
	fmt.Fprintf(&b, "(ratios against %s; TTFT/latency lower is better, throughput, cached ratio and captured higher)\n", runs[0].Summary.Label)
	_, err := io.WriteString(w, b.String())
	return err
}

func formatNum(v float64) string {
	switch {
	case v == float64(int64(v)) && v < 1e9 && v > -1e9:
		return strconv.FormatInt(int64(v), 10)
	case v < 1 && v > -1:
		return strconv.FormatFloat(v, 'f', 3, 64)
	default:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
}

// durationMS converts a record line's ms value back to a duration (plots).
func durationMS(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
