package bench

import (
	"fmt"
	"html"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SweepPoint is one run of a load sweep: one policy (the run's label) at one load level.
type SweepPoint struct {
	// Users is the number of independent copies of the trace (kvbench --repeat).
	Users int
	// TimeScale is kvbench --time-scale (smaller = the trace's arrivals compressed more).
	TimeScale float64
	Run       *Run
}

// Load is the offered load in units of the trace's own request rate: users ÷ time scale.
func (p SweepPoint) Load() float64 { return float64(p.Users) / p.TimeScale }

// Level is the point's load level as given, USERS:SCALE.
func (p SweepPoint) Level() string {
	return strconv.Itoa(p.Users) + ":" + strconv.FormatFloat(p.TimeScale, 'g', -1, 64)
}

// ParseSweepLevel parses a load level USERS:SCALE (e.g. "4:0.02"): users >= 1, scale > 0.
func ParseSweepLevel(s string) (users int, scale float64, err error) {
	u, sc, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, fmt.Errorf("load level %q: want USERS:TIME_SCALE, e.g. 4:0.02", s)
	}
	users, err = strconv.Atoi(u)
	if err != nil || users < 1 {
		return 0, 0, fmt.Errorf("load level %q: users must be an integer >= 1", s)
	}
	scale, err = strconv.ParseFloat(sc, 64)
	if err != nil || !(scale > 0) || scale > 1e6 {
		return 0, 0, fmt.Errorf("load level %q: time scale must be a number > 0", s)
	}
	return users, scale, nil
}

// sweepMetric is one y axis of the sweep report.
type sweepMetric struct {
	title, unit string
	get         func(*Summary) float64
}

func sweepMetrics() []sweepMetric {
	return []sweepMetric{
		{"TTFT mean", "ms", func(s *Summary) float64 { return s.TimeToFirstToken.Avg }},
		{"TTFT p90", "ms", func(s *Summary) float64 { return s.TimeToFirstToken.P90 }},
		{"request throughput", "req/s", func(s *Summary) float64 { return s.RequestThroughput.Avg }},
		{"output throughput", "tok/s", func(s *Summary) float64 { return s.OutputTokenThroughput.Avg }},
	}
}

// sweepPolicies returns the policy labels in first-seen order and the points sorted by
// policy order, then load.
func sweepPolicies(points []SweepPoint) ([]string, []SweepPoint) {
	var policies []string
	for _, p := range points {
		if !slices.Contains(policies, p.Run.Summary.Label) {
			policies = append(policies, p.Run.Summary.Label)
		}
	}
	sorted := slices.Clone(points)
	slices.SortStableFunc(sorted, func(a, b SweepPoint) int {
		ia, ib := slices.Index(policies, a.Run.Summary.Label), slices.Index(policies, b.Run.Summary.Label)
		if ia != ib {
			return ia - ib
		}
		switch {
		case a.Load() < b.Load():
			return -1
		case a.Load() > b.Load():
			return 1
		}
		return 0
	})
	return policies, sorted
}

// sweepTable is the sweep's table: a header and one row per point.
func sweepTable(points []SweepPoint) [][]string {
	header := []string{"policy", "level (users:scale)", "offered load (× trace)"}
	for _, m := range sweepMetrics() {
		header = append(header, m.title+" ("+m.unit+")")
	}
	header = append(header, "cached ratio", "captured of theoretical", "captured of pooled LRU", "ok", "errors")
	rows := [][]string{header}
	_, sorted := sweepPolicies(points)
	for _, p := range sorted {
		s := p.Run.Summary
		row := []string{s.Label, p.Level(), formatNum(p.Load())}
		for _, m := range sweepMetrics() {
			row = append(row, formatNum(m.get(s)))
		}
		row = append(row, formatNum(s.CachedTokenRatio), formatNum(s.CapturedCacheFraction), formatNum(s.CapturedOfCapacity),
			strconv.Itoa(s.RequestCount), strconv.Itoa(s.ErrorCount))
		rows = append(rows, row)
	}
	return rows
}

// WriteSweepMarkdown writes the sweep as a markdown table, one row per policy and load level.
func WriteSweepMarkdown(w io.Writer, points []SweepPoint) error {
	if len(points) == 0 {
		return fmt.Errorf("sweep: no runs")
	}
	var b strings.Builder
	for i, row := range sweepTable(points) {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
		if i == 0 {
			b.WriteString("|" + strings.Repeat("---|", len(row)) + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteSweepReport writes a self-contained HTML page: mean and p90 TTFT, request and output
// throughput against offered load, one curve per policy, and the table.
func WriteSweepReport(w io.Writer, title string, points []SweepPoint) error {
	if len(points) == 0 {
		return fmt.Errorf("sweep: no runs")
	}
	esc := html.EscapeString
	var b strings.Builder
	fmt.Fprintf(&b, `<!DOCTYPE html><html><head><meta charset="utf-8"><title>%s</title><style>
body{font-family:sans-serif;margin:24px;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}figure{margin:12px 0}small{color:#666}</style></head><body>`, esc(title))
	fmt.Fprintf(&b, "<h1>%s</h1><p><small>kvbench load sweep, generated %s. Offered load = users ÷ time scale, "+
		"in units of the trace's own request rate.</small></p>", esc(title), time.Now().UTC().Format(time.RFC3339))
	policies, sorted := sweepPolicies(points)
	for _, m := range sweepMetrics() {
		series := make([]xySeries, len(policies))
		for i, name := range policies {
			series[i].name = name
		}
		for _, p := range sorted {
			i := slices.Index(policies, p.Run.Summary.Label)
			series[i].x = append(series[i].x, p.Load())
			series[i].y = append(series[i].y, m.get(p.Run.Summary))
		}
		b.WriteString(figure(svgXY(m.title+" against load", "offered load (× trace rate)", m.title+" ("+m.unit+")", series, true, 0)))
	}
	b.WriteString("<h2>Runs</h2><table>")
	for i, row := range sweepTable(points) {
		cell := "td"
		if i == 0 {
			cell = "th"
		}
		b.WriteString("<tr>")
		for _, c := range row {
			fmt.Fprintf(&b, "<%s>%s</%s>", cell, esc(c), cell)
		}
		b.WriteString("</tr>")
	}
	b.WriteString("</table></body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
