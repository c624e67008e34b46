package bench

import (
	"bytes"
	"strings"
	"testing"
)

func TestParseSweepLevel(t *testing.T) {
	tests := []struct {
		in    string
		users int
		scale float64
		err   bool
	}{
		{"4:0.02", 4, 0.02, false},
		{"1:1", 1, 1, false},
		{"4", 0, 0, true},
		{"0:0.1", 0, 0, true},
		{"x:0.1", 0, 0, true},
		{"2:0", 0, 0, true},
		{"2:-1", 0, 0, true},
		{"2:NaN", 0, 0, true},
		{"2:Inf", 0, 0, true},
	}
	for _, tc := range tests {
		u, s, err := ParseSweepLevel(tc.in)
		if (err != nil) != tc.err || u != tc.users || s != tc.scale {
			t.Errorf("ParseSweepLevel(%q) = %d, %v, %v; want %d, %v, error %v", tc.in, u, s, err, tc.users, tc.scale, tc.err)
		}
	}
}

// TestSweepReport: one row per policy and level, ordered by policy (first seen) then load,
// and one curve per policy in each of the five charts, with a marker per load level.
func TestSweepReport(t *testing.T) {
	run := func(label string, ttft, rps float64) *Run {
		return &Run{Summary: &Summary{Label: label, TimeToFirstToken: Stat{Avg: ttft, P90: 2 * ttft},
			RequestThroughput: Stat{Avg: rps}, RequestCount: 10}}
	}
	points := []SweepPoint{
		{Users: 8, TimeScale: 0.01, Run: run("round_robin", 900, 3)},
		{Users: 2, TimeScale: 0.05, Run: run("round_robin", 100, 1)},
		{Users: 2, TimeScale: 0.05, Run: run("kv", 50, 1)},
		{Users: 4, TimeScale: 0.02, Run: run("round_robin", 300, 2)},
		{Users: 8, TimeScale: 0.01, Run: run("kv", 200, 3.5)},
		{Users: 4, TimeScale: 0.02, Run: run("kv", 80, 2)},
	}
	var md bytes.Buffer
	if err := WriteSweepMarkdown(&md, points); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(md.String()), "\n")
	want := []string{"round_robin | 2:0.05 | 40 | 1 | 100 | 200", "round_robin | 4:0.02 | 200 | 1 | 300 | 600",
		"round_robin | 8:0.01 | 800 | 1 | 900 | 1800", "kv | 2:0.05 | 40 | 1 | 50 | 100", "kv | 4:0.02 | 200 | 1 | 80 | 160",
		"kv | 8:0.01 | 800 | 1 | 200 | 400"}
	if len(lines) != 2+len(want) {
		t.Fatalf("%d lines, want header, rule and %d rows:\n%s", len(lines), len(want), md.String())
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[2+i], "| "+w+" |") {
			t.Errorf("row %d = %q, want prefix %q", i, lines[2+i], w)
		}
	}
	var html bytes.Buffer
	if err := WriteSweepReport(&html, "sweep", points); err != nil {
		t.Fatal(err)
	}
	h := html.String()
	if n := strings.Count(h, "<polyline"); n != 5*2 {
		t.Errorf("%d curves, want 5 charts × 2 policies", n)
	}
	if n := strings.Count(h, `r="4"`); n != 5*6 {
		t.Errorf("%d markers, want one per point per chart (30)", n)
	}
	if err := WriteSweepMarkdown(&md, nil); err == nil {
		t.Error("empty sweep: no error")
	}
}

// TestSweepRepeats: runs of one policy at one level are one row of medians, with the ratio
// to the first policy taken between medians and between means over the runs, the mean TTFT's
// range over the runs, and one marker per level in the charts.
func TestSweepRepeats(t *testing.T) {
	run := func(label string, ttft float64, captured float64, errs int) *Run {
		// Half the miss on the same worker, half after a move.
		missed := &MissedCache{SameWorkerFraction: (1 - captured) / 2, MovedFraction: (1 - captured) / 2}
		return &Run{Summary: &Summary{Label: label, TimeToFirstToken: Stat{Avg: ttft, P90: 3 * ttft},
			CapturedCacheFraction: captured, Missed: missed, RequestCount: 10, ErrorCount: errs}}
	}
	at := func(users int, scale float64, r *Run) SweepPoint {
		return SweepPoint{Users: users, TimeScale: scale, Run: r}
	}
	points := []SweepPoint{
		at(4, 0.1, run("round_robin", 100, 0.3, 0)), at(4, 0.1, run("kv", 50, 0.9, 0)),
		at(4, 0.1, run("round_robin", 300, 0.4, 1)), at(4, 0.1, run("kv", 40, 0.95, 0)),
		at(4, 0.1, run("round_robin", 200, 0.2, 0)), at(4, 0.1, run("kv", 90, 0.7, 2)),
		// 2:0.05 is the same offered load (40×) but another level: its own row.
		at(2, 0.05, run("round_robin", 1000, 0.5, 0)), at(2, 0.05, run("kv", 100, 0.6, 0)),
		at(2, 0.05, run("kv", 300, 0.8, 0)),
		// kv alone at 8:0.1: no baseline there.
		at(8, 0.1, run("kv", 70, 0.5, 0)),
	}
	rows := sweepTable(points)
	col := func(name string) int {
		for i, h := range rows[0] {
			if h == name {
				return i
			}
		}
		t.Fatalf("no column %q in %v", name, rows[0])
		return -1
	}
	tests := []struct {
		row                                                int
		label, level, runs, mean, p90, ratio, ratioOfMeans string
		rng, captured, missed, errors                      string
	}{
		{1, "round_robin", "2:0.05", "1", "1000", "3000", "1.000", "1.000", "1000–1000", "0.500", "0.250 / 0.250 / 0.000", "0"},
		{2, "round_robin", "4:0.1", "3", "200", "600", "1.000", "1.000", "100–300", "0.300", "0.350 / 0.350 / 0.000", "1"},
		{3, "kv", "2:0.05", "2", "200", "600", "0.200", "0.200", "100–300", "0.700", "0.150 / 0.150 / 0.000", "0"},
		// Medians 50 ÷ 200; means (50+40+90)/3 = 60 ÷ (100+300+200)/3 = 200.
		{4, "kv", "4:0.1", "3", "50", "150", "0.250", "0.300", "40–90", "0.900", "0.050 / 0.050 / 0.000", "2"},
		{5, "kv", "8:0.1", "1", "70", "210", "-", "-", "70–70", "0.500", "0.250 / 0.250 / 0.000", "0"},
	}
	if len(rows) != 1+len(tests) {
		t.Fatalf("%d rows, want header and %d: %v", len(rows), len(tests), rows)
	}
	for _, tc := range tests {
		r := rows[tc.row]
		got := []string{r[0], r[1], r[col("runs")], r[col("TTFT mean (ms)")], r[col("TTFT p90 (ms)")],
			r[col("TTFT mean ÷ round_robin")], r[col("TTFT mean ÷ round_robin, mean of runs")], r[col("TTFT mean range (ms)")],
			r[col("captured of theoretical")], r[col("missed: same worker / moved / first turn")], r[col("errors (all runs)")]}
		want := []string{tc.label, tc.level, tc.runs, tc.mean, tc.p90, tc.ratio, tc.ratioOfMeans, tc.rng, tc.captured, tc.missed, tc.errors}
		if strings.Join(got, " | ") != strings.Join(want, " | ") {
			t.Errorf("row %d = %v, want %v", tc.row, got, want)
		}
	}
	var html bytes.Buffer
	if err := WriteSweepReport(&html, "sweep", points); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(html.String(), `r="4"`); n != 5*5 {
		t.Errorf("%d markers, want one per policy and level per chart (25)", n)
	}
}
