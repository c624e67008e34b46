package engine

import (
	"strings"
	"unicode/utf8"
)

// utf8Lossy converts b to a string the way Rust's String::from_utf8_lossy does: each maximal
// ill-formed subsequence becomes one U+FFFD (Go's own conversions differ on truncated sequences).
func utf8Lossy(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.Grow(len(b) + 8)
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || size > 1 {
			sb.Write(b[i : i+size])
			i += size
			continue
		}
		sb.WriteString("\uFFFD")
		i += maximalSubpart(b[i:])
	}
	return sb.String()
}

// maximalSubpart returns the length of the longest prefix of b that starts a well-formed UTF-8
// sequence but is not complete (at least 1).
func maximalSubpart(b []byte) int {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(b); k++ {
		x := b[n]
		if k == 0 {
			if x < lo || x > hi {
				return n
			}
		} else if x < 0x80 || x > 0xBF {
			return n
		}
		n++
	}
	return n
}

// validUTF8 returns s, or a copy with ill-formed sequences replaced as Rust would.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return utf8Lossy([]byte(s))
}
