package apireq

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"

	"github.com/ardanlabs/jinja"
)

// This file reproduces the two Python serialisations vLLM's Anthropic entrypoint applies to
// client values (vllm/entrypoints/anthropic/serving.py): json.dumps with its defaults
// (_convert_tool_use_block: separators ", " and ": ", ensure_ascii=True, keys in insertion
// order) and str() of a list of dicts (_convert_tool_result_block, assistant role: Python's
// repr of the raw items).

// pyDumps writes v as Python's json.dumps(v) does with default arguments.
func pyDumps(v jinja.Value) string {
	var b strings.Builder
	dumpValue(&b, v)
	return b.String()
}

func dumpValue(b *strings.Builder, v jinja.Value) {
	switch {
	case v.IsNone(), v.IsUndefined():
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
		b.WriteString(pyFloat(v.AsFloat()))
	case v.IsString():
		dumpString(b, v.AsString())
	case v.IsList():
		b.WriteByte('[')
		for i, it := range v.AsList().Items {
			if i > 0 {
				b.WriteString(", ")
			}
			dumpValue(b, it)
		}
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		b.WriteByte('{')
		for i, k := range d.Keys {
			if i > 0 {
				b.WriteString(", ")
			}
			dumpString(b, k)
			b.WriteString(": ")
			dumpValue(b, d.Data[k])
		}
		b.WriteByte('}')
	default:
		dumpString(b, v.String())
	}
}

// dumpString is json.dumps of a str with ensure_ascii=True: everything outside printable
// ASCII is escaped, characters beyond the BMP as UTF-16 surrogate pairs.
func dumpString(b *strings.Builder, s string) {
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
			case r >= 0x20 && r <= 0x7e:
				b.WriteRune(r)
			case r > 0xffff:
				r1, r2 := utf16.EncodeRune(r)
				writeU(b, r1)
				writeU(b, r2)
			default:
				writeU(b, r)
			}
		}
	}
	b.WriteByte('"')
}

func writeU(b *strings.Builder, r rune) {
	const hex = "0123456789abcdef"
	b.WriteString(`\u`)
	for shift := 12; shift >= 0; shift -= 4 {
		b.WriteByte(hex[(r>>shift)&0xf])
	}
}

// pyFloat is Python's repr(float): the shortest round-tripping digits, in positional notation
// unless the decimal exponent is below -4 or at least 16, always with a ".0" or an exponent.
func pyFloat(f float64) string {
	switch {
	case f != f:
		return "NaN"
	case f > 1.7976931348623157e308:
		return "Infinity"
	case f < -1.7976931348623157e308:
		return "-Infinity"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // e.g. -1.2345e+06
	sign := ""
	if e[0] == '-' {
		sign, e = "-", e[1:]
	}
	mant, expS, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expS)
	digits := strings.Replace(mant, ".", "", 1)
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := strconv.Itoa(abs(exp))
		if len(es) < 2 {
			es = "0" + es
		}
		if exp < 0 {
			return sign + m + "e-" + es
		}
		return sign + m + "e+" + es
	}
	if exp < 0 {
		return sign + "0." + strings.Repeat("0", -exp-1) + digits
	}
	if len(digits) <= exp+1 {
		return sign + digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	}
	return sign + digits[:exp+1] + "." + digits[exp+1:]
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// pyRepr writes v as Python's repr() of the value json.loads would give: single-quoted strings
// (double quotes when the text has a single quote and no double quote), True/False/None,
// dicts and lists with ", " and ": ".
func pyRepr(v jinja.Value) string {
	var b strings.Builder
	reprValue(&b, v)
	return b.String()
}

func reprValue(b *strings.Builder, v jinja.Value) {
	switch {
	case v.IsNone(), v.IsUndefined():
		b.WriteString("None")
	case v.IsBool():
		if v.AsBool() {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		f := v.AsFloat()
		switch {
		case f != f:
			b.WriteString("nan")
		case f > 1.7976931348623157e308:
			b.WriteString("inf")
		case f < -1.7976931348623157e308:
			b.WriteString("-inf")
		default:
			b.WriteString(pyFloat(f))
		}
	case v.IsString():
		reprString(b, v.AsString())
	case v.IsList():
		b.WriteByte('[')
		for i, it := range v.AsList().Items {
			if i > 0 {
				b.WriteString(", ")
			}
			reprValue(b, it)
		}
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		b.WriteByte('{')
		for i, k := range d.Keys {
			if i > 0 {
				b.WriteString(", ")
			}
			reprString(b, k)
			b.WriteString(": ")
			reprValue(b, d.Data[k])
		}
		b.WriteByte('}')
	default:
		reprString(b, v.String())
	}
}

// reprString is Python's repr(str) (unicode_repr in CPython's Objects/unicodeobject.c).
func reprString(b *strings.Builder, s string) {
	quote := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		quote = '"'
	}
	b.WriteByte(quote)
	for _, r := range s {
		switch {
		case r == rune(quote) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			b.WriteString(`\x`)
			b.WriteString(hex2(int(r)))
		case r < 0x7f:
			b.WriteRune(r)
		case unicode.IsPrint(r):
			b.WriteRune(r)
		case r <= 0xff:
			b.WriteString(`\x`)
			b.WriteString(hex2(int(r)))
		case r <= 0xffff:
			b.WriteString(`\u`)
			b.WriteString(hexN(int(r), 4))
		default:
			b.WriteString(`\U`)
			b.WriteString(hexN(int(r), 8))
		}
	}
	b.WriteByte(quote)
}

func hex2(n int) string { return hexN(n, 2) }

func hexN(n, width int) string {
	s := strconv.FormatInt(int64(n), 16)
	for len(s) < width {
		s = "0" + s
	}
	return s
}
