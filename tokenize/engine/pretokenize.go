package engine

import (
	"encoding/json"
	"strings"
	"unicode"
)

// piece is a pre-token. first marks a piece that starts at offset 0 of the original input
// (Metaspace's prepend_scheme "first" depends on it).
type piece struct {
	s     string
	first bool
}

// preTokenizer splits one piece into sub-pieces, appending them to dst.
type preTokenizer interface {
	split(dst []piece, p piece, ws *workspace) []piece
}

// behavior is HF's SplitDelimiterBehavior.
type behavior int

const (
	behRemoved behavior = iota
	behIsolated
	behMergedWithPrevious
	behMergedWithNext
	behContiguous
)

func parseBehavior(s string) (behavior, error) {
	switch s {
	case "Removed":
		return behRemoved, nil
	case "Isolated", "":
		return behIsolated, nil
	case "MergedWithPrevious":
		return behMergedWithPrevious, nil
	case "MergedWithNext":
		return behMergedWithNext, nil
	case "Contiguous":
		return behContiguous, nil
	}
	return 0, unsupported("split behavior", s)
}

// splitPiece splits p on the matches of m with HF's split semantics: the input is cut into
// alternating match / non-match parts, invert swaps the roles, the behavior decides what is kept
// and merged, and empty parts are dropped.
func splitPiece(dst []piece, p piece, m matcher, beh behavior, invert bool, ws *workspace) []piece {
	s := p.s
	if s == "" {
		return dst
	}
	ws.spans = m.findAll(ws.spans[:0], s)
	if beh == behIsolated {
		// Every part is kept on its own, whatever invert says.
		prev := 0
		for _, sp := range ws.spans {
			if sp.start > prev {
				dst = append(dst, piece{s[prev:sp.start], p.first && prev == 0})
			}
			if sp.end > sp.start {
				dst = append(dst, piece{s[sp.start:sp.end], p.first && sp.start == 0})
			}
			prev = sp.end
		}
		if prev < len(s) {
			dst = append(dst, piece{s[prev:], p.first && prev == 0})
		}
		return dst
	}
	parts := ws.parts[:0]
	prev := 0
	for _, sp := range ws.spans {
		if sp.start > prev {
			parts = append(parts, part{span{prev, sp.start}, invert})
		}
		parts = append(parts, part{sp, !invert})
		prev = sp.end
	}
	if prev < len(s) {
		parts = append(parts, part{span{prev, len(s)}, invert})
	}
	out := ws.parts2[:0]
	switch beh {
	case behRemoved:
		for _, pt := range parts {
			if !pt.match {
				out = append(out, pt)
			}
		}
	case behMergedWithPrevious:
		prevMatch := false
		for _, pt := range parts {
			if pt.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].end = pt.end
			} else {
				out = append(out, part{pt.span, false})
			}
			prevMatch = pt.match
		}
	case behMergedWithNext:
		prevMatch := false
		for k := len(parts) - 1; k >= 0; k-- {
			pt := parts[k]
			if pt.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].start = pt.start
			} else {
				out = append(out, part{pt.span, false})
			}
			prevMatch = pt.match
		}
		for a, b := 0, len(out)-1; a < b; a, b = a+1, b-1 {
			out[a], out[b] = out[b], out[a]
		}
	case behContiguous:
		prevMatch := false
		for k, pt := range parts {
			if k > 0 && pt.match == prevMatch {
				out[len(out)-1].end = pt.end
			} else {
				out = append(out, part{pt.span, false})
			}
			prevMatch = pt.match
		}
	}
	for _, pt := range out {
		if pt.end > pt.start {
			dst = append(dst, piece{s[pt.start:pt.end], p.first && pt.start == 0})
		}
	}
	ws.parts, ws.parts2 = parts, out
	return dst
}

type part struct {
	span
	match bool
}

type splitPre struct {
	m      matcher
	beh    behavior
	invert bool
}

func (x splitPre) split(dst []piece, p piece, ws *workspace) []piece {
	return splitPiece(dst, p, x.m, x.beh, x.invert, ws)
}

// byteLevelPre is HF's ByteLevel pre-tokenizer. The engine keeps pieces as raw bytes and maps the
// vocabulary to raw bytes instead, so the byte-to-rune mapping itself is free here.
type byteLevelPre struct {
	addPrefixSpace bool
	re             matcher // GPT-2 split when use_regex
}

func (x byteLevelPre) split(dst []piece, p piece, ws *workspace) []piece {
	if x.addPrefixSpace && !strings.HasPrefix(p.s, " ") {
		p.s = " " + p.s
	}
	if x.re != nil {
		return splitPiece(dst, p, x.re, behIsolated, false, ws)
	}
	if p.s == "" {
		return dst
	}
	return append(dst, p)
}

// runeMatcher matches single runes (individual) or runs of runes satisfying pred.
type runeMatcher struct {
	pred func(rune) bool
	runs bool
}

func (m runeMatcher) findAll(dst []span, s string) []span {
	for i := 0; i < len(s); {
		r, n := runeAt(s, i)
		if !m.pred(r) {
			i += n
			continue
		}
		e := i + n
		for m.runs && e < len(s) {
			r2, n2 := runeAt(s, e)
			if !m.pred(r2) {
				break
			}
			e += n2
		}
		dst = append(dst, span{i, e})
		i = e
	}
	return dst
}

// metaspacePre is HF's Metaspace pre-tokenizer: spaces become the replacement rune, a
// replacement is prepended per prepend_scheme, and the text is split before each replacement.
type metaspacePre struct {
	repl    string
	scheme  string // always, first, never
	doSplit bool
}

func (x metaspacePre) split(dst []piece, p piece, ws *workspace) []piece {
	s := strings.ReplaceAll(p.s, " ", x.repl)
	if !strings.HasPrefix(s, x.repl) && (x.scheme == "always" || (x.scheme == "first" && p.first)) {
		s = x.repl + s
	}
	q := piece{s, p.first}
	if !x.doSplit {
		if s == "" {
			return dst
		}
		return append(dst, q)
	}
	return splitPiece(dst, q, literalMatcher{x.repl}, behMergedWithNext, false, ws)
}

type whitespaceSplitPre struct{}

func (whitespaceSplitPre) split(dst []piece, p piece, ws *workspace) []piece {
	m := runeMatcher{pred: unicode.IsSpace, runs: true}
	return splitPiece(dst, p, m, behRemoved, false, ws)
}

type preSequence []preTokenizer

func (x preSequence) split(dst []piece, p piece, ws *workspace) []piece {
	// Nested sequences each get their own pair of buffers.
	d := ws.seqDepth
	ws.seqDepth++
	for len(ws.seqBufs) < 2*(d+1) {
		ws.seqBufs = append(ws.seqBufs, nil)
	}
	cur := append(ws.seqBufs[2*d][:0], p)
	next := ws.seqBufs[2*d+1][:0]
	for _, stage := range x {
		next = next[:0]
		for _, q := range cur {
			next = stage.split(next, q, ws)
		}
		cur, next = next, cur
	}
	dst = append(dst, cur...)
	ws.seqBufs[2*d], ws.seqBufs[2*d+1] = cur[:0], next[:0]
	ws.seqDepth--
	return dst
}

func isPunctuation(r rune) bool {
	return (r < 0x80 && isASCIIPunct(r)) || unicode.IsPunct(r)
}

// buildPreTokenizer returns the pre-tokenizer and whether its output is byte-level (ByteLevel
// was its last stage).
func buildPreTokenizer(raw json.RawMessage) (pre preTokenizer, byteLevel bool, err error) {
	if isNull(raw) {
		return nil, false, nil
	}
	c, err := parseComponent(raw)
	if err != nil {
		return nil, false, err
	}
	switch c.Type {
	case "Split":
		m, err := buildPattern(c.Pattern)
		if err != nil {
			return nil, false, err
		}
		beh, err := parseBehavior(c.Behavior)
		if err != nil {
			return nil, false, err
		}
		return splitPre{m: m, beh: beh, invert: c.Invert}, false, nil
	case "ByteLevel":
		x := byteLevelPre{addPrefixSpace: c.AddPrefixSpace == nil || *c.AddPrefixSpace}
		if c.UseRegex == nil || *c.UseRegex {
			sc, _ := scannerFor(patGPT2)
			x.re = sc
		}
		return x, true, nil
	case "Digits":
		m := runeMatcher{pred: unicode.IsNumber, runs: !c.IndividualDigits}
		return splitPre{m: m, beh: behIsolated}, false, nil
	case "Metaspace":
		x := metaspacePre{repl: c.Replacement, scheme: c.PrependScheme, doSplit: c.Split == nil || *c.Split}
		if x.repl == "" {
			x.repl = "\u2581"
		}
		if x.scheme == "" {
			x.scheme = "always"
			if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
				x.scheme = "never"
			}
		}
		return x, false, nil
	case "WhitespaceSplit":
		return whitespaceSplitPre{}, false, nil
	case "Whitespace":
		m, err := newRegexMatcher(`\w+|[^\w\s]+`)
		if err != nil {
			return nil, false, err
		}
		return splitPre{m: m, beh: behRemoved, invert: true}, false, nil
	case "Punctuation":
		beh, err := parseBehavior(c.Behavior)
		if err != nil {
			return nil, false, err
		}
		return splitPre{m: runeMatcher{pred: isPunctuation}, beh: beh}, false, nil
	case "BertPreTokenizer":
		return preSequence{whitespaceSplitPre{}, splitPre{m: runeMatcher{pred: isPunctuation}, beh: behIsolated}}, false, nil
	case "Sequence":
		var seq preSequence
		for _, r := range c.Pretokenizers {
			p, bl, err := buildPreTokenizer(r)
			if err != nil {
				return nil, false, err
			}
			if p == nil {
				continue
			}
			if byteLevel {
				// The engine works on raw bytes, which is only equivalent when ByteLevel comes last.
				return nil, false, unsupported("pre_tokenizer", "ByteLevel before other pre-tokenizers")
			}
			byteLevel = bl
			if x, ok := p.(byteLevelPre); ok && !x.addPrefixSpace && x.re == nil {
				continue // identity on raw bytes
			}
			seq = append(seq, p)
		}
		if len(seq) == 0 {
			return nil, byteLevel, nil
		}
		if len(seq) == 1 {
			return seq[0], byteLevel, nil
		}
		return seq, byteLevel, nil
	}
	return nil, false, unsupported("pre_tokenizer", c.Type)
}
