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
// and one curve per policy in each of the four charts, with a marker per load level.
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
	want := []string{"round_robin | 2:0.05 | 40 | 100 | 200", "round_robin | 4:0.02 | 200 | 300 | 600",
		"round_robin | 8:0.01 | 800 | 900 | 1800", "kv | 2:0.05 | 40 | 50 | 100", "kv | 4:0.02 | 200 | 80 | 160",
		"kv | 8:0.01 | 800 | 200 | 400"}
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
	if n := strings.Count(h, "<polyline"); n != 4*2 {
		t.Errorf("%d curves, want 4 charts × 2 policies", n)
	}
	if n := strings.Count(h, `r="4"`); n != 4*6 {
		t.Errorf("%d markers, want one per point per chart (24)", n)
	}
	if err := WriteSweepMarkdown(&md, nil); err == nil {
		t.Error("empty sweep: no error")
	}
}
