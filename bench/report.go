package bench

import (
	"fmt"
	"html"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"
)

// WriteReport writes one self-contained HTML page (inline CSS and SVG, no scripts or external
// files) comparing the runs; the first run is the baseline of the ratios.
func WriteReport(w io.Writer, title string, runs []*Run) error {
	var b strings.Builder
	esc := html.EscapeString
	fmt.Fprintf(&b, `<!DOCTYPE html><html><head><meta charset="utf-8"><title>%s</title><style>
body{font-family:sans-serif;margin:24px;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}.better{color:#2a7d2a}.worse{color:#b23}
figure{margin:12px 0}small{color:#666}</style></head><body>`, esc(title))
	fmt.Fprintf(&b, "<h1>%s</h1><p><small>kvbench report, generated %s</small></p>", esc(title), time.Now().UTC().Format(time.RFC3339))

	b.WriteString("<h2>Runs</h2><table><tr><th>label</th><th>trace</th><th>format</th><th>mode</th><th>time scale</th><th>requests ok</th><th>errors</th><th>duration (s)</th></tr>")
	for _, r := range runs {
		s := r.Summary
		fmt.Fprintf(&b, "<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%g</td><td>%d</td><td>%d</td><td>%.1f</td></tr>",
			esc(s.Label), esc(s.InputConfig.Trace), esc(string(s.InputConfig.Format)), esc(string(s.InputConfig.Mode)),
			s.InputConfig.TimeScale, s.RequestCount, s.ErrorCount, s.BenchmarkDuration)
	}
	b.WriteString("</table>")

	fmt.Fprintf(&b, "<h2>Comparison</h2><p><small>Ratios against <b>%s</b>.</small></p><table><tr><th>metric</th>", esc(runs[0].Summary.Label))
	for _, r := range runs {
		fmt.Fprintf(&b, "<th>%s</th>", esc(r.Summary.Label))
	}
	b.WriteString("</tr>")
	for _, cr := range compareRows() {
		name := cr.title
		if cr.unit != "" {
			name += " (" + cr.unit + ")"
		}
		fmt.Fprintf(&b, "<tr><td>%s</td>", esc(name))
		base := cr.get(runs[0].Summary)
		for i, r := range runs {
			v := cr.get(r.Summary)
			cell := formatNum(v)
			if i > 0 && base != 0 {
				ratio := v / base
				cls := ""
				if (ratio < 1) == cr.lower && ratio != 1 {
					cls = "better"
				} else if ratio != 1 {
					cls = "worse"
				}
				cell += fmt.Sprintf(` <span class="%s">(%.2fx)</span>`, cls, ratio)
			}
			fmt.Fprintf(&b, "<td>%s</td>", cell)
		}
		b.WriteString("</tr>")
	}
	b.WriteString("</table>")

	labels := make([]string, len(runs))
	for i, r := range runs {
		labels[i] = r.Summary.Label
	}
	b.WriteString("<h2>Time to first token</h2>")
	b.WriteString(figure(headlineSVG(runs)))
	var cdf, overTime []xySeries
	for _, r := range runs {
		ttfts, starts := ttftSeries(r)
		sorted := append([]float64(nil), ttfts...)
		sort.Float64s(sorted)
		c := xySeries{name: r.Summary.Label}
		for i, v := range sorted {
			c.x = append(c.x, v)
			c.y = append(c.y, 100*float64(i+1)/float64(len(sorted)))
		}
		cdf = append(cdf, c)
		overTime = append(overTime, xySeries{name: r.Summary.Label, x: starts, y: ttfts})
	}
	if hasPoints(cdf) {
		b.WriteString(figure(svgXY("TTFT distribution (CDF)", "time to first token (ms)", "% of requests", cdf, true, 100)))
		b.WriteString(figure(svgXY("TTFT over time", "request start (s since run start)", "time to first token (ms)", overTime, false, 0)))
	} else {
		b.WriteString("<p><small>No per-request records beside the summaries: distribution plots omitted.</small></p>")
	}

	b.WriteString("<h2>Prefix cache</h2>")
	cached := barSeries{name: "cached (usage)"}
	theo := barSeries{name: "theoretical hit"}
	captured := barSeries{name: "captured of theoretical"}
	for _, r := range runs {
		cached.values = append(cached.values, r.Summary.CachedTokenRatio)
		theo.values = append(theo.values, r.Summary.TheoreticalPrefixCacheHit)
		captured.values = append(captured.values, r.Summary.CapturedCacheFraction)
	}
	b.WriteString(figure(svgBars("Cached-token ratio per policy", "ratio", labels, []barSeries{cached, theo, captured})))
	b.WriteString("<p><small>theoretical hit: leading trace blocks seen earlier, i.e. an infinite cache on one " +
		"worker; captured of theoretical: cached tokens reported by the workers / the prompt tokens that " +
		"theoretical cache would have served.</small></p>")

	b.WriteString("<h2>Worker load</h2>")
	workers := map[string]bool{}
	for _, r := range runs {
		for w := range r.Summary.WorkerDistribution {
			workers[w] = true
		}
	}
	sameWorkers := true
	for _, r := range runs {
		for w := range r.Summary.WorkerDistribution {
			sameWorkers = sameWorkers && runs[0].Summary.WorkerDistribution[w] > 0
		}
		for w := range runs[0].Summary.WorkerDistribution {
			sameWorkers = sameWorkers && r.Summary.WorkerDistribution[w] > 0
		}
	}
	if len(workers) > 0 && !sameWorkers {
		// The runs used different workers (e.g. fleets run side by side on different ports):
		// compare how evenly each run spread its requests, busiest worker first.
		n := 0
		for _, r := range runs {
			n = max(n, len(r.Summary.WorkerDistribution))
		}
		cats := make([]string, n)
		for i := range cats {
			cats[i] = "busiest #" + strconv.Itoa(i+1)
		}
		var series []barSeries
		for _, r := range runs {
			counts := make([]float64, 0, n)
			for _, c := range r.Summary.WorkerDistribution {
				counts = append(counts, float64(c))
			}
			sort.Sort(sort.Reverse(sort.Float64Slice(counts)))
			for len(counts) < n {
				counts = append(counts, 0)
			}
			series = append(series, barSeries{name: r.Summary.Label, values: counts})
		}
		b.WriteString(figure(svgBars("Requests per worker, busiest first (X-Kvgate-Worker)", "requests", cats, series)))
		b.WriteString("<p><small>The runs used different worker addresses, so workers are ranked by requests " +
			"within each run (a run that used fewer workers shows zeros at the end).</small></p>")
	} else if len(workers) > 0 {
		names := make([]string, 0, len(workers))
		for w := range workers {
			names = append(names, w)
		}
		sort.Strings(names)
		var series []barSeries
		for _, r := range runs {
			s := barSeries{name: r.Summary.Label}
			for _, w := range names {
				s.values = append(s.values, float64(r.Summary.WorkerDistribution[w]))
			}
			series = append(series, s)
		}
		short := make([]string, len(names))
		for i, n := range names {
			short[i] = strings.TrimPrefix(strings.TrimPrefix(n, "http://"), "https://")
		}
		b.WriteString(figure(svgBars("Requests per worker (X-Kvgate-Worker)", "requests", short, series)))
	} else {
		b.WriteString("<p><small>The server sent no X-Kvgate-Worker header (kvgate sends it only with --proxy-expose-routing-headers).</small></p>")
	}

	b.WriteString("<h2>Errors</h2><table><tr><th>run</th><th>kind</th><th>count</th></tr>")
	for _, r := range runs {
		for _, k := range sortedCounts(r.Summary.ErrorSummary) {
			fmt.Fprintf(&b, "<tr><td>%s</td><td>%s</td><td>%d</td></tr>", esc(r.Summary.Label), esc(k), r.Summary.ErrorSummary[k])
		}
	}
	b.WriteString("</table></body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func figure(svg string) string { return "<figure>" + svg + "</figure>" }

func hasPoints(s []xySeries) bool {
	for _, x := range s {
		if len(x.x) > 0 {
			return true
		}
	}
	return false
}

// ttftSeries returns the successful requests' TTFTs (ms) and start times (s), in start order.
func ttftSeries(r *Run) (ttft, start []float64) {
	for _, l := range r.Lines {
		if v, ok := l.Metrics["time_to_first_token"]; ok && l.Error == nil {
			ttft = append(ttft, v.Value)
			start = append(start, durationMS(l.Metadata.RequestStartMS).Seconds())
		}
	}
	return ttft, start
}

// headlineSVG is the report's headline: mean and p90 TTFT per run.
func headlineSVG(runs []*Run) string {
	cats, avg, p90 := headline(runs)
	return svgBars("TTFT per policy (lower is better)", "ms", cats, []barSeries{{"mean TTFT", avg}, {"p90 TTFT", p90}})
}

func headline(runs []*Run) (cats []string, avg, p90 []float64) {
	for _, r := range runs {
		cats = append(cats, r.Summary.Label)
		avg = append(avg, r.Summary.TimeToFirstToken.Avg)
		p90 = append(p90, r.Summary.TimeToFirstToken.P90)
	}
	return cats, avg, p90
}
