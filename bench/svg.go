package bench

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// palette colours series consistently across the report's charts and the PNG.
const palette = "#4e79a7 #f28e2b #59a14f #e15759 #76b7b2 #edc948 #b07aa1 #9c755f"

func seriesColor(i int) string {
	p := strings.Fields(palette)
	return p[i%len(p)]
}

// chart geometry shared by the SVG plots.
const (
	svgW, svgH               = 720, 320
	padL, padR, padT, padB   = 70, 160, 36, 48
	plotW, plotH             = svgW - padL - padR, svgH - padT - padB
	svgFont                  = `font-family="sans-serif"`
	maxPointsPerScatterSerie = 4000
	maxMarkedPoints          = 20
)

// niceMax rounds v up to a round axis top (quarters stay readable).
func niceMax(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.2, 1.6, 2, 2.4, 3, 4, 5, 6, 8, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func svgOpen(b *strings.Builder, title string) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" %s font-size="12">`,
		svgW, svgH, svgW, svgH, svgFont)
	fmt.Fprintf(b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="20" font-size="15" font-weight="bold">%s</text>`,
		padL, html.EscapeString(title))
}

// svgAxes draws the frame, y grid with labels from 0 to ymax, and axis titles.
func svgAxes(b *strings.Builder, ymax float64, xlabel, ylabel string) {
	for i := 0; i <= 4; i++ {
		y := float64(padT) + float64(plotH)*(1-float64(i)/4)
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>`, padL, padL+plotW, y, y)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`, padL-6, y+4, formatNum(ymax*float64(i)/4))
	}
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>`, padL, padT, plotW, plotH)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`, padL+plotW/2, svgH-8, html.EscapeString(xlabel))
	fmt.Fprintf(b, `<text transform="translate(16 %d) rotate(-90)" text-anchor="middle">%s</text>`, padT+plotH/2, html.EscapeString(ylabel))
}

func svgLegend(b *strings.Builder, names []string) {
	for i, n := range names {
		y := padT + 10 + i*18
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`,
			padL+plotW+12, y-10, seriesColor(i), padL+plotW+30, y, html.EscapeString(n))
	}
}

// barSeries is one coloured series of a grouped bar chart.
type barSeries struct {
	name   string
	values []float64
}

// svgBars draws grouped bars: one group per category, one bar per series.
func svgBars(title, ylabel string, cats []string, series []barSeries) string {
	var b strings.Builder
	svgOpen(&b, title)
	top := 0.0
	for _, s := range series {
		for _, v := range s.values {
			top = max(top, v)
		}
	}
	top = niceMax(top)
	svgAxes(&b, top, "", ylabel)
	gw := float64(plotW) / float64(max(len(cats), 1))
	bw := gw * 0.8 / float64(max(len(series), 1))
	for ci, c := range cats {
		x0 := float64(padL) + gw*float64(ci) + gw*0.1
		for si, s := range series {
			v := s.values[ci]
			h := float64(plotH) * v / top
			x := x0 + bw*float64(si)
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s</title></rect>`,
				x, float64(padT+plotH)-h, bw-2, h, seriesColor(si), html.EscapeString(c), html.EscapeString(s.name), formatNum(v))
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10">%s</text>`, x+bw/2-1, float64(padT+plotH)-h-3, formatNum(v))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x0+gw*0.4, padT+plotH+16, html.EscapeString(c))
	}
	names := make([]string, len(series))
	for i, s := range series {
		names[i] = s.name
	}
	if len(series) > 1 {
		svgLegend(&b, names)
	}
	b.WriteString("</svg>")
	return b.String()
}

// xySeries is one series of points of a line or scatter chart.
type xySeries struct {
	name string
	x, y []float64
}

// svgXY draws series as polylines (lines) or dots.
func svgXY(title, xlabel, ylabel string, series []xySeries, lines bool, ymaxFixed float64) string {
	var b strings.Builder
	svgOpen(&b, title)
	xmax, ymax := 0.0, ymaxFixed
	for _, s := range series {
		for i := range s.x {
			xmax = max(xmax, s.x[i])
			if ymaxFixed == 0 {
				ymax = max(ymax, s.y[i])
			}
		}
	}
	xmax, ymax = niceMax(xmax), niceMax(ymax)
	svgAxes(&b, ymax, xlabel, ylabel)
	for i := 0; i <= 4; i++ {
		x := float64(padL) + float64(plotW)*float64(i)/4
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x, padT+plotH+16, formatNum(xmax*float64(i)/4))
	}
	px := func(v float64) float64 { return float64(padL) + float64(plotW)*v/xmax }
	py := func(v float64) float64 { return float64(padT+plotH) - float64(plotH)*min(v, ymax)/ymax }
	names := make([]string, len(series))
	for si, s := range series {
		names[si] = s.name
		step := max(1, len(s.x)/maxPointsPerScatterSerie)
		if lines {
			var pts strings.Builder
			for i := 0; i < len(s.x); i += step {
				fmt.Fprintf(&pts, "%.1f,%.1f ", px(s.x[i]), py(s.y[i]))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, seriesColor(si), pts.String())
			if len(s.x) <= maxMarkedPoints { // few points (e.g. a load sweep): mark each one
				for i := range s.x {
					fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s"/>`, px(s.x[i]), py(s.y[i]), seriesColor(si))
				}
			}
			continue
		}
		for i := 0; i < len(s.x); i += step {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2" fill="%s" fill-opacity="0.6"/>`, px(s.x[i]), py(s.y[i]), seriesColor(si))
		}
	}
	svgLegend(&b, names)
	b.WriteString("</svg>")
	return b.String()
}
