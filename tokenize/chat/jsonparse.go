package chat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// parseJSON decodes one JSON document straight into template values in a single pass: object
// keys keep their order (Python dicts are insertion ordered; a repeated key keeps its first
// position and takes the last value, as json.loads does), integers stay integers and numbers
// with a fraction or exponent become floats. It is the hot path for 100 KB+ agentic bodies,
// several times faster than encoding/json's token API.
func parseJSON(data []byte) (jinja.Value, error) {
	p := jsonParser{data: data}
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return jinja.Undefined(), err
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return jinja.Undefined(), p.errorf("trailing data")
	}
	return v, nil
}

// maxJSONDepth bounds nesting so hostile bodies cannot exhaust the stack.
const maxJSONDepth = 512

type jsonParser struct {
	data []byte
	pos  int
}

func (p *jsonParser) errorf(format string, args ...any) error {
	return fmt.Errorf("invalid JSON at offset %d: %s", p.pos, fmt.Sprintf(format, args...))
}

func (p *jsonParser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *jsonParser) value(depth int) (jinja.Value, error) {
	if p.pos >= len(p.data) {
		return jinja.Undefined(), p.errorf("unexpected end of input")
	}
	if depth > maxJSONDepth {
		return jinja.Undefined(), p.errorf("nesting deeper than %d", maxJSONDepth)
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		s, err := p.str()
		if err != nil {
			return jinja.Undefined(), err
		}
		return jinja.NewString(s), nil
	case c == 't':
		return p.literal("true", jinja.NewBool(true))
	case c == 'f':
		return p.literal("false", jinja.NewBool(false))
	case c == 'n':
		return p.literal("null", jinja.None())
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	}
	return jinja.Undefined(), p.errorf("unexpected character %q", p.data[p.pos])
}

func (p *jsonParser) literal(word string, v jinja.Value) (jinja.Value, error) {
	if len(p.data)-p.pos < len(word) || string(p.data[p.pos:p.pos+len(word)]) != word {
		return jinja.Undefined(), p.errorf("invalid literal")
	}
	p.pos += len(word)
	return v, nil
}

func (p *jsonParser) object(depth int) (jinja.Value, error) {
	p.pos++ // {
	out := jinja.NewDict()
	d := out.AsDict()
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return out, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return jinja.Undefined(), p.errorf("expected an object key")
		}
		key, err := p.str()
		if err != nil {
			return jinja.Undefined(), err
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return jinja.Undefined(), p.errorf("expected ':'")
		}
		p.pos++
		p.skipSpace()
		v, err := p.value(depth + 1)
		if err != nil {
			return jinja.Undefined(), err
		}
		d.Set(key, v)
		p.skipSpace()
		if p.pos >= len(p.data) {
			return jinja.Undefined(), p.errorf("unterminated object")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return out, nil
		default:
			return jinja.Undefined(), p.errorf("expected ',' or '}'")
		}
	}
}

func (p *jsonParser) array(depth int) (jinja.Value, error) {
	p.pos++ // [
	items := []jinja.Value{}
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return jinja.NewList(items), nil
	}
	for {
		p.skipSpace()
		v, err := p.value(depth + 1)
		if err != nil {
			return jinja.Undefined(), err
		}
		items = append(items, v)
		p.skipSpace()
		if p.pos >= len(p.data) {
			return jinja.Undefined(), p.errorf("unterminated array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return jinja.NewList(items), nil
		default:
			return jinja.Undefined(), p.errorf("expected ',' or ']'")
		}
	}
}

// str reads a string at p.pos (on its opening quote).
func (p *jsonParser) str() (string, error) {
	p.pos++
	start := p.pos
	// Fast path: no escapes.
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			s := string(p.data[start:p.pos])
			p.pos++
			return s, nil
		case c == '\\':
			return p.strSlow(start)
		case c < 0x20:
			return "", p.errorf("control character in string")
		}
		p.pos++
	}
	return "", p.errorf("unterminated string")
}

func (p *jsonParser) strSlow(start int) (string, error) {
	buf := make([]byte, 0, p.pos-start+64)
	buf = append(buf, p.data[start:p.pos]...)
	for p.pos < len(p.data) {
		// Copy the run up to the next quote, backslash or control byte in one append.
		run := p.pos
		for p.pos < len(p.data) {
			c := p.data[p.pos]
			if c == '"' || c == '\\' || c < 0x20 {
				break
			}
			p.pos++
		}
		buf = append(buf, p.data[run:p.pos]...)
		if p.pos >= len(p.data) {
			break
		}
		switch c := p.data[p.pos]; {
		case c == '"':
			p.pos++
			return string(buf), nil
		case c < 0x20:
			return "", p.errorf("control character in string")
		}
		if p.pos+1 >= len(p.data) {
			break
		}
		esc := p.data[p.pos+1]
		p.pos += 2
		switch esc {
		case '"', '\\', '/':
			buf = append(buf, esc)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, err := p.hex4()
			if err != nil {
				return "", err
			}
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if p.pos+1 < len(p.data) && p.data[p.pos] == '\\' && p.data[p.pos+1] == 'u' {
					save := p.pos
					p.pos += 2
					if r2, err = p.hex4(); err != nil {
						return "", err
					}
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						r = dec
					} else {
						p.pos = save
						r = utf8.RuneError
					}
				} else {
					r = utf8.RuneError // a lone surrogate cannot be held in UTF-8
				}
			}
			buf = utf8.AppendRune(buf, r)
		default:
			return "", p.errorf("invalid escape")
		}
	}
	return "", p.errorf("unterminated string")
}

func (p *jsonParser) hex4() (rune, error) {
	if p.pos+4 > len(p.data) {
		return 0, p.errorf("short \\u escape")
	}
	v, err := strconv.ParseUint(string(p.data[p.pos:p.pos+4]), 16, 32)
	if err != nil {
		return 0, p.errorf("invalid \\u escape")
	}
	p.pos += 4
	return rune(v), nil
}

func (p *jsonParser) number() (jinja.Value, error) {
	start := p.pos
	isFloat := false
	if p.data[p.pos] == '-' {
		p.pos++
	}
	digits := func() int {
		n := 0
		for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	if p.pos < len(p.data) && p.data[p.pos] == '0' {
		p.pos++
	} else if digits() == 0 {
		return jinja.Undefined(), p.errorf("invalid number")
	}
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		isFloat = true
		p.pos++
		if digits() == 0 {
			return jinja.Undefined(), p.errorf("invalid number")
		}
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		isFloat = true
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return jinja.Undefined(), p.errorf("invalid number")
		}
	}
	s := string(p.data[start:p.pos])
	if !isFloat {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return jinja.NewInt(i), nil
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return jinja.Undefined(), p.errorf("invalid number")
	}
	return jinja.NewFloat(f), nil
}

// parseTopLazy parses a request body like parseJSON but keeps the elements of a top-level
// "messages" array as raw byte spans of body (decoded later through the message cache); the
// dict then holds an empty list under "messages". rawMsgs is nil when there is no such array.
func parseTopLazy(data []byte) (top jinja.Value, rawMsgs [][]byte, err error) {
	p := jsonParser{data: data}
	p.skipSpace()
	if p.pos >= len(data) || data[p.pos] != '{' {
		v, err := parseJSON(data)
		return v, nil, err
	}
	p.pos++
	out := jinja.NewDict()
	d := out.AsDict()
	p.skipSpace()
	if p.pos < len(data) && data[p.pos] == '}' {
		p.pos++
		p.skipSpace()
		if p.pos != len(data) {
			return jinja.Undefined(), nil, p.errorf("trailing data")
		}
		return out, nil, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(data) || data[p.pos] != '"' {
			return jinja.Undefined(), nil, p.errorf("expected an object key")
		}
		key, err := p.str()
		if err != nil {
			return jinja.Undefined(), nil, err
		}
		p.skipSpace()
		if p.pos >= len(data) || data[p.pos] != ':' {
			return jinja.Undefined(), nil, p.errorf("expected ':'")
		}
		p.pos++
		p.skipSpace()
		if key == "messages" && p.pos < len(data) && data[p.pos] == '[' {
			if rawMsgs, err = p.rawElements(); err != nil {
				return jinja.Undefined(), nil, err
			}
			d.Set(key, jinja.NewList(nil))
		} else {
			v, err := p.value(1)
			if err != nil {
				return jinja.Undefined(), nil, err
			}
			if key == "messages" {
				rawMsgs = nil // a later non-array "messages" replaces an earlier one
			}
			d.Set(key, v)
		}
		p.skipSpace()
		if p.pos >= len(data) {
			return jinja.Undefined(), nil, p.errorf("unterminated object")
		}
		switch data[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			p.skipSpace()
			if p.pos != len(data) {
				return jinja.Undefined(), nil, p.errorf("trailing data")
			}
			return out, rawMsgs, nil
		default:
			return jinja.Undefined(), nil, p.errorf("expected ',' or '}'")
		}
	}
}

// rawElements returns the byte span of each element of the array at p.pos.
func (p *jsonParser) rawElements() ([][]byte, error) {
	p.pos++ // [
	spans := [][]byte{}
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return spans, nil
	}
	for {
		p.skipSpace()
		start := p.pos
		if err := p.skipValue(); err != nil {
			return nil, err
		}
		spans = append(spans, p.data[start:p.pos])
		p.skipSpace()
		if p.pos >= len(p.data) {
			return nil, p.errorf("unterminated array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return spans, nil
		default:
			return nil, p.errorf("expected ',' or ']'")
		}
	}
}

// skipValue moves past one JSON value without building it, validating it as strictly as the
// decoder does (structure, strings and their escapes, numbers, literals, nesting depth): a body
// whose raw spans are kept is still refused whole when any part of it is malformed.
func (p *jsonParser) skipValue() error { return p.skip(1) }

func (p *jsonParser) skip(depth int) error {
	if p.pos >= len(p.data) {
		return p.errorf("unexpected end of input")
	}
	if depth > maxJSONDepth {
		return p.errorf("nesting deeper than %d", maxJSONDepth)
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.skipObject(depth)
	case c == '[':
		return p.skipArray(depth)
	case c == '"':
		return p.skipString()
	case c == 't':
		_, err := p.literal("true", jinja.None())
		return err
	case c == 'f':
		_, err := p.literal("false", jinja.None())
		return err
	case c == 'n':
		_, err := p.literal("null", jinja.None())
		return err
	case c == '-' || (c >= '0' && c <= '9'):
		return p.skipNumber()
	}
	return p.errorf("unexpected character %q", p.data[p.pos])
}

func (p *jsonParser) skipObject(depth int) error {
	p.pos++ // {
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return p.errorf("expected an object key")
		}
		if err := p.skipString(); err != nil {
			return err
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return p.errorf("expected ':'")
		}
		p.pos++
		p.skipSpace()
		if err := p.skip(depth + 1); err != nil {
			return err
		}
		p.skipSpace()
		if p.pos >= len(p.data) {
			return p.errorf("unterminated object")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return nil
		default:
			return p.errorf("expected ',' or '}'")
		}
	}
}

func (p *jsonParser) skipArray(depth int) error {
	p.pos++ // [
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return nil
	}
	for {
		p.skipSpace()
		if err := p.skip(depth + 1); err != nil {
			return err
		}
		p.skipSpace()
		if p.pos >= len(p.data) {
			return p.errorf("unterminated array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return nil
		default:
			return p.errorf("expected ',' or ']'")
		}
	}
}

// skipString moves past the string at p.pos (on its opening quote), checking its escapes and
// refusing control bytes, without building it.
func (p *jsonParser) skipString() error {
	i := p.pos + 1
	for i < len(p.data) {
		// Eight bytes at a time while none is a quote, a backslash or a control byte (the
		// bulk of a long message is plain text).
		for i+8 <= len(p.data) && !specialWord(binary.LittleEndian.Uint64(p.data[i:])) {
			i += 8
		}
		if i >= len(p.data) {
			break
		}
		c := p.data[i]
		switch {
		case c == '"':
			p.pos = i + 1
			return nil
		case c < 0x20:
			p.pos = i
			return p.errorf("control character in string")
		case c == '\\':
			if i+1 >= len(p.data) {
				p.pos = i
				return p.errorf("unterminated string")
			}
			switch p.data[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(p.data) {
					p.pos = i
					return p.errorf("short \\u escape")
				}
				for _, h := range p.data[i+2 : i+6] {
					if !isHex(h) {
						p.pos = i
						return p.errorf("invalid \\u escape")
					}
				}
				i += 6
			default:
				p.pos = i
				return p.errorf("invalid escape")
			}
		default:
			i++
		}
	}
	p.pos = i
	return p.errorf("unterminated string")
}

// specialWord reports whether any byte of x is '"', '\\' or below 0x20 (the classic SWAR
// tests: a byte b is zero when (b-1) & ^b has its top bit set, and below n when (b-n) & ^b
// does, for n <= 0x80).
func specialWord(x uint64) bool {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	q := x ^ (lo * '"')
	b := x ^ (lo * '\\')
	return ((x-lo*0x20)&^x|(q-lo)&^q|(b-lo)&^b)&hi != 0
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// skipNumber moves past a number with JSON's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *jsonParser) skipNumber() error {
	if p.data[p.pos] == '-' {
		p.pos++
	}
	digits := func() int {
		n := 0
		for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	if p.pos < len(p.data) && p.data[p.pos] == '0' {
		p.pos++
	} else if digits() == 0 {
		return p.errorf("invalid number")
	}
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return p.errorf("invalid number")
		}
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return p.errorf("invalid number")
		}
	}
	return nil
}

// EachField calls fn with each member of the JSON object raw, in order: the key as it appears
// between its quotes (escapes not decoded) and the raw JSON of its value, without building any
// value. raw must be valid JSON (a Document's raw message is); anything but an object is an
// error. An error from fn stops the walk and is returned.
func EachField(raw []byte, fn func(key, value []byte) error) error {
	p := jsonParser{data: raw}
	p.skipSpace()
	if p.pos >= len(raw) || raw[p.pos] != '{' {
		return p.errorf("not an object")
	}
	p.pos++
	for {
		p.skipSpace()
		if p.pos < len(raw) && raw[p.pos] == '}' {
			return nil
		}
		if p.pos >= len(raw) || raw[p.pos] != '"' {
			return p.errorf("expected an object key")
		}
		ks := p.pos + 1
		if err := p.skipString(); err != nil {
			return err
		}
		key := raw[ks : p.pos-1]
		p.skipSpace()
		if p.pos >= len(raw) || raw[p.pos] != ':' {
			return p.errorf("expected ':'")
		}
		p.pos++
		p.skipSpace()
		vs := p.pos
		if err := p.skip(1); err != nil {
			return err
		}
		if err := fn(key, raw[vs:p.pos]); err != nil {
			return err
		}
		p.skipSpace()
		if p.pos < len(raw) && raw[p.pos] == ',' {
			p.pos++
		}
	}
}
