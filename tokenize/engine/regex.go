package engine

import (
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// regexMatcher is the general fallback for Split patterns without a hand-written scanner. It uses
// regexp2 (backtracking, with look-around like Oniguruma); regexp2 reports rune offsets, which
// are mapped back to byte offsets.
type regexMatcher struct {
	re *regexp2.Regexp
}

func newRegexMatcher(pattern string) (*regexMatcher, error) {
	re, err := regexp2.Compile(pattern, regexp2.Unicode)
	if err != nil {
		return nil, fmt.Errorf("compile Split regex %q: %w", pattern, err)
	}
	// Bounded: a pathological pattern must not hang a request forever.
	re.MatchTimeout = 10 * time.Second
	return &regexMatcher{re: re}, nil
}

func (m *regexMatcher) findAll(dst []span, s string) []span {
	if s == "" {
		return dst
	}
	runes := []rune(s)
	// byteOff[k] is the byte offset of rune k.
	byteOff := make([]int, len(runes)+1)
	off := 0
	for k, r := range runes {
		byteOff[k] = off
		off += utf8.RuneLen(r)
	}
	byteOff[len(runes)] = off
	mt, err := m.re.FindRunesMatch(runes)
	for err == nil && mt != nil {
		dst = append(dst, span{byteOff[mt.Index], byteOff[mt.Index+mt.Length]})
		mt, err = m.re.FindNextMatch(mt)
	}
	if err != nil {
		// A partial match list would silently change the tokens: abort the whole call instead.
		// Encode, FromJSON and Load recover this and return it as an error.
		panic(matchError{fmt.Errorf("regex %q: %w", m.re.String(), err)})
	}
	return dst
}

// matchError carries a regexp2 failure (match timeout) out of the matcher interface.
type matchError struct{ err error }

// recoverMatchError turns a matchError panic into *err; other panics continue.
func recoverMatchError(err *error) {
	if r := recover(); r != nil {
		me, ok := r.(matchError)
		if !ok {
			panic(r)
		}
		*err = me.err
	}
}

// literalMatcher matches a literal string (Split and Replace with a String pattern).
type literalMatcher struct{ lit string }

func (m literalMatcher) findAll(dst []span, s string) []span {
	if m.lit == "" {
		return dst
	}
	for i := 0; i+len(m.lit) <= len(s); {
		k := indexFrom(s, m.lit, i)
		if k < 0 {
			break
		}
		dst = append(dst, span{k, k + len(m.lit)})
		i = k + len(m.lit)
	}
	return dst
}
