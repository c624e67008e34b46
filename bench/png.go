package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"strconv"
	"strings"
)

// glyphs is a 5x7 bitmap font (rows top to bottom, '1' = ink) for the PNG's labels; lower-case
// letters are drawn as capitals, unknown runes as blanks. Drawing text ourselves keeps the PNG
// writer on the standard library.
func glyphs() map[rune][7]string {
	return map[rune][7]string{
		'0': {"01110", "10001", "10011", "10101", "11001", "10001", "01110"},
		'1': {"00100", "01100", "00100", "00100", "00100", "00100", "01110"},
		'2': {"01110", "10001", "00001", "00010", "00100", "01000", "11111"},
		'3': {"11111", "00010", "00100", "00010", "00001", "10001", "01110"},
		'4': {"00010", "00110", "01010", "10010", "11111", "00010", "00010"},
		'5': {"11111", "10000", "11110", "00001", "00001", "10001", "01110"},
		'6': {"00110", "01000", "10000", "11110", "10001", "10001", "01110"},
		'7': {"11111", "00001", "00010", "00100", "01000", "01000", "01000"},
		'8': {"01110", "10001", "10001", "01110", "10001", "10001", "01110"},
		'9': {"01110", "10001", "10001", "01111", "00001", "00010", "01100"},
		'A': {"01110", "10001", "10001", "11111", "10001", "10001", "10001"},
		'B': {"11110", "10001", "10001", "11110", "10001", "10001", "11110"},
		'C': {"01110", "10001", "10000", "10000", "10000", "10001", "01110"},
		'D': {"11100", "10010", "10001", "10001", "10001", "10010", "11100"},
		'E': {"11111", "10000", "10000", "11110", "10000", "10000", "11111"},
		'F': {"11111", "10000", "10000", "11110", "10000", "10000", "10000"},
		'G': {"01110", "10001", "10000", "10111", "10001", "10001", "01111"},
		'H': {"10001", "10001", "10001", "11111", "10001", "10001", "10001"},
		'I': {"01110", "00100", "00100", "00100", "00100", "00100", "01110"},
		'J': {"00111", "00010", "00010", "00010", "00010", "10010", "01100"},
		'K': {"10001", "10010", "10100", "11000", "10100", "10010", "10001"},
		'L': {"10000", "10000", "10000", "10000", "10000", "10000", "11111"},
		'M': {"10001", "11011", "10101", "10101", "10001", "10001", "10001"},
		'N': {"10001", "10001", "11001", "10101", "10011", "10001", "10001"},
		'O': {"01110", "10001", "10001", "10001", "10001", "10001", "01110"},
		'P': {"11110", "10001", "10001", "11110", "10000", "10000", "10000"},
		'Q': {"01110", "10001", "10001", "10001", "10101", "10010", "01101"},
		'R': {"11110", "10001", "10001", "11110", "10100", "10010", "10001"},
		'S': {"01111", "10000", "10000", "01110", "00001", "00001", "11110"},
		'T': {"11111", "00100", "00100", "00100", "00100", "00100", "00100"},
		'U': {"10001", "10001", "10001", "10001", "10001", "10001", "01110"},
		'V': {"10001", "10001", "10001", "10001", "10001", "01010", "00100"},
		'W': {"10001", "10001", "10001", "10101", "10101", "10101", "01010"},
		'X': {"10001", "10001", "01010", "00100", "01010", "10001", "10001"},
		'Y': {"10001", "10001", "10001", "01010", "00100", "00100", "00100"},
		'Z': {"11111", "00001", "00010", "00100", "01000", "10000", "11111"},
		'.': {"00000", "00000", "00000", "00000", "00000", "01100", "01100"},
		',': {"00000", "00000", "00000", "00000", "01100", "00100", "01000"},
		'-': {"00000", "00000", "00000", "11111", "00000", "00000", "00000"},
		'_': {"00000", "00000", "00000", "00000", "00000", "00000", "11111"},
		'(': {"00010", "00100", "01000", "01000", "01000", "00100", "00010"},
		')': {"01000", "00100", "00010", "00010", "00010", "00100", "01000"},
		'%': {"11000", "11001", "00010", "00100", "01000", "10011", "00011"},
		':': {"00000", "01100", "01100", "00000", "01100", "01100", "00000"},
		'/': {"00000", "00001", "00010", "00100", "01000", "10000", "00000"},
		'+': {"00000", "00100", "00100", "11111", "00100", "00100", "00000"},
	}
}

// canvas is an RGBA image with the few drawing primitives the headline chart needs.
type canvas struct{ img *image.RGBA }

func (c canvas) rect(x0, y0, x1, y1 int, col color.Color) {
	for y := max(y0, 0); y < y1 && y < c.img.Rect.Dy(); y++ {
		for x := max(x0, 0); x < x1 && x < c.img.Rect.Dx(); x++ {
			c.img.Set(x, y, col)
		}
	}
}

// text draws s with its top-left corner at (x, y), each font pixel scale x scale.
func (c canvas) text(x, y, scale int, s string, col color.Color) {
	font := glyphs()
	for _, r := range strings.ToUpper(s) {
		if g, ok := font[r]; ok {
			for row, bits := range g {
				for i, bit := range bits {
					if bit == '1' {
						c.rect(x+i*scale, y+row*scale, x+(i+1)*scale, y+(row+1)*scale, col)
					}
				}
			}
		}
		x += 6 * scale
	}
}

func textWidth(s string, scale int) int { return len([]rune(s)) * 6 * scale }

func hexColor(h string) color.RGBA {
	v, _ := strconv.ParseUint(strings.TrimPrefix(h, "#"), 16, 32)
	return color.RGBA{uint8(v >> 16), uint8(v >> 8), uint8(v), 255}
}

// WritePNG draws the headline chart (mean and p90 TTFT per run, with each run's cached-token
// ratio under its label) as a PNG.
func WritePNG(w io.Writer, runs []*Run) error {
	const W, H = 960, 540
	const left, right, top, bottom = 110, 40, 80, 110
	c := canvas{image.NewRGBA(image.Rect(0, 0, W, H))}
	white, ink, grid := color.RGBA{255, 255, 255, 255}, color.RGBA{34, 34, 34, 255}, color.RGBA{221, 221, 221, 255}
	c.rect(0, 0, W, H, white)
	c.text(left, 20, 3, "TTFT per policy (lower is better)", ink)

	cats, avg, p90 := headline(runs)
	ymax := 0.0
	for i := range cats {
		ymax = max(ymax, avg[i], p90[i])
	}
	ymax = niceMax(ymax)
	pw, ph := W-left-right, H-top-bottom
	for i := 0; i <= 4; i++ {
		y := top + ph - ph*i/4
		c.rect(left, y, left+pw, y+1, grid)
		lbl := formatNum(ymax*float64(i)/4) + " MS"
		c.text(left-10-textWidth(lbl, 2), y-7, 2, lbl, ink)
	}
	series := []struct {
		name string
		vals []float64
	}{{"mean TTFT", avg}, {"p90 TTFT", p90}}
	gw := pw / max(len(cats), 1)
	bw := gw * 8 / 10 / len(series)
	for ci, cat := range cats {
		x0 := left + gw*ci + gw/10
		for si, s := range series {
			h := int(float64(ph) * s.vals[ci] / ymax)
			x := x0 + bw*si
			c.rect(x, top+ph-h, x+bw-4, top+ph, hexColor(seriesColor(si)))
			v := formatNum(s.vals[ci])
			c.text(x+(bw-4-textWidth(v, 2))/2, top+ph-h-18, 2, v, ink)
		}
		lbl := cat
		if room := gw / 12; len(lbl) > room && room > 3 {
			lbl = lbl[:room]
		}
		c.text(x0+(gw*8/10-textWidth(lbl, 2))/2, top+ph+12, 2, lbl, ink)
		cr := fmt.Sprintf("cached %.2f", runs[ci].Summary.CachedTokenRatio)
		c.text(x0+(gw*8/10-textWidth(cr, 2))/2, top+ph+36, 2, cr, color.RGBA{90, 90, 90, 255})
	}
	c.rect(left, top+ph, left+pw, top+ph+2, ink)
	for si, s := range series {
		x := left + si*220
		c.rect(x, H-34, x+18, H-16, hexColor(seriesColor(si)))
		c.text(x+26, H-32, 2, s.name, ink)
	}
	if err := png.Encode(w, c.img); err != nil {
		return fmt.Errorf("encode png: %w", err)
	}
	return nil
}
