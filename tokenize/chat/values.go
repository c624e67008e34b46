package chat

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/ardanlabs/jinja"
)

// decodeValue parses one JSON document into template values (see parseJSON).
func decodeValue(data []byte) (jinja.Value, error) { return parseJSON(data) }

// jsonOptions are the json.dumps arguments HF's tojson filter passes through.
type jsonOptions struct {
	ensureASCII bool
	indent      string
	hasIndent   bool
	itemSep     string
	keySep      string
	sortKeys    bool
}

// pyJSON encodes v exactly as Python's json.dumps does with the given options (HF's tojson:
// ensure_ascii=False by default, insertion order, Python float repr).
func pyJSON(b *strings.Builder, v jinja.Value, o *jsonOptions, level int) error {
	switch {
	case v.IsUndefined(), v.IsNone():
		b.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		b.WriteString(pyFloatJSON(v.AsFloat()))
	case v.IsString():
		pyJSONString(b, v.AsString(), o.ensureASCII)
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			o.newline(b, level+1)
			if err := pyJSON(b, it, o, level+1); err != nil {
				return err
			}
		}
		o.newline(b, level)
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		if d.Len() == 0 {
			b.WriteString("{}")
			return nil
		}
		keys := d.Keys
		if o.sortKeys {
			keys = slices.Clone(keys)
			slices.Sort(keys)
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			o.newline(b, level+1)
			pyJSONString(b, k, o.ensureASCII)
			b.WriteString(o.keySep)
			if err := pyJSON(b, d.Data[k], o, level+1); err != nil {
				return err
			}
		}
		o.newline(b, level)
		b.WriteByte('}')
	default:
		return fmt.Errorf("TypeError: object of type %s is not JSON serializable", kindName(v))
	}
	return nil
}

func (o *jsonOptions) newline(b *strings.Builder, level int) {
	if !o.hasIndent {
		return
	}
	b.WriteByte('\n')
	for range level {
		b.WriteString(o.indent)
	}
}

// pyFloatJSON formats f like Python's float.__repr__ (and json.dumps): shortest round-trip
// digits, positional notation for exponents -4 <= e < 16 with at least one decimal, otherwise
// scientific with a signed two-digit exponent.
func pyFloatJSON(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64)
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	if exp >= -4 && exp < 16 {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.ContainsAny(s, ".") {
			s += ".0"
		}
		return s
	}
	sign := "+"
	if exp < 0 {
		sign = "-"
		exp = -exp
	}
	return fmt.Sprintf("%se%s%02d", mant, sign, exp)
}

// pyJSONString writes s as Python's json.dumps writes a str.
func pyJSONString(b *strings.Builder, s string, ensureASCII bool) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20:
				fmt.Fprintf(b, `\u%04x`, r)
			case ensureASCII && r > 0x7e:
				if r > 0xffff {
					r1, r2 := utf16.EncodeRune(r)
					fmt.Fprintf(b, `\u%04x\u%04x`, r1, r2)
				} else {
					fmt.Fprintf(b, `\u%04x`, r)
				}
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

func kindName(v jinja.Value) string {
	switch {
	case v.IsCallable():
		return "function"
	default:
		return "object"
	}
}

// PyJSONDumps is Python's json.dumps(v) with its default arguments: separators ", " and ": ",
// ensure_ascii=True, keys in insertion order, floats as Python's repr. vLLM applies it to
// client values it turns into prompt text (e.g. tool-call arguments in
// vllm/entrypoints/anthropic/serving.py, _convert_tool_use_block). It fails only for a value
// JSON cannot hold (a callable); a value decoded from JSON never fails.
func PyJSONDumps(v jinja.Value) (string, error) {
	var b strings.Builder
	if err := pyJSON(&b, v, &jsonOptions{ensureASCII: true, itemSep: ", ", keySep: ": "}, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

// PyRepr is Python's repr(v) of a JSON value: single-quoted strings (double quotes when the
// text has a single quote and no double quote), True/False/None, ", " and ": " separators.
// vLLM applies it as str() of a list of dicts (vllm/entrypoints/anthropic/serving.py,
// _convert_tool_result_block).
func PyRepr(v jinja.Value) string {
	if v.IsUndefined() {
		return "None"
	}
	return pyRepr(v)
}
