package bench

import (
	"bytes"
	"fmt"
	"image/png"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeResult builds n successful records with TTFT 10, 20, ... ms, one per 100 ms, plus errors.
func fakeResult(n int, ttftScale float64, workers []string) *Result {
	res := &Result{}
	for i := range n {
		ttft := time.Duration(float64(i+1) * 10 * ttftScale * float64(time.Millisecond))
		res.Records = append(res.Records, Record{RequestID: fmt.Sprint(i), ConversationID: "s", TurnIndex: i,
			StartOffset: time.Duration(i) * 100 * time.Millisecond, TTFT: ttft, Latency: ttft + 90*time.Millisecond,
			Chunks: 10, OutputTokens: 10, PromptTokens: 1000, CachedTokens: 250 * (i % 2 * 2), HasUsage: true,
			Worker: workers[i%len(workers)], Status: 200, TheoreticalHit: 3, TraceBlocks: 4})
	}
	res.Records = append(res.Records, Record{ErrorKind: "http_503", Status: 503, Worker: workers[0]},
		Record{ErrorKind: ErrTimeout})
	return res
}

func TestSummarize(t *testing.T) {
	res := fakeResult(10, 1, []string{"w1", "w2"})
	s := Summarize("rr", InputConfig{Model: "m"}, res)
	cases := []struct {
		name      string
		got, want float64
	}{
		{"ttft avg", s.TimeToFirstToken.Avg, 55},
		{"ttft min", s.TimeToFirstToken.Min, 10},
		{"ttft max", s.TimeToFirstToken.Max, 100},
		{"ttft p50", s.TimeToFirstToken.P50, 55},   // linear interpolation between 50 and 60
		{"ttft p90", s.TimeToFirstToken.P90, 91},   // 90 + 0.1*10
		{"ttft p99", s.TimeToFirstToken.P99, 99.1}, // 90 + 0.91*10
		{"itl", s.InterTokenLatency.Avg, 10},       // (latency - ttft) / (10 - 1) = 90/9
		{"latency min", s.RequestLatency.Min, 100},
		{"cached ratio", s.CachedTokenRatio, 0.25}, // 5 of 10 requests cache 500 of 1000
		{"theoretical", s.TheoreticalPrefixCacheHit, 0.75},
		{"duration", s.BenchmarkDuration, 1.09},            // first start 0, last end 0.9 + 0.19
		{"req/s", s.RequestThroughput.Avg, 10 / 1.09},      // ok requests / duration
		{"tok/s", s.OutputTokenThroughput.Avg, 100 / 1.09}, // output tokens / duration
		{"osl", s.OutputSequenceLength.Avg, 10},
		{"isl", s.InputSequenceLength.Avg, 1000},
	}
	for _, c := range cases {
		if math.Abs(c.got-c.want) > 1e-6 {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if s.RequestCount != 10 || s.ErrorCount != 2 || s.ErrorSummary["http_503"] != 1 || s.ErrorSummary[ErrTimeout] != 1 {
		t.Errorf("counts %d/%d %v", s.RequestCount, s.ErrorCount, s.ErrorSummary)
	}
	if s.WorkerDistribution["w1"] != 6 || s.WorkerDistribution["w2"] != 5 {
		t.Errorf("workers %v (errors count toward the worker that answered)", s.WorkerDistribution)
	}
	if s.TimeToFirstToken.Count != 10 || s.TimeToFirstToken.Unit != "ms" {
		t.Errorf("ttft stat %+v", s.TimeToFirstToken)
	}
}

func TestOutputsRoundTripAndCompare(t *testing.T) {
	dirA, dirB := filepath.Join(t.TempDir(), "round_robin"), filepath.Join(t.TempDir(), "kv")
	for _, d := range []struct {
		dir   string
		scale float64
		ws    []string
	}{{dirA, 1, []string{"http://a", "http://b"}}, {dirB, 0.5, []string{"http://a"}}} {
		res := fakeResult(10, d.scale, d.ws)
		if err := WriteOutputs(d.dir, Summarize(filepath.Base(d.dir), InputConfig{}, res), res); err != nil {
			t.Fatal(err)
		}
	}
	a, err := LoadRun(filepath.Join(dirA, SummaryFile))
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadRun(dirB) // a run directory works too
	if err != nil {
		t.Fatal(err)
	}
	if a.Summary.Label != "round_robin" || len(a.Lines) != 12 || a.Summary.TimeToFirstToken.P90 != 91 {
		t.Fatalf("loaded %s with %d lines, p90 %v", a.Summary.Label, len(a.Lines), a.Summary.TimeToFirstToken.P90)
	}
	if a.Lines[0].Metrics["time_to_first_token"].Value != 10 || a.Lines[11].Error == nil {
		t.Errorf("record lines %+v", a.Lines[0])
	}
	if m := a.Lines[0].Metadata; m.TheoreticalHitBlocks != 3 || m.TraceBlocks != 4 || m.CapacityHitBlocks != 0 {
		t.Errorf("record line blocks: theoretical %d of %d, capacity %d; want 3 of 4, 0", m.TheoreticalHitBlocks, m.TraceBlocks, m.CapacityHitBlocks)
	}

	var table bytes.Buffer
	if err := WriteCompare(&table, []*Run{a, b}); err != nil {
		t.Fatal(err)
	}
	out := table.String()
	for _, want := range []string{"round_robin", "kv", "TTFT avg (ms)", "55", "27.5 (0.50x)", "cached ratio"} {
		if !strings.Contains(out, want) {
			t.Errorf("compare table lacks %q:\n%s", want, out)
		}
	}

	var html bytes.Buffer
	if err := WriteReport(&html, "test report", []*Run{a, b}); err != nil {
		t.Fatal(err)
	}
	h := html.String()
	if n := strings.Count(h, "<svg"); n != 5 {
		t.Errorf("report has %d SVG plots, want 5 (headline, CDF, over time, cached ratio, worker load)", n)
	}
	for _, bad := range []string{"<script", "src=", "<link"} {
		if strings.Contains(h, bad) {
			t.Errorf("report is not self-contained: contains %q", bad)
		}
	}
	for _, want := range []string{"TTFT distribution", "TTFT over time", "Cached-token ratio per policy", "Requests per worker", "http_503"} {
		if !strings.Contains(h, want) {
			t.Errorf("report lacks %q", want)
		}
	}

	var img bytes.Buffer
	if err := WritePNG(&img, []*Run{a, b}); err != nil {
		t.Fatal(err)
	}
	m, err := png.Decode(&img)
	if err != nil {
		t.Fatal(err)
	}
	if m.Bounds().Dx() != 960 || m.Bounds().Dy() != 540 {
		t.Errorf("png %v", m.Bounds())
	}
	// Both series colours must appear (the bars were drawn).
	found := map[string]bool{}
	for y := 0; y < 540; y += 2 {
		for x := 0; x < 960; x += 2 {
			r, g, bb, _ := m.At(x, y).RGBA()
			found[fmt.Sprintf("#%02x%02x%02x", r>>8, g>>8, bb>>8)] = true
		}
	}
	if !found[seriesColor(0)] || !found[seriesColor(1)] {
		t.Error("the PNG lacks the bars of one of the series")
	}
}

func TestLoadRunRejectsOtherJSON(t *testing.T) {
	p := writeTemp(t, "x.json", `{"schema":"other"}`)
	if _, err := LoadRun(p); err == nil || !strings.Contains(err.Error(), "not a kvbench summary") {
		t.Errorf("err = %v", err)
	}
}
