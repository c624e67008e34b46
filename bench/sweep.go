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
		{"goodput", "req/s", func(s *Summary) float64 { return s.Goodput }},
		{"output throughput", "tok/s", func(s *Summary) float64 { return s.OutputTokenThroughput.Avg }},
	}
}

// sweepCell is one policy at one load level: every run of it (several when the sweep repeats
// each level), summarised by the median of each metric.
type sweepCell struct {
	label string
	users int
	scale float64
	runs  []*Summary
}

func (c *sweepCell) point() SweepPoint { return SweepPoint{Users: c.users, TimeScale: c.scale} }
func (c *sweepCell) load() float64     { return c.point().Load() }
func (c *sweepCell) level() string     { return c.point().Level() }
func (c *sweepCell) key() string       { return c.label + "\x00" + c.level() }

// stat summarises get over the cell's runs (newStat): its P50 is the median a row shows, as a
// single run's chaos (where a saturated fleet evicts whose context) can move a mean TTFT by a
// third; Min and Max are the spread.
func (c *sweepCell) stat(get func(*Summary) float64) Stat {
	vs := make([]float64, len(c.runs))
	for i, s := range c.runs {
		vs[i] = get(s)
	}
	return newStat("", vs)
}

func (c *sweepCell) median(get func(*Summary) float64) float64 { return c.stat(get).P50 }

// meanOverRuns is get averaged over the cell's runs. The median of a few runs is one of them,
// so when runs vary independently the mean moves less from sweep to sweep: the ratio of the
// mean TTFTs averaged over runs is the one to compare when asking whether a sweep repeats
// (docs/benchmarks/2026-12-04-issue-load-sweep.md, "Five runs per level").
func (c *sweepCell) meanOverRuns(get func(*Summary) float64) float64 { return c.stat(get).Avg }

// sweepCells groups the points into one cell per policy and level, and returns the policy
// labels in first-seen order and the cells sorted by policy order, then load, then level.
func sweepCells(points []SweepPoint) ([]string, []*sweepCell) {
	var policies []string
	var cells []*sweepCell
	byKey := map[string]*sweepCell{}
	for _, p := range points {
		s := p.Run.Summary
		if !slices.Contains(policies, s.Label) {
			policies = append(policies, s.Label)
		}
		c := &sweepCell{label: s.Label, users: p.Users, scale: p.TimeScale}
		if have, ok := byKey[c.key()]; ok {
			c = have
		} else {
			byKey[c.key()] = c
			cells = append(cells, c)
		}
		c.runs = append(c.runs, s)
	}
	slices.SortStableFunc(cells, func(a, b *sweepCell) int {
		ia, ib := slices.Index(policies, a.label), slices.Index(policies, b.label)
		if ia != ib {
			return ia - ib
		}
		switch {
		case a.load() < b.load():
			return -1
		case a.load() > b.load():
			return 1
		}
		return strings.Compare(a.level(), b.level())
	})
	return policies, cells
}

// baselineCell is the first policy's cell at c's level (nil when it did not run there).
func baselineCell(policies []string, cells []*sweepCell, c *sweepCell) *sweepCell {
	for _, o := range cells {
		if o.label == policies[0] && o.level() == c.level() {
			return o
		}
	}
	return nil
}

// sweepTable is the sweep's table: a header and one row per policy and level. With repeated
// runs every number is the median over them, the ratios to the first policy (the baseline,
// round_robin in the scripts) are ratios of medians, and the mean TTFT's range shows the spread.
// One more ratio divides the mean TTFTs averaged over the runs (sweepCell.meanOverRuns).
func sweepTable(points []SweepPoint) [][]string {
	policies, cells := sweepCells(points)
	base := policies[0]
	header := []string{"policy", "level (users:scale)", "offered load (× trace)", "runs"}
	for _, m := range sweepMetrics() {
		header = append(header, m.title+" ("+m.unit+")")
	}
	header = append(header, "TTFT mean ÷ "+base, "TTFT p90 ÷ "+base, "TTFT mean ÷ "+base+", mean of runs", "TTFT mean range (ms)",
		"cached ratio", "captured of theoretical", "captured of pooled LRU",
		"missed: same worker / moved / first turn", "ok (per run)", "errors (all runs)")
	rows := [][]string{header}
	mean := func(s *Summary) float64 { return s.TimeToFirstToken.Avg }
	p90 := func(s *Summary) float64 { return s.TimeToFirstToken.P90 }
	for _, c := range cells {
		row := []string{c.label, c.level(), formatNum(c.load()), strconv.Itoa(len(c.runs))}
		for _, m := range sweepMetrics() {
			row = append(row, formatNum(c.median(m.get)))
		}
		baseCell := baselineCell(policies, cells, c)
		median, overRuns := (*sweepCell).median, (*sweepCell).meanOverRuns
		ratio := func(summarise func(*sweepCell, func(*Summary) float64) float64, get func(*Summary) float64) string {
			if baseCell == nil || summarise(baseCell, get) <= 0 {
				return "-"
			}
			return strconv.FormatFloat(summarise(c, get)/summarise(baseCell, get), 'f', 3, 64)
		}
		spread := c.stat(mean)
		errs := 0
		for _, s := range c.runs {
			errs += s.ErrorCount
		}
		row = append(row, ratio(median, mean), ratio(median, p90), ratio(overRuns, mean), formatNum(spread.Min)+"–"+formatNum(spread.Max),
			formatFraction(c.median(func(s *Summary) float64 { return s.CachedTokenRatio })),
			formatFraction(c.median(func(s *Summary) float64 { return s.CapturedCacheFraction })),
			formatFraction(c.median(func(s *Summary) float64 { return s.CapturedOfCapacity })),
			formatFraction(c.median(func(s *Summary) float64 { return s.Missed.or().SameWorkerFraction }))+" / "+
				formatFraction(c.median(func(s *Summary) float64 { return s.Missed.or().MovedFraction }))+" / "+
				formatFraction(c.median(func(s *Summary) float64 { return s.Missed.or().FirstTurnFraction })),
			formatNum(c.median(func(s *Summary) float64 { return float64(s.RequestCount) })),
			strconv.Itoa(errs))
		rows = append(rows, row)
	}
	return rows
}

// formatFraction writes a fraction in [0, 1] with three decimals, 1 and 0 included, so a
// column of them lines up.
func formatFraction(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }

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

// WriteSweepReport writes a self-contained HTML page: mean and p90 TTFT, request throughput, goodput and output
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
		"in units of the trace's own request rate; a level run several times is drawn at the median of its runs.</small></p>", esc(title), time.Now().UTC().Format(time.RFC3339))
	policies, cells := sweepCells(points)
	for _, m := range sweepMetrics() {
		series := make([]xySeries, len(policies))
		for i, name := range policies {
			series[i].name = name
		}
		for _, c := range cells {
			i := slices.Index(policies, c.label)
			series[i].x = append(series[i].x, c.load())
			series[i].y = append(series[i].y, c.median(m.get))
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
