package engine

import (
	"encoding/json"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites a text segment before pre-tokenization.
type normalizer interface {
	normalize(s string) string
}

type normForm struct{ f norm.Form }

func (n normForm) normalize(s string) string { return n.f.String(s) }

// lowercase is HF's Lowercase: Rust's char::to_lowercase per character, i.e. the Unicode full
// mapping (U+0130 becomes "i\u0307", unlike Go's strings.ToLower) and no Final_Sigma context.
type lowercase struct{}

func (lowercase) normalize(s string) string {
	if !strings.ContainsRune(s, '\u0130') {
		return strings.ToLower(s)
	}
	return strings.ToLower(strings.ReplaceAll(s, "\u0130", "i\u0307"))
}

type strip struct{ left, right bool }

func (n strip) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

type replace struct {
	m       matcher
	content string
}

func (n replace) normalize(s string) string {
	if lm, ok := n.m.(literalMatcher); ok {
		if lm.lit == "" {
			return s
		}
		return strings.ReplaceAll(s, lm.lit, n.content)
	}
	spans := n.m.findAll(nil, s)
	if len(spans) == 0 {
		return s
	}
	var sb strings.Builder
	prev := 0
	for _, sp := range spans {
		sb.WriteString(s[prev:sp.start])
		sb.WriteString(n.content)
		prev = sp.end
	}
	sb.WriteString(s[prev:])
	return sb.String()
}

// prepend adds a prefix to non-empty text (HF leaves empty text alone).
type prepend struct{ p string }

func (n prepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.p + s
}

type normSequence []normalizer

func (n normSequence) normalize(s string) string {
	for _, x := range n {
		s = x.normalize(s)
	}
	return s
}

func buildNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	c, err := parseComponent(raw)
	if err != nil {
		return nil, err
	}
	switch c.Type {
	case "NFC":
		return normForm{norm.NFC}, nil
	case "NFD":
		return normForm{norm.NFD}, nil
	case "NFKC":
		return normForm{norm.NFKC}, nil
	case "NFKD":
		return normForm{norm.NFKD}, nil
	case "Lowercase":
		return lowercase{}, nil
	case "Strip":
		return strip{c.StripLeft, c.StripRight}, nil
	case "Prepend":
		return prepend{c.Prepend}, nil
	case "Replace":
		m, err := buildPattern(c.Pattern)
		if err != nil {
			return nil, err
		}
		return replace{m: m, content: c.Content}, nil
	case "Sequence":
		var seq normSequence
		for _, r := range c.Normalizers {
			n, err := buildNormalizer(r)
			if err != nil {
				return nil, err
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		if len(seq) == 0 {
			return nil, nil
		}
		return seq, nil
	}
	return nil, unsupported("normalizer", c.Type)
}

// buildPattern turns a {"String"|"Regex"} pattern into a matcher, preferring a hand-written scanner.
func buildPattern(p *patternJSON) (matcher, error) {
	switch {
	case p == nil:
		return nil, unsupported("pattern", "missing")
	case p.String != nil:
		return literalMatcher{*p.String}, nil
	case p.Regex != nil:
		if sc, ok := scannerFor(*p.Regex); ok {
			return sc, nil
		}
		return newRegexMatcher(*p.Regex)
	}
	return nil, unsupported("pattern", "empty")
}
