package chat

import (
	"errors"
	"strings"
)

// A small parser for Jinja expressions, used only to rewrite operators whose semantics the
// engine does not share with Python: `a + b` (Python raises TypeError for str + None, str + int,
// str + dict, and UndefinedError for undefined operands; the engine concatenates), `a ~ b` and
// `{{ x }}` (Python prints None as "None" and floats as repr, e.g. "1.0"). The rewritten
// expressions call Python-exact helpers (pyops.go). Precedence follows Jinja2's parser:
// condexpr < or < and < not < compare < + - < ~ < * / // % < ** < unary < filters/tests/postfix.

type exprNode struct {
	start, end int // token span, end exclusive
	op         string
	kids       []*exprNode
}

var errParse = errors.New("unsupported expression")

type exprParser struct {
	toks []token
	pos  int
}

func (p *exprParser) peek() string {
	if p.pos < len(p.toks) {
		return p.toks[p.pos].text
	}
	return ""
}

func (p *exprParser) peekKind() (tokKind, bool) {
	if p.pos < len(p.toks) {
		return p.toks[p.pos].kind, true
	}
	return 0, false
}

func (p *exprParser) isOp(s string) bool {
	return p.pos < len(p.toks) && p.toks[p.pos].text == s && (p.toks[p.pos].kind == tokOp || p.toks[p.pos].kind == tokName)
}

func (p *exprParser) node(start int, op string, kids ...*exprNode) *exprNode {
	return &exprNode{start: start, end: p.pos, op: op, kids: kids}
}

func (p *exprParser) parseExpr() (*exprNode, error) {
	start := p.pos
	n, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	if p.isOp("if") {
		p.pos++
		cond, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		kids := []*exprNode{n, cond}
		if p.isOp("else") {
			p.pos++
			alt, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			kids = append(kids, alt)
		}
		return p.node(start, "", kids...), nil
	}
	return n, nil
}

func (p *exprParser) parseBinary(next func() (*exprNode, error), ops ...string) (*exprNode, error) {
	start := p.pos
	left, err := next()
	if err != nil {
		return nil, err
	}
	for {
		op := ""
		for _, o := range ops {
			if p.isOp(o) {
				op = o
			}
		}
		if op == "" {
			return left, nil
		}
		p.pos++
		right, err := next()
		if err != nil {
			return nil, err
		}
		left = p.node(start, op, left, right)
	}
}

func (p *exprParser) parseOr() (*exprNode, error) { return p.parseBinary(p.parseAnd, "or") }

func (p *exprParser) parseAnd() (*exprNode, error) { return p.parseBinary(p.parseNot, "and") }

func (p *exprParser) parseNot() (*exprNode, error) {
	if p.isOp("not") {
		start := p.pos
		p.pos++
		n, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		return p.node(start, "", n), nil
	}
	return p.parseCompare()
}

func (p *exprParser) parseCompare() (*exprNode, error) {
	start := p.pos
	left, err := p.parseMath1()
	if err != nil {
		return nil, err
	}
	for {
		switch {
		case p.isOp("==") || p.isOp("!=") || p.isOp("<") || p.isOp(">") || p.isOp("<=") || p.isOp(">=") || p.isOp("in"):
			p.pos++
		case p.isOp("not") && p.pos+1 < len(p.toks) && p.toks[p.pos+1].text == "in":
			p.pos += 2
		default:
			return left, nil
		}
		right, err := p.parseMath1()
		if err != nil {
			return nil, err
		}
		left = p.node(start, "", left, right)
	}
}

func (p *exprParser) parseMath1() (*exprNode, error) {
	return p.parseBinary(p.parseConcat, "+", "-")
}

func (p *exprParser) parseConcat() (*exprNode, error) { return p.parseBinary(p.parseMath2, "~") }

func (p *exprParser) parseMath2() (*exprNode, error) {
	return p.parseBinary(p.parsePow, "*", "/", "//", "%")
}

func (p *exprParser) parsePow() (*exprNode, error) { return p.parseBinary(p.parseUnary, "**") }

func (p *exprParser) parseUnary() (*exprNode, error) {
	start := p.pos
	if p.isOp("-") || p.isOp("+") {
		p.pos++
		n, err := p.parseUnaryNoFilter()
		if err != nil {
			return nil, err
		}
		return p.parseFilters(start, p.node(start, "", n))
	}
	n, err := p.parseUnaryNoFilter()
	if err != nil {
		return nil, err
	}
	return p.parseFilters(start, n)
}

func (p *exprParser) parseUnaryNoFilter() (*exprNode, error) {
	start := p.pos
	if p.isOp("-") || p.isOp("+") {
		p.pos++
		n, err := p.parseUnaryNoFilter()
		if err != nil {
			return nil, err
		}
		return p.node(start, "", n), nil
	}
	n, err := p.parsePrimary()
	if err != nil {
		return nil, err
	}
	return p.parsePostfix(start, n)
}

func (p *exprParser) parsePostfix(start int, n *exprNode) (*exprNode, error) {
	for {
		switch {
		case p.isOp("."):
			p.pos++
			if k, ok := p.peekKind(); !ok || (k != tokName && k != tokNumber) {
				return nil, errParse
			}
			p.pos++
			n = p.node(start, "", n)
		case p.isOp("[") || p.isOp("("):
			op := "[]"
			if p.isOp("(") {
				op = "()"
			}
			kids, err := p.parseGroup()
			if err != nil {
				return nil, err
			}
			n = p.node(start, op, append([]*exprNode{n}, kids...)...)
		default:
			return n, nil
		}
	}
}

func (p *exprParser) parseFilters(start int, n *exprNode) (*exprNode, error) {
	for {
		switch {
		case p.isOp("|"):
			p.pos++
			if k, _ := p.peekKind(); k != tokName {
				return nil, errParse
			}
			filter := p.peek()
			p.pos++
			for p.isOp(".") {
				p.pos += 2
			}
			kids := []*exprNode{n}
			if p.isOp("(") {
				args, err := p.parseGroup()
				if err != nil {
					return nil, err
				}
				kids = append(kids, args...)
			}
			n = p.node(start, "|"+filter, kids...)
		case p.isOp("is"):
			p.pos++
			if p.isOp("not") {
				p.pos++
			}
			if k, _ := p.peekKind(); k != tokName {
				return nil, errParse
			}
			p.pos++
			kids := []*exprNode{n}
			if p.isOp("(") {
				args, err := p.parseGroup()
				if err != nil {
					return nil, err
				}
				kids = append(kids, args...)
			} else if k, ok := p.peekKind(); ok && (k == tokString || k == tokNumber || (k == tokName && !stopWords[p.peek()] && p.peek() != "else")) {
				argStart := p.pos
				a, err := p.parsePrimary()
				if err != nil {
					return nil, err
				}
				a, err = p.parsePostfix(argStart, a)
				if err != nil {
					return nil, err
				}
				kids = append(kids, a)
			}
			n = p.node(start, "", kids...)
		case p.isOp("("):
			args, err := p.parseGroup()
			if err != nil {
				return nil, err
			}
			n = p.node(start, "", append([]*exprNode{n}, args...)...)
		default:
			return n, nil
		}
	}
}

func (p *exprParser) parsePrimary() (*exprNode, error) {
	start := p.pos
	k, ok := p.peekKind()
	if !ok {
		return nil, errParse
	}
	switch {
	case k == tokString:
		for {
			p.pos++
			if k2, ok := p.peekKind(); !ok || k2 != tokString {
				break
			}
		}
		return p.node(start, "str"), nil
	case k == tokNumber:
		p.pos++
		return p.node(start, "num"), nil
	case k == tokName && !stopWords[p.peek()]:
		p.pos++
		return p.node(start, "name"), nil
	case p.isOp("(") || p.isOp("[") || p.isOp("{"):
		kids, err := p.parseGroup()
		if err != nil {
			return nil, err
		}
		return p.node(start, "", kids...), nil
	}
	return nil, errParse
}

// parseGroup parses a bracketed group — call arguments, subscripts and slices, tuples, list
// and dict literals — as a list of expressions separated by ',' or ':', with name=value
// keyword arguments and * / ** prefixes allowed.
func (p *exprParser) parseGroup() ([]*exprNode, error) {
	closer := map[string]string{"(": ")", "[": "]", "{": "}"}[p.peek()]
	p.pos++
	var kids []*exprNode
	for {
		if p.isOp(closer) {
			p.pos++
			return kids, nil
		}
		switch {
		case p.isOp(",") || p.isOp(":"):
			p.pos++
			continue
		case p.isOp("*") || p.isOp("**"):
			p.pos++
		}
		if k, _ := p.peekKind(); k == tokName && p.pos+1 < len(p.toks) && p.toks[p.pos+1].text == "=" {
			p.pos += 2
		}
		e, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		kids = append(kids, e)
		if !p.isOp(",") && !p.isOp(":") && !p.isOp(closer) {
			return nil, errParse
		}
	}
}

// hasOps reports whether the tree holds an operator the rewrite replaces.
func hasOps(n *exprNode) bool {
	if n.op == "+" || n.op == "~" {
		return true
	}
	for _, k := range n.kids {
		if hasOps(k) {
			return true
		}
	}
	return false
}

// emit writes the source of n with `+` and `~` replaced by helper calls.
func emit(b *strings.Builder, src string, toks []token, n *exprNode) {
	if n.op == "+" || n.op == "~" {
		// A left-associative chain a + b + c becomes one variadic call (one allocation when
		// every operand is a string) with the same left-to-right semantics.
		fn := addFunc
		if n.op == "~" {
			fn = concatFunc
		}
		b.WriteString(fn + "(")
		for i, o := range chain(n) {
			if i > 0 {
				b.WriteString(", ")
			}
			emit(b, src, toks, o)
		}
		b.WriteString(")")
		return
	}
	pos := toks[n.start].start
	for _, k := range n.kids {
		ks := toks[k.start].start
		b.WriteString(src[pos:ks])
		emit(b, src, toks, k)
		pos = toks[k.end-1].end
	}
	b.WriteString(src[pos:toks[n.end-1].end])
}

// chain returns the operands of a left-associative chain of n's operator, in order.
func chain(n *exprNode) []*exprNode {
	if n.kids[0].op == n.op {
		return append(chain(n.kids[0]), n.kids[1])
	}
	return []*exprNode{n.kids[0], n.kids[1]}
}

// stringFilters always return a str, so printing their result needs no str() conversion.
var stringFilters = map[string]bool{
	"tojson": true, "trim": true, "string": true, "upper": true, "lower": true, "join": true,
	"replace": true, "indent": true, "title": true, "capitalize": true, "e": true, "escape": true,
}

// yieldsString reports whether n always evaluates to a str (or fails), so {{ n }} can print it
// without the str() helper: string literals, `~`, string filters, tojson, and `+` chains with a
// string literal operand (str + anything else raises).
func yieldsString(toks []token, n *exprNode) bool {
	switch {
	case n.op == "str", n.op == "~":
		return true
	case strings.HasPrefix(n.op, "|"):
		return stringFilters[n.op[1:]]
	case n.op == "()":
		return n.kids[0].op == "name" && toks[n.kids[0].start].text == tojsonFunc
	case n.op == "+":
		for _, o := range chain(n) {
			if o.op == "str" || yieldsString(toks, o) && o.op != "+" {
				return true
			}
		}
	}
	return false
}

// Helpers the rewritten templates call (pyops.go).
const (
	addFunc    = "__kvgate_add"
	concatFunc = "__kvgate_concat"
	strFunc    = "__kvgate_str"
)

// rewriteOps rewrites the expressions of every tag of src, last tag first so earlier offsets
// stay valid: `+`/`~` become helper calls and {{ x }} prints through Python's str(). A tag the
// parser does not understand is left as it is.
func rewriteOps(src string) (string, error) {
	tags, err := lexTags(src)
	if err != nil {
		return "", err
	}
	for i := len(tags) - 1; i >= 0; i-- {
		t := tags[i]
		for _, span := range exprSpans(t) {
			toks := t.toks[span[0]:span[1]]
			if len(toks) == 0 {
				continue
			}
			p := &exprParser{toks: toks}
			n, err := p.parseExpr()
			if err != nil || p.pos != len(toks) {
				continue
			}
			wrapStr := !t.stmt && !yieldsString(toks, n)
			if !wrapStr && !hasOps(n) {
				continue
			}
			var b strings.Builder
			if wrapStr {
				b.WriteString(strFunc + "(")
			}
			emit(&b, src, toks, n)
			if wrapStr {
				b.WriteString(")")
			}
			src = src[:toks[0].start] + b.String() + src[toks[len(toks)-1].end:]
		}
	}
	return src, nil
}

// exprSpans returns the token ranges of a tag that are expressions, last first: the whole of
// {{ }}, the condition of if/elif, the value of set, and the iterable (and filter condition) of
// for.
func exprSpans(t tag) [][2]int {
	n := len(t.toks)
	if !t.stmt {
		return [][2]int{{0, n}}
	}
	if n < 2 {
		return nil
	}
	switch t.toks[0].text {
	case "if", "elif":
		return [][2]int{{1, n}}
	case "set":
		for i, tk := range t.toks {
			if tk.text == "=" && tk.kind == tokOp {
				return [][2]int{{i + 1, n}}
			}
		}
	case "for":
		for i, tk := range t.toks {
			if tk.text == "in" && tk.kind == tokName {
				// The iterable ends at a top-level "if" (loop filter) or "recursive".
				depth := 0
				for j := i + 1; j < n; j++ {
					switch t.toks[j].text {
					case "(", "[", "{":
						depth++
					case ")", "]", "}":
						depth--
					case "if":
						if depth == 0 && t.toks[j].kind == tokName {
							return [][2]int{{j + 1, n}, {i + 1, j}}
						}
					case "recursive":
						if depth == 0 && j == n-1 {
							return [][2]int{{i + 1, j}}
						}
					}
				}
				return [][2]int{{i + 1, n}}
			}
		}
	}
	return nil
}
