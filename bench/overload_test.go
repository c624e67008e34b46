package bench

import (
	"bytes"
	"context"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestGoodput: goodput counts the successful requests under the TTFT limit per second of the
// whole run, failed requests' time included; a failed request's age is its time to failure.
func TestGoodput(t *testing.T) {
	ok := func(start, ttft, lat time.Duration) Record {
		return Record{StartOffset: start, TTFT: ttft, Latency: lat, Chunks: 2, OutputTokens: 2, Status: 200}
	}
	failed := func(start, lat time.Duration) Record {
		return Record{StartOffset: start, Latency: lat, Status: 503, ErrorKind: "http_503"}
	}
	s, ms := time.Second, time.Millisecond
	tests := []struct {
		name      string
		limitMS   float64
		recs      []Record
		good      int
		goodput   float64
		runDur    float64
		oldestAge float64
	}{
		{"all under the limit", 2000, []Record{ok(0, 100*ms, s), ok(s, 1900*ms, 3*s)}, 2, 2.0 / 4, 4, 1900},
		{"the limit itself is not under it", 2000, []Record{ok(0, 2*s, 3*s), ok(0, 500*ms, 4*s)}, 1, 1.0 / 4, 4, 2000},
		{"a shed request counts its time, never as good", 2000, []Record{ok(0, 100*ms, s), failed(2*s, 8*s)}, 1, 1.0 / 10, 10, 8000},
		{"no limit, no goodput", 0, []Record{ok(0, 100*ms, s)}, 0, 0, 1, 100},
		{"nothing ran", 2000, nil, 0, 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sum := Summarize("x", InputConfig{GoodputTTFTMS: tc.limitMS}, &Result{Records: tc.recs})
			if sum.GoodRequestCount != tc.good || math.Abs(sum.Goodput-tc.goodput) > 1e-9 ||
				math.Abs(sum.RunDuration-tc.runDur) > 1e-9 || math.Abs(sum.OldestRequestAgeMS-tc.oldestAge) > 1e-9 {
				t.Errorf("good %d, goodput %v, run %v s, oldest %v ms; want %d, %v, %v, %v",
					sum.GoodRequestCount, sum.Goodput, sum.RunDuration, sum.OldestRequestAgeMS, tc.good, tc.goodput, tc.runDur, tc.oldestAge)
			}
		})
	}
}

// TestReplayRecordsTimeToFailure: a request the server answers 503 gets the time it waited for
// that answer as its latency, so the run's oldest request age and duration include it.
func TestReplayRecordsTimeToFailure(t *testing.T) {
	srv := httptest.NewServer(&scriptedServer{ttft: 5 * time.Millisecond, chunks: 2})
	defer srv.Close()
	tr := &Trace{Format: FormatMultiTurn, Sessions: []*Session{
		{ID: "a", Turns: []Turn{{Text: "hello", OutputTokens: 2}}},
		{ID: "b", Turns: []Turn{{Text: "FAIL503", OutputTokens: 2}}},
	}}
	res, err := Replay(context.Background(), tr, nil, ReplayOptions{URL: srv.URL, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	var failed *Record
	for i := range res.Records {
		if !res.Records[i].OK() {
			failed = &res.Records[i]
		}
	}
	if failed == nil || failed.Status != 503 || failed.Latency <= 0 {
		t.Fatalf("want a 503 record with its time to failure, got %+v", res.Records)
	}
	sum := Summarize("x", InputConfig{GoodputTTFTMS: 2000}, res)
	if sum.GoodRequestCount != 1 || sum.OldestRequestAgeMS < ms(failed.Latency) {
		t.Errorf("good %d (want 1), oldest %v ms (want >= %v)", sum.GoodRequestCount, sum.OldestRequestAgeMS, ms(failed.Latency))
	}
}

// TestTraceSpan: the zero-latency schedule of a trace: delays add up, timestamps are absolute,
// subagents start after their spawn turn and a joining turn waits for their last request.
func TestTraceSpan(t *testing.T) {
	s := time.Second
	turns := func(delays ...time.Duration) []Turn {
		out := make([]Turn, len(delays))
		for i, d := range delays {
			out[i].Delay = d
		}
		return out
	}
	tests := []struct {
		name string
		tr   *Trace
		want time.Duration
	}{
		{"one session", &Trace{Sessions: []*Session{{Turns: turns(0, 2*s, 3*s)}}}, 5 * s},
		{"latest start wins", &Trace{Sessions: []*Session{{Turns: turns(0, s)}, {Start: 10 * s, Turns: turns(0)}}}, 10 * s},
		{"timestamps", &Trace{Sessions: []*Session{{Turns: []Turn{{}, {HasTimestamp: true, Timestamp: 7 * s}}}}}, 7 * s},
		{"a subagent outlasting its parent", &Trace{Sessions: []*Session{{Turns: turns(0, s),
			Children: []*Session{{Turns: turns(0, 5*s), SpawnAfter: 0, SpawnDelay: s, JoinBefore: -1}}}}}, 6 * s},
		{"a joined subagent delays the parent", &Trace{Sessions: []*Session{{Turns: turns(0, s, s),
			Children: []*Session{{Turns: turns(0, 4*s), SpawnAfter: 0, JoinBefore: 1}}}}}, 5 * s},
		{"repeat stagger", (&Trace{Sessions: []*Session{{Turns: turns(0, 2*s)}}}).Repeat(3, 10*s), 22 * s},
		{"empty", &Trace{}, 0},
	}
	for _, tc := range tests {
		if got := tc.tr.Span(); got != tc.want {
			t.Errorf("%s: span %v, want %v", tc.name, got, tc.want)
		}
	}
	tr := &Trace{Sessions: []*Session{{Turns: turns(0, 5*s, 5*s)}}}
	if got := tr.OfferedRate(3, 0.1); math.Abs(got-3) > 1e-9 {
		t.Errorf("3 requests over 10 s at time scale 0.1: %v req/s, want 3", got)
	}
	if got := (&Trace{}).OfferedRate(3, 1); got != 0 {
		t.Errorf("no span: %v, want 0", got)
	}
}

func TestFindCapacity(t *testing.T) {
	// One trace whose user offers 1 req/s at time scale 1: the points vary the time scale at
	// one user; users vary it the other way.
	pt := func(rate, p90 float64) CapacityPoint {
		return CapacityPoint{Label: "r", Rate: rate, TimeScale: 1 / rate, P90MS: p90}
	}
	users := func(n int, p90 float64) CapacityPoint {
		return CapacityPoint{Label: "u", Rate: float64(n) / 0.5, TimeScale: 0.5, Users: n, P90MS: p90}
	}
	tests := []struct {
		name   string
		points []CapacityPoint
		rate   float64
		err    string
	}{
		{"interpolated between the runs around the crossing", []CapacityPoint{pt(1, 500), pt(2, 1500), pt(4, 2500)}, 3, ""},
		{"order of the arguments does not matter", []CapacityPoint{pt(4, 2500), pt(1, 500), pt(2, 1500)}, 3, ""},
		{"users as the load", []CapacityPoint{users(1, 500), users(2, 1500), users(4, 2500)}, 6, ""},
		{"the first crossing counts", []CapacityPoint{pt(1, 1000), pt(2, 3000), pt(3, 1900), pt(4, 5000)}, 1.5, ""},
		{"over the limit at the lowest rate", []CapacityPoint{pt(1, 2500), pt(2, 3000)}, 0, "below the runs"},
		{"never over the limit", []CapacityPoint{pt(1, 500), pt(2, 900)}, 0, "above the runs"},
		{"one run", []CapacityPoint{pt(1, 500)}, 0, "two rates"},
		{"a run without an offered rate", []CapacityPoint{pt(1, 500), {Label: "conc", TimeScale: 1, P90MS: 3000}}, 0, "no offered rate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := FindCapacity(tc.points, 2000)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(c.Rate-tc.rate) > 1e-9 {
				t.Errorf("capacity %v req/s, want %v", c.Rate, tc.rate)
			}
			// One user offers 1 req/s at time scale 1: twice the capacity is time scale
			// 1/(2·rate) for one user, and 2·rate·0.5 users at time scale 0.5.
			if got, want := c.TimeScaleFor(2, 1), 1/(2*tc.rate); math.Abs(got-want) > 1e-9 {
				t.Errorf("time scale for 2x %v, want %v", got, want)
			}
			if got, want := c.UsersFor(2, 0.5), tc.rate; math.Abs(got-want) > 1e-9 {
				t.Errorf("users for 2x at time scale 0.5: %v, want %v", got, want)
			}
		})
	}
}

// TestOverloadTable: one row per level and policy in first-seen order, medians over runs,
// goodput's range and its ratio to the baseline's median at the same level, failures by kind.
func TestOverloadTable(t *testing.T) {
	run := func(label string, goodput, p90, captured, pooled float64, errs map[string]int) *Run {
		return &Run{Summary: &Summary{Label: label, Goodput: goodput, TimeToFirstToken: Stat{Avg: p90 / 2, P90: p90, P99: 2 * p90},
			CapturedCacheFraction: captured, CapturedOfCapacity: pooled, CapturedOfOptimal: pooled * 0.9, RequestCount: 100, ErrorSummary: errs,
			InputConfig: InputConfig{OfferedRequestRate: 1.5}}}
	}
	points := []OverloadPoint{
		{"1x", run("round_robin", 1.0, 3000, 0.4, 0, nil)},
		{"1x", run("kv", 2.0, 1000, 0.95, 0, nil)},
		{"1x", run("round_robin", 1.2, 3200, 0.42, 0, nil)},
		{"1x", run("kv", 2.4, 1200, 0.97, 0, map[string]int{"http_503": 2})},
		{"2x", run("kv", 0.5, 900, 0.9, 0.95, map[string]int{"http_429": 1, "http_503": 3})},
	}
	var b bytes.Buffer
	if err := WriteOverloadMarkdown(&b, points, "round_robin"); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	want := []string{
		"| 1x | round_robin | 2 | 1.100 | 1.000–1.200 | 1.00 | 1550 | 3100 | 6200 | 0.410 | 0.000 | 0.000 | 1.500 | 100 | 0 |",
		"| 1x | kv | 2 | 2.200 | 2.000–2.400 | 2.00 | 550 | 1100 | 2200 | 0.960 | 0.000 | 0.000 | 1.500 | 100 | http_503 2 |",
		"| 2x | kv | 1 | 0.500 | 0.500–0.500 | - | 450 | 900 | 1800 | 0.900 | 0.950 | 0.855 | 1.500 | 100 | http_429 1, http_503 3 |",
	}
	if len(lines) != 2+len(want) {
		t.Fatalf("%d lines, want header, rule and %d rows:\n%s", len(lines), len(want), b.String())
	}
	for i, w := range want {
		if lines[2+i] != w {
			t.Errorf("row %d:\n got %s\nwant %s", i, lines[2+i], w)
		}
	}
	if err := WriteOverloadMarkdown(&b, nil, "round_robin"); err == nil {
		t.Error("no runs: want an error")
	}
}

// TestFindSaturation: the highest throughput, and the lowest offered rate within the fraction
// of it, whatever the order of the runs.
func TestFindSaturation(t *testing.T) {
	pt := func(rate, tput float64) CapacityPoint { return CapacityPoint{Rate: rate, Throughput: tput} }
	tests := []struct {
		name            string
		points          []CapacityPoint
		maxRate, kneeAt float64
	}{
		{"plateau", []CapacityPoint{pt(1, 0.5), pt(2, 0.9), pt(4, 1.1), pt(8, 1.15)}, 8, 4},
		{"unsorted", []CapacityPoint{pt(8, 1.15), pt(1, 0.5), pt(4, 1.1), pt(2, 0.9)}, 8, 4},
		{"still rising", []CapacityPoint{pt(1, 0.5), pt(2, 1.0)}, 2, 2},
		{"one run", []CapacityPoint{pt(3, 0.7)}, 3, 3},
	}
	for _, tc := range tests {
		s, err := FindSaturation(tc.points, 0.1)
		if err != nil {
			t.Fatal(err)
		}
		if s.Max.Rate != tc.maxRate || s.Knee.Rate != tc.kneeAt {
			t.Errorf("%s: max at %v, knee at %v; want %v, %v", tc.name, s.Max.Rate, s.Knee.Rate, tc.maxRate, tc.kneeAt)
		}
	}
	if _, err := FindSaturation(nil, 0.1); err == nil {
		t.Error("no runs: want an error")
	}
}
