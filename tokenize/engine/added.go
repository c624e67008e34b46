package engine

import (
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens.
type addedToken struct {
	id         uint32
	content    string
	singleWord bool
	lstrip     bool
	rstrip     bool
	special    bool
	normalized bool
}

// tokenTrie finds added tokens leftmost-longest, like the Aho-Corasick automaton HF builds with
// MatchKind::LeftmostLongest.
type tokenTrie struct {
	first [256]bool
	edges map[uint64]int32 // node<<8|byte -> child node
	term  []int32          // node -> index into tokens, -1 when not terminal
	nodes int32
}

func newTokenTrie() *tokenTrie {
	return &tokenTrie{edges: make(map[uint64]int32), term: []int32{-1}, nodes: 1}
}

func (t *tokenTrie) insert(s string, tok int32) {
	if s == "" {
		return
	}
	t.first[s[0]] = true
	n := int32(0)
	for i := 0; i < len(s); i++ {
		k := uint64(n)<<8 | uint64(s[i])
		c, ok := t.edges[k]
		if !ok {
			c = t.nodes
			t.nodes++
			t.edges[k] = c
			t.term = append(t.term, -1)
		}
		n = c
	}
	if t.term[n] < 0 {
		t.term[n] = tok
	}
}

// longestAt returns the token index and end of the longest token starting at i, or -1.
func (t *tokenTrie) longestAt(s string, i int) (tok int32, end int) {
	tok, end = -1, -1
	n := int32(0)
	for j := i; j < len(s); j++ {
		c, ok := t.edges[uint64(n)<<8|uint64(s[j])]
		if !ok {
			break
		}
		n = c
		if t.term[n] >= 0 {
			tok, end = t.term[n], j+1
		}
	}
	return tok, end
}

// addedSplit is one part of a text split on added tokens: a token (tok >= 0) or plain text.
type addedSplit struct {
	start, end int
	tok        int32
}

// split cuts s into plain parts and added tokens with HF's find_matches semantics (single_word,
// lstrip and rstrip applied to each match in order).
func (t *tokenTrie) split(dst []addedSplit, s string, tokens []addedToken) []addedSplit {
	startOffset := 0
	for i := 0; i < len(s); {
		if !t.first[s[i]] {
			i++
			continue
		}
		ti, end := t.longestAt(s, i)
		if ti < 0 {
			i++
			continue
		}
		tk := &tokens[ti]
		start, stop := i, end
		i = end
		if tk.singleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if tk.lstrip {
			start = max(spaceLeftmostAtEnd(s[:start]), startOffset)
		}
		if tk.rstrip {
			stop += spaceRightmostAtStart(s[stop:])
			i = stop
		}
		if startOffset < start {
			dst = append(dst, addedSplit{startOffset, start, -1})
		}
		dst = append(dst, addedSplit{start, stop, ti})
		startOffset = stop
	}
	if startOffset < len(s) {
		dst = append(dst, addedSplit{startOffset, len(s), -1})
	}
	return dst
}

func isWordChar(r rune) bool {
	return r == '_' || r == 0x200C || r == 0x200D || unicode.IsLetter(r) || unicode.IsMark(r) ||
		unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Pc, r)
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordChar(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordChar(r)
}

// spaceLeftmostAtEnd returns the offset where the trailing whitespace of s starts.
func spaceLeftmostAtEnd(s string) int {
	i := len(s)
	for i > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if !unicode.IsSpace(r) {
			break
		}
		i -= n
	}
	return i
}

// spaceRightmostAtStart returns the length of the leading whitespace of s.
func spaceRightmostAtStart(s string) int {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += n
	}
	return i
}
