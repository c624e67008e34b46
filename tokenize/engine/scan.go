package engine

import (
	"strings"
	"unicode/utf8"
)

// span is a byte range [start, end) of a pre-tokenizer input.
type span struct{ start, end int }

// matcher finds the successive non-overlapping matches of a Split pattern, leftmost first, with
// the semantics of Oniguruma's find_iter as HF tokenizers uses it.
type matcher interface {
	findAll(dst []span, s string) []span
}

// Hand-written scanners for the Split regexes of the common tokenizer families. Each matchAt
// reproduces the backtracking regex at one position: alternatives are tried in order and each
// quantifier is greedy, so the first alternative that can match decides the match end.
type scannerKind int

const (
	scanCL100K      scannerKind = iota // Llama 3 / GPT-4 style, \p{N}{1,3}
	scanQwen                           // same with single digits
	scanO200K                          // GPT-4o / GPT-OSS style (case-aware letters)
	scanDeepSeek                       // DeepSeek V3 letters/punctuation split
	scanDigits3                        // \p{N}{1,3}
	scanDeepSeekCJK                    // [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+
	scanGPT2                           // GPT-2 ByteLevel pattern
)

// Known patterns, exactly as they appear in tokenizer.json files.
const (
	patCL100K      = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patQwen        = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patO200K       = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patDeepSeek    = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
	patDigits3     = `\p{N}{1,3}`
	patDeepSeekCJK = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
	patGPT2        = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// scannerFor returns the hand-written scanner for pattern, if there is one.
func scannerFor(pattern string) (matcher, bool) {
	switch pattern {
	case patCL100K:
		return scanner{kind: scanCL100K}, true
	case patQwen:
		return scanner{kind: scanQwen}, true
	case patO200K:
		return scanner{kind: scanO200K}, true
	case patDeepSeek:
		return scanner{kind: scanDeepSeek}, true
	case patDigits3:
		return scanner{kind: scanDigits3}, true
	case patDeepSeekCJK:
		return scanner{kind: scanDeepSeekCJK}, true
	case patGPT2:
		return scanner{kind: scanGPT2}, true
	}
	return nil, false
}

type scanner struct{ kind scannerKind }

func (sc scanner) findAll(dst []span, s string) []span {
	for i := 0; i < len(s); {
		e := sc.matchAt(s, i)
		if e <= i {
			_, n := runeAt(s, i)
			i += n
			continue
		}
		dst = append(dst, span{i, e})
		i = e
	}
	return dst
}

// matchAt returns the end of the match starting at i, or -1.
func (sc scanner) matchAt(s string, i int) int {
	switch sc.kind {
	case scanCL100K:
		return matchCL100K(s, i, 3)
	case scanQwen:
		return matchCL100K(s, i, 1)
	case scanO200K:
		return matchO200K(s, i)
	case scanDeepSeek:
		return matchDeepSeek(s, i)
	case scanDigits3:
		r, n := runeAt(s, i)
		if classOf(r)&clN == 0 {
			return -1
		}
		return scanDigits(s, i+n, 2)
	case scanDeepSeekCJK:
		e := i
		for e < len(s) {
			r, n := runeAt(s, e)
			if !isDeepSeekCJK(r) {
				break
			}
			e += n
		}
		if e == i {
			return -1
		}
		return e
	case scanGPT2:
		return matchGPT2(s, i)
	}
	return -1
}

func runeAt(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

func isDeepSeekCJK(r rune) bool {
	return (r >= 0x4e00 && r <= 0x9fa5) || (r >= 0x3040 && r <= 0x309f) || (r >= 0x30a0 && r <= 0x30ff)
}

// scanWhile advances from i over runes whose class intersects mask.
func scanWhile(s string, i int, mask uint16) int {
	for i < len(s) {
		r, n := runeAt(s, i)
		if classOf(r)&mask == 0 {
			return i
		}
		i += n
	}
	return i
}

// scanWhileNot advances from i over runes whose class does not intersect mask.
func scanWhileNot(s string, i int, mask uint16) int {
	for i < len(s) {
		r, n := runeAt(s, i)
		if classOf(r)&mask != 0 {
			return i
		}
		i += n
	}
	return i
}

// scanDigits advances over at most max further \p{N} runes.
func scanDigits(s string, i, max int) int {
	for k := 0; k < max && i < len(s); k++ {
		r, n := runeAt(s, i)
		if classOf(r)&clN == 0 {
			break
		}
		i += n
	}
	return i
}

// scanNewlines advances over [\r\n]* (and '/' when slash is set, for the o200k pattern).
func scanNewlines(s string, i int, slash bool) int {
	for i < len(s) && (s[i] == '\r' || s[i] == '\n' || (slash && s[i] == '/')) {
		i++
	}
	return i
}

func lowerASCII(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + ('a' - 'A')
	}
	return c
}

// matchContraction matches 's|'t|'re|'ve|'m|'ll|'d at i (s[i] must be '\”).
func matchContraction(s string, i int, fold bool) int {
	if i >= len(s) || s[i] != '\'' || i+1 >= len(s) {
		return -1
	}
	at := func(k int) byte {
		if k >= len(s) {
			return 0
		}
		if fold {
			return lowerASCII(s[k])
		}
		return s[k]
	}
	// Oniguruma's case-insensitive match uses Unicode case folding, so U+017F (long s) matches 's'.
	if fold && strings.HasPrefix(s[i+1:], "\u017f") {
		return i + 3
	}
	switch at(i + 1) {
	case 's', 't', 'm', 'd':
		return i + 2
	case 'r', 'v':
		if at(i+2) == 'e' {
			return i + 3
		}
	case 'l':
		if at(i+2) == 'l' {
			return i + 3
		}
	}
	return -1
}

// matchWhitespace matches, at a whitespace rune i, the tail alternatives
// `\s*[\r\n]+|\s+(?!\S)|\s+` (the first one only when newlines is set).
func matchWhitespace(s string, i int, newlines bool) int {
	j, lastNL, lastStart := i, -1, i
	for j < len(s) {
		r, n := runeAt(s, j)
		if classOf(r)&clSpace == 0 {
			break
		}
		lastStart = j
		j += n
		if r == '\r' || r == '\n' {
			lastNL = j
		}
	}
	if newlines && lastNL > 0 {
		// \s* backtracks to the last newline of the run; [\r\n]+ then takes just that one.
		return lastNL
	}
	if j == len(s) || lastStart == i {
		return j
	}
	// \s+(?!\S): give back the last whitespace rune so that the next match can start with it.
	return lastStart
}

func matchCL100K(s string, i int, maxDigits int) int {
	r, n := runeAt(s, i)
	c := classOf(r)
	if r == '\'' {
		if e := matchContraction(s, i, true); e > 0 {
			return e
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c&clL != 0 {
		return scanWhile(s, i+n, clL)
	}
	if r != '\r' && r != '\n' && c&clN == 0 && i+n < len(s) {
		if r2, n2 := runeAt(s, i+n); classOf(r2)&clL != 0 {
			return scanWhile(s, i+n+n2, clL)
		}
	}
	// \p{N}{1,k}
	if c&clN != 0 {
		return scanDigits(s, i+n, maxDigits-1)
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	if e := matchSpacePunct(s, i, r, n, clSpace|clL|clN, false); e > 0 {
		return e
	}
	if c&clSpace != 0 {
		return matchWhitespace(s, i, true)
	}
	return -1
}

// matchSpacePunct matches ` ?[^mask]+[\r\n]*` (mask lists the excluded classes).
func matchSpacePunct(s string, i int, r rune, n int, mask uint16, slash bool) int {
	if r == ' ' && i+1 < len(s) {
		if r2, n2 := runeAt(s, i+1); classOf(r2)&mask == 0 {
			return scanNewlines(s, scanWhileNot(s, i+1+n2, mask), slash)
		}
	}
	if classOf(r)&mask == 0 {
		return scanNewlines(s, scanWhileNot(s, i+n, mask), slash)
	}
	return -1
}

const (
	o200kUpper = clLuLt | clLmLo | clM // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	o200kLower = clLl | clLmLo | clM   // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
)

func matchO200K(s string, i int) int {
	r, n := runeAt(s, i)
	c := classOf(r)
	optPrefix := r != '\r' && r != '\n' && c&(clL|clN) == 0
	for alt := 0; alt < 2; alt++ {
		if optPrefix {
			if e := matchO200KWord(s, i+n, alt); e > 0 {
				return e
			}
		}
		if e := matchO200KWord(s, i, alt); e > 0 {
			return e
		}
	}
	if c&clN != 0 {
		return scanDigits(s, i+n, 2)
	}
	if e := matchSpacePunct(s, i, r, n, clSpace|clL|clN, true); e > 0 {
		return e
	}
	if c&clSpace != 0 {
		return matchWhitespace(s, i, true)
	}
	return -1
}

// matchO200KWord matches, at st, `U*W+C?` (alt 0) or `U+W*C?` (alt 1) where U is the upper class,
// W the lower class and C the optional case-insensitive contraction.
func matchO200KWord(s string, st int, alt int) int {
	k, lastLowerEnd := st, -1
	for k < len(s) {
		r, n := runeAt(s, k)
		cl := classOf(r)
		if cl&o200kUpper == 0 {
			break
		}
		k += n
		if cl&o200kLower != 0 {
			lastLowerEnd = k
		}
	}
	var e int
	if alt == 0 {
		nextLower := false
		if k < len(s) {
			r, _ := runeAt(s, k)
			nextLower = classOf(r)&o200kLower != 0
		}
		switch {
		case nextLower:
			e = scanWhile(s, k, o200kLower)
		case lastLowerEnd > 0:
			// U* backtracks to the last rune that is also in W; W+ takes that one rune.
			e = lastLowerEnd
		default:
			return -1
		}
	} else {
		if k == st {
			return -1
		}
		e = scanWhile(s, k, o200kLower)
	}
	if e2 := matchContraction(s, e, true); e2 > 0 {
		return e2
	}
	return e
}

func matchDeepSeek(s string, i int) int {
	r, n := runeAt(s, i)
	c := classOf(r)
	// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
	if isASCIIPunct(r) && i+1 < len(s) && isASCIIAlpha(s[i+1]) {
		e := i + 2
		for e < len(s) && isASCIIAlpha(s[e]) {
			e++
		}
		return e
	}
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	if r != '\r' && r != '\n' && c&(clL|clP|clS) == 0 && i+n < len(s) {
		if r2, n2 := runeAt(s, i+n); classOf(r2)&(clL|clM) != 0 {
			return scanWhile(s, i+n+n2, clL|clM)
		}
	}
	if c&(clL|clM) != 0 {
		return scanWhile(s, i+n, clL|clM)
	}
	//  ?[\p{P}\p{S}]+[\r\n]*
	if r == ' ' && i+1 < len(s) {
		if r2, n2 := runeAt(s, i+1); classOf(r2)&(clP|clS) != 0 {
			return scanNewlines(s, scanWhile(s, i+1+n2, clP|clS), false)
		}
	}
	if c&(clP|clS) != 0 {
		return scanNewlines(s, scanWhile(s, i+n, clP|clS), false)
	}
	if c&clSpace != 0 {
		return matchWhitespace(s, i, true)
	}
	return -1
}

func isASCIIPunct(r rune) bool {
	return (r >= '!' && r <= '/') || (r >= ':' && r <= '@') || (r >= '[' && r <= '`') || (r >= '{' && r <= '~')
}

func isASCIIAlpha(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') }

func matchGPT2(s string, i int) int {
	r, _ := runeAt(s, i)
	c := classOf(r)
	if r == '\'' {
		if e := matchContraction(s, i, false); e > 0 {
			return e
		}
	}
	// ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
	st, sc := i, c
	if r == ' ' && i+1 < len(s) {
		r2, _ := runeAt(s, i+1)
		if c2 := classOf(r2); c2&clSpace == 0 {
			st, sc = i+1, c2
		}
	}
	switch {
	case sc&clL != 0:
		return scanWhile(s, st, clL)
	case sc&clN != 0:
		return scanWhile(s, st, clN)
	case sc&clSpace == 0:
		return scanWhileNot(s, st, clSpace|clL|clN)
	}
	return matchWhitespace(s, i, false)
}
