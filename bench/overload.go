package bench

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// OverloadPoint is one run of an overload sweep: one policy (the run's label) at one load level
// named freely (e.g. "1.5x" for 1.5 times the fleet's capacity).
type OverloadPoint struct {
	Level string
	Run   *Run
}

// overloadCell is one policy at one level, over every run of it.
type overloadCell struct {
	level, label string
	runs         []*Summary
}

func (c *overloadCell) stat(get func(*Summary) float64) Stat {
	vs := make([]float64, len(c.runs))
	for i, s := range c.runs {
		vs[i] = get(s)
	}
	return newStat("", vs)
}

func (c *overloadCell) median(get func(*Summary) float64) float64 { return c.stat(get).P50 }

// overloadCells groups the points by level (first-seen order) and policy (first-seen order).
func overloadCells(points []OverloadPoint) []*overloadCell {
	var levels, labels []string
	by := map[[2]string]*overloadCell{}
	for _, p := range points {
		l := p.Run.Summary.Label
		if !slices.Contains(levels, p.Level) {
			levels = append(levels, p.Level)
		}
		if !slices.Contains(labels, l) {
			labels = append(labels, l)
		}
		k := [2]string{p.Level, l}
		if by[k] == nil {
			by[k] = &overloadCell{level: p.Level, label: l}
		}
		by[k].runs = append(by[k].runs, p.Run.Summary)
	}
	var cells []*overloadCell
	for _, lv := range levels {
		for _, l := range labels {
			if c := by[[2]string{lv, l}]; c != nil {
				cells = append(cells, c)
			}
		}
	}
	return cells
}

func goodput(s *Summary) float64 { return s.Goodput }

// overloadTable is the sweep's table: one row per level and policy, each number the median
// over the cell's runs, goodput's range beside it, and goodput's ratio to the baseline policy's
// at the same level (a ratio of medians; "-" when the baseline did not run there or had none).
// Beside the captured fraction of the theoretical hit, the captured fractions of the pooled
// LRU's and of the clairvoyant cache's (0 without kvbench --capacity-tokens) show how much of
// the miss the fleet's size forces under LRU eviction and under any eviction.
func overloadTable(points []OverloadPoint, baseline string) [][]string {
	cells := overloadCells(points)
	header := []string{"level", "policy", "runs", "goodput (req/s)", "goodput range", "goodput ÷ " + baseline,
		"TTFT mean (ms)", "TTFT p90 (ms)", "TTFT p99 (ms)", "captured of theoretical", "captured of pooled LRU", "captured of optimal", "offered (req/s)", "ok", "failed (all runs, by kind)"}
	rows := [][]string{header}
	for _, c := range cells {
		var base *overloadCell
		for _, o := range cells {
			if o.level == c.level && o.label == baseline {
				base = o
			}
		}
		ratio := "-"
		if base != nil && base.median(goodput) > 0 {
			ratio = strconv.FormatFloat(c.median(goodput)/base.median(goodput), 'f', 2, 64)
		}
		g := c.stat(goodput)
		kinds := map[string]int{}
		for _, s := range c.runs {
			for k, n := range s.ErrorSummary {
				kinds[k] += n
			}
		}
		rows = append(rows, []string{c.level, c.label, strconv.Itoa(len(c.runs)),
			strconv.FormatFloat(g.P50, 'f', 3, 64), strconv.FormatFloat(g.Min, 'f', 3, 64) + "–" + strconv.FormatFloat(g.Max, 'f', 3, 64), ratio,
			formatNum(c.median(func(s *Summary) float64 { return s.TimeToFirstToken.Avg })),
			formatNum(c.median(func(s *Summary) float64 { return s.TimeToFirstToken.P90 })),
			formatNum(c.median(func(s *Summary) float64 { return s.TimeToFirstToken.P99 })),
			formatFraction(c.median(func(s *Summary) float64 { return s.CapturedCacheFraction })),
			formatFraction(c.median(func(s *Summary) float64 { return s.CapturedOfCapacity })),
			formatFraction(c.median(func(s *Summary) float64 { return s.CapturedOfOptimal })),
			strconv.FormatFloat(c.median(func(s *Summary) float64 { return s.InputConfig.OfferedRequestRate }), 'f', 3, 64),
			formatNum(c.median(func(s *Summary) float64 { return float64(s.RequestCount) })),
			formatKinds(kinds)})
	}
	return rows
}

// formatKinds writes error counts as "kind n, kind n" sorted by kind, or "0".
func formatKinds(kinds map[string]int) string {
	if len(kinds) == 0 {
		return "0"
	}
	ks := make([]string, 0, len(kinds))
	for k := range kinds {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = k + " " + strconv.Itoa(kinds[k])
	}
	return strings.Join(parts, ", ")
}

// WriteOverloadMarkdown writes the overload sweep as a markdown table (overloadTable).
func WriteOverloadMarkdown(w io.Writer, points []OverloadPoint, baseline string) error {
	if len(points) == 0 {
		return fmt.Errorf("overload: no runs")
	}
	var b strings.Builder
	for i, row := range overloadTable(points, baseline) {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
		if i == 0 {
			b.WriteString("|" + strings.Repeat("---|", len(row)) + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
