package engine

import "unicode"

// Rune class bits used by the hand-written pre-tokenizer scanners. The sets follow Oniguruma's
// Unicode definitions, which HF tokenizers uses for Split regexes: \s is the White_Space property,
// \p{L}/\p{N}/\p{M}/\p{P}/\p{S} are the general categories.
const (
	clL     uint16 = 1 << iota // \p{L}
	clLuLt                     // \p{Lu} or \p{Lt}
	clLl                       // \p{Ll}
	clLmLo                     // \p{Lm} or \p{Lo}
	clM                        // \p{M}
	clN                        // \p{N}
	clP                        // \p{P}
	clS                        // \p{S}
	clSpace                    // \s
)

// bmpClasses caches the class bits of every BMP rune. It is computed once at start-up and only
// read afterwards.
var bmpClasses = buildBMPClasses()

func buildBMPClasses() *[0x10000]uint16 {
	var t [0x10000]uint16
	for r := rune(0); r < 0x10000; r++ {
		t[r] = computeClass(r)
	}
	return &t
}

func computeClass(r rune) uint16 {
	var c uint16
	switch {
	case unicode.IsLetter(r):
		c |= clL
		switch {
		case unicode.Is(unicode.Lu, r) || unicode.Is(unicode.Lt, r):
			c |= clLuLt
		case unicode.Is(unicode.Ll, r):
			c |= clLl
		default:
			c |= clLmLo
		}
	case unicode.IsMark(r):
		c |= clM
	case unicode.IsNumber(r):
		c |= clN
	case unicode.IsPunct(r):
		c |= clP
	case unicode.IsSymbol(r):
		c |= clS
	}
	if unicode.IsSpace(r) {
		c |= clSpace
	}
	return c
}

// classOf returns the class bits of r.
func classOf(r rune) uint16 {
	if r >= 0 && r < 0x10000 {
		return bmpClasses[r]
	}
	return computeClass(r)
}
