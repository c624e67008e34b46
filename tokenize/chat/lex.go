package chat

import (
	"fmt"
	"strings"
)

// This file holds a small lexer for Jinja template sources. The engine's AST is not exported,
// yet three things need to see template structure: rewriting `x|tojson(...)` into a call of our
// Python-exact JSON encoder (the engine's filters cannot be replaced), turning HF's
// {% generation %} tags into no-op blocks, and vLLM's detection of whether a template iterates
// over message content parts ("content format").

type tokKind int

const (
	tokName tokKind = iota
	tokString
	tokNumber
	tokOp
)

// token is one lexeme inside a {{ }} or {% %} tag; start/end are byte offsets in the source.
type token struct {
	kind       tokKind
	text       string
	start, end int
}

// tag is one {{ }} or {% %} delimiter pair with its tokens; open/close are the byte offsets of
// the delimiters (open at '{', close just past '}').
type tag struct {
	stmt        bool // {% %} rather than {{ }}
	open, close int
	toks        []token
}

// lexTags returns every expression and statement tag of src in order, skipping comments and the
// bodies of {% raw %} blocks.
func lexTags(src string) ([]tag, error) {
	var tags []tag
	i := 0
	for {
		j := strings.IndexByte(src[i:], '{')
		if j < 0 {
			return tags, nil
		}
		i += j
		if i+1 >= len(src) {
			return tags, nil
		}
		switch src[i+1] {
		case '#':
			end := strings.Index(src[i+2:], "#}")
			if end < 0 {
				return nil, fmt.Errorf("unterminated comment at offset %d", i)
			}
			i += 2 + end + 2
		case '{', '%':
			t, err := lexTag(src, i)
			if err != nil {
				return nil, err
			}
			tags = append(tags, t)
			i = t.close
			if t.stmt && len(t.toks) == 1 && t.toks[0].text == "raw" {
				end := indexEndRaw(src, i)
				if end < 0 {
					return nil, fmt.Errorf("unterminated raw block at offset %d", t.open)
				}
				i = end
			}
		default:
			i++
		}
	}
}

// indexEndRaw finds the offset of the {% endraw %} tag at or after i.
func indexEndRaw(src string, i int) int {
	for {
		j := strings.Index(src[i:], "{%")
		if j < 0 {
			return -1
		}
		k := i + j + 2
		for k < len(src) && (src[k] == '-' || src[k] == '+' || src[k] == ' ' || src[k] == '\t' || src[k] == '\n' || src[k] == '\r') {
			k++
		}
		if strings.HasPrefix(src[k:], "endraw") {
			return i + j
		}
		i = k
	}
}

func lexTag(src string, open int) (tag, error) {
	t := tag{stmt: src[open+1] == '%', open: open}
	closer := "}}"
	if t.stmt {
		closer = "%}"
	}
	i := open + 2
	if i < len(src) && (src[i] == '-' || src[i] == '+') {
		i++
	}
	depth := 0
	for i < len(src) {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case depth == 0 && (c == '-' || c == '+') && strings.HasPrefix(src[i+1:], closer):
			t.close = i + 1 + len(closer)
			return t, nil
		case depth == 0 && strings.HasPrefix(src[i:], closer):
			t.close = i + len(closer)
			return t, nil
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(src) && src[j] != c {
				if src[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(src) {
				return t, fmt.Errorf("unterminated string at offset %d", i)
			}
			t.toks = append(t.toks, token{tokString, src[i : j+1], i, j + 1})
			i = j + 1
		case isNameStart(c):
			j := i + 1
			for j < len(src) && isNameChar(src[j]) {
				j++
			}
			t.toks = append(t.toks, token{tokName, src[i:j], i, j})
			i = j
		case c >= '0' && c <= '9':
			j := i + 1
			for j < len(src) && (isNameChar(src[j]) || src[j] == '.') {
				j++
			}
			t.toks = append(t.toks, token{tokNumber, src[i:j], i, j})
			i = j
		default:
			n := 1
			if i+1 < len(src) {
				switch src[i : i+2] {
				case "**", "//", "==", "!=", "<=", ">=":
					n = 2
				}
			}
			switch c {
			case '(', '[', '{':
				depth++
			case ')', ']', '}':
				depth--
			}
			t.toks = append(t.toks, token{tokOp, src[i : i+n], i, i + n})
			i += n
		}
	}
	return t, fmt.Errorf("unterminated tag at offset %d", open)
}

func isNameStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isNameChar(c byte) bool { return isNameStart(c) || (c >= '0' && c <= '9') }

// stopWords end an operand when walking backwards from a filter.
var stopWords = map[string]bool{
	"and": true, "or": true, "not": true, "in": true, "is": true, "if": true, "else": true,
	"elif": true, "for": true, "set": true, "with": true, "import": true, "from": true, "as": true,
	"macro": true, "call": true, "filter": true, "print": true, "return": true, "recursive": true,
}

// tojsonFunc is the global our rewritten templates call instead of the tojson filter.
const tojsonFunc = "__kvgate_tojson"

// rewriteTemplate prepares an HF chat template for the engine: `X|tojson(args)` becomes
// `__kvgate_tojson((X), args)` and {% generation %}/{% endgeneration %} become an always-true
// if block (same whitespace handling as any block tag, body rendered).
func rewriteTemplate(src string) (string, error) {
	for range 10000 { // one rewrite per pass; templates hold a handful of tojson uses
		tags, err := lexTags(src)
		if err != nil {
			return "", err
		}
		changed := false
		for _, t := range tags {
			if out, ok := rewriteGeneration(src, t); ok {
				src, changed = out, true
				break
			}
			if out, ok := rewriteTojson(src, t); ok {
				src, changed = out, true
				break
			}
		}
		if !changed {
			return src, nil
		}
	}
	return "", fmt.Errorf("template rewrite did not converge")
}

func rewriteGeneration(src string, t tag) (string, bool) {
	if !t.stmt || len(t.toks) != 1 {
		return "", false
	}
	var repl string
	switch t.toks[0].text {
	case "generation":
		repl = "if true"
	case "endgeneration":
		repl = "endif"
	default:
		return "", false
	}
	tk := t.toks[0]
	return src[:tk.start] + repl + src[tk.end:], true
}

func rewriteTojson(src string, t tag) (string, bool) {
	toks := t.toks
	for p := 1; p+1 < len(toks); p++ {
		if toks[p].text != "|" || toks[p+1].kind != tokName || toks[p+1].text != "tojson" {
			continue
		}
		start := operandStart(toks, p)
		if start < 0 {
			continue
		}
		// Arguments of the filter, if any.
		argText, end := "", toks[p+1].end
		if p+2 < len(toks) && toks[p+2].text == "(" && toks[p+2].start == toks[p+1].end+countSpaces(src, toks[p+1].end) {
			closeIdx := matchClose(toks, p+2)
			if closeIdx < 0 {
				continue
			}
			if closeIdx > p+3 {
				argText = ", " + src[toks[p+3].start:toks[closeIdx-1].end]
			}
			end = toks[closeIdx].end
		}
		operand := src[toks[start].start:toks[p-1].end]
		call := tojsonFunc + "((" + operand + ")" + argText + ")"
		return src[:toks[start].start] + call + src[end:], true
	}
	return "", false
}

func countSpaces(src string, i int) int {
	n := 0
	for i+n < len(src) && (src[i+n] == ' ' || src[i+n] == '\t' || src[i+n] == '\n' || src[i+n] == '\r') {
		n++
	}
	return n
}

// operandStart walks back from the filter bar at toks[p] over the primary expression the filter
// applies to (names, literals, attribute and item access, calls, earlier filters of the chain)
// and returns the index of its first token, or -1.
func operandStart(toks []token, p int) int {
	j := p - 1
	for j >= 0 {
		tk := toks[j]
		switch {
		case tk.kind == tokOp && (tk.text == ")" || tk.text == "]" || tk.text == "}"):
			k := matchOpen(toks, j)
			if k < 0 {
				return -1
			}
			if k > 0 && ((toks[k-1].kind == tokName && !stopWords[toks[k-1].text]) ||
				toks[k-1].text == ")" || toks[k-1].text == "]") && tk.text != "}" {
				j = k - 1
				continue
			}
			return k // a parenthesised expression or a literal
		case tk.kind == tokName && !stopWords[tk.text], tk.kind == tokString, tk.kind == tokNumber:
			if j > 0 && (toks[j-1].text == "." || toks[j-1].text == "|") {
				j -= 2
				continue
			}
			return j
		default:
			return -1
		}
	}
	return -1
}

func matchOpen(toks []token, j int) int {
	depth := 0
	for k := j; k >= 0; k-- {
		switch toks[k].text {
		case ")", "]", "}":
			if toks[k].kind == tokOp {
				depth++
			}
		case "(", "[", "{":
			if toks[k].kind == tokOp {
				depth--
				if depth == 0 {
					return k
				}
			}
		}
	}
	return -1
}

func matchClose(toks []token, j int) int {
	depth := 0
	for k := j; k < len(toks); k++ {
		if toks[k].kind != tokOp {
			continue
		}
		switch toks[k].text {
		case "(", "[", "{":
			depth++
		case ")", "]", "}":
			depth--
			if depth == 0 {
				return k
			}
		}
	}
	return -1
}

// ContentFormat is how vLLM hands message content to a template: "string" (text parts joined
// with "\n") or "openai" (a list of {"type": "text", "text": ...} parts).
type ContentFormat string

// The two content formats vLLM distinguishes.
const (
	ContentString ContentFormat = "string"
	ContentOpenAI ContentFormat = "openai"
)

// DetectContentFormat mirrors vLLM's auto-detection: "openai" when the template loops over a
// message's content (`for part in message['content']` or `.content`, possibly filtered or
// sliced), where message is the loop variable of a loop over messages or over a variable
// assigned from messages; "string" otherwise, and for templates it cannot lex.
func DetectContentFormat(src string) ContentFormat {
	tags, err := lexTags(src)
	if err != nil {
		return ContentString
	}
	msgsVars := map[string]bool{"messages": true}
	for changed := true; changed; {
		changed = false
		for _, t := range tags {
			if !t.stmt || len(t.toks) < 4 || t.toks[0].text != "set" || t.toks[1].kind != tokName || t.toks[2].text != "=" {
				continue
			}
			target := t.toks[1].text
			if msgsVars[target] {
				continue
			}
			for v := range msgsVars {
				if accessesVar(t.toks[3:], v, "") {
					msgsVars[target] = true
					changed = true
					break
				}
			}
		}
	}
	msgVars := map[string]bool{}
	forLoops := [][]token{}
	for _, t := range tags {
		if !t.stmt || len(t.toks) < 4 || t.toks[0].text != "for" || t.toks[1].kind != tokName || t.toks[2].text != "in" {
			continue
		}
		iter := t.toks[3:]
		for k, tk := range iter { // drop a trailing "if cond" / "recursive"
			if tk.kind == tokName && (tk.text == "if" || tk.text == "recursive") {
				iter = iter[:k]
				break
			}
		}
		forLoops = append(forLoops, append([]token{t.toks[1]}, iter...))
		for v := range msgsVars {
			if accessesVar(iter, v, "") {
				msgVars[t.toks[1].text] = true
			}
		}
	}
	for _, l := range forLoops {
		for v := range msgVars {
			if accessesVar(l[1:], v, "content") {
				return ContentOpenAI
			}
		}
	}
	return ContentString
}

// accessesVar reports whether the expression toks is the variable v (or v[key] / v.key when key
// is set), optionally followed by slices, filters or tests, the shapes vLLM's AST check accepts.
func accessesVar(toks []token, v, key string) bool {
	if len(toks) == 0 || toks[0].kind != tokName || toks[0].text != v {
		return false
	}
	i := 1
	if key != "" {
		switch {
		case i+2 < len(toks) && toks[i].text == "[" && toks[i+1].kind == tokString && unquote(toks[i+1].text) == key && toks[i+2].text == "]":
			i += 3
		case i+1 < len(toks) && toks[i].text == "." && toks[i+1].text == key:
			i += 2
		default:
			return false
		}
	}
	for i < len(toks) {
		switch toks[i].text {
		case "[": // only slices keep the access a sequence of the variable's elements
			c := matchClose(toks, i)
			if c < 0 {
				return false
			}
			isSlice := false
			for _, tk := range toks[i+1 : c] {
				if tk.text == ":" {
					isSlice = true
				}
			}
			if !isSlice {
				return false
			}
			i = c + 1
		case "|", "is":
			return true // a filter or test over the access
		default:
			return false
		}
	}
	return true
}

func unquote(s string) string {
	if len(s) >= 2 {
		return s[1 : len(s)-1]
	}
	return s
}
