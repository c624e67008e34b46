package chat

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"

	"github.com/ardanlabs/jinja"
)

// Python-exact operators for rewritten templates (see exprparse.go).

// pyAdd is Python's a + b (+ c ...) as Jinja2 evaluates it, folded left to right: numbers add,
// strings and lists concatenate, anything else (str + None, str + int, str + dict) is a
// TypeError, and an undefined operand is an UndefinedError.
func pyAdd(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) < 2 {
		return jinja.Undefined(), errors.New("add: two operands expected")
	}
	allStrings := true
	n := 0
	for _, a := range args {
		if !a.IsString() {
			allStrings = false
			break
		}
		n += len(a.AsString())
	}
	if allStrings { // the common case: one allocation for the whole chain
		var b strings.Builder
		b.Grow(n)
		for _, a := range args {
			b.WriteString(a.AsString())
		}
		return jinja.NewString(b.String()), nil
	}
	acc := args[0]
	for _, b := range args[1:] {
		var err error
		if acc, err = pyAdd2(acc, b); err != nil {
			return jinja.Undefined(), err
		}
	}
	return acc, nil
}

func pyAdd2(a, b jinja.Value) (jinja.Value, error) {
	switch {
	case a.IsUndefined() || b.IsUndefined():
		return jinja.Undefined(), errors.New("UndefinedError: an operand of '+' is undefined")
	case a.IsString() && b.IsString():
		return jinja.NewString(a.AsString() + b.AsString()), nil
	case a.IsList() && b.IsList():
		items := make([]jinja.Value, 0, a.AsList().Len()+b.AsList().Len())
		items = append(append(items, a.AsList().Items...), b.AsList().Items...)
		return jinja.NewList(items), nil
	case isPyNumber(a) && isPyNumber(b):
		if a.IsFloat() || b.IsFloat() {
			return jinja.NewFloat(pyFloat(a) + pyFloat(b)), nil
		}
		return jinja.NewInt(pyInt(a) + pyInt(b)), nil
	case a.IsString():
		return jinja.Undefined(), fmt.Errorf("TypeError: can only concatenate str (not \"%s\") to str", pyTypeName(b))
	case a.IsList():
		return jinja.Undefined(), fmt.Errorf("TypeError: can only concatenate list (not \"%s\") to list", pyTypeName(b))
	}
	return jinja.Undefined(), fmt.Errorf("TypeError: unsupported operand type(s) for +: '%s' and '%s'", pyTypeName(a), pyTypeName(b))
}

// pyConcat is Jinja2's a ~ b (~ c ...): every operand converted with str() (undefined prints
// as "").
func pyConcat(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	var b strings.Builder
	for _, a := range args {
		b.WriteString(pyPrint(a))
	}
	return jinja.NewString(b.String()), nil
}

// pyStrCall is what {{ x }} prints: Python's str(x), "" for undefined.
func pyStrCall(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 {
		return jinja.Undefined(), errors.New("str: one operand expected")
	}
	if args[0].IsString() {
		return args[0], nil
	}
	return jinja.NewString(pyPrint(args[0])), nil
}

func isPyNumber(v jinja.Value) bool { return v.IsInt() || v.IsFloat() || v.IsBool() }

func pyFloat(v jinja.Value) float64 {
	switch {
	case v.IsFloat():
		return v.AsFloat()
	case v.IsInt():
		return float64(v.AsInt())
	case v.IsBool() && v.AsBool():
		return 1
	}
	return 0
}

func pyInt(v jinja.Value) int64 {
	switch {
	case v.IsInt():
		return v.AsInt()
	case v.IsBool() && v.AsBool():
		return 1
	}
	return 0
}

func pyTypeName(v jinja.Value) string {
	switch {
	case v.IsNone():
		return "NoneType"
	case v.IsBool():
		return "bool"
	case v.IsInt():
		return "int"
	case v.IsFloat():
		return "float"
	case v.IsString():
		return "str"
	case v.IsList():
		return "list"
	case v.IsDict():
		return "dict"
	case v.IsUndefined():
		return "Undefined"
	}
	return "function"
}

// pyPrint is str(v) for template output: undefined prints as "".
func pyPrint(v jinja.Value) string {
	switch {
	case v.IsUndefined():
		return ""
	case v.IsString():
		return v.AsString()
	}
	return pyRepr(v)
}

// pyRepr is Python's repr() (str() for non-strings at top level).
func pyRepr(v jinja.Value) string {
	switch {
	case v.IsUndefined():
		return ""
	case v.IsNone():
		return "None"
	case v.IsBool():
		if v.AsBool() {
			return "True"
		}
		return "False"
	case v.IsInt():
		return strconv.FormatInt(v.AsInt(), 10)
	case v.IsFloat():
		f := v.AsFloat()
		switch {
		case math.IsNaN(f):
			return "nan"
		case math.IsInf(f, 1):
			return "inf"
		case math.IsInf(f, -1):
			return "-inf"
		}
		return pyFloatJSON(f)
	case v.IsString():
		return pyStrRepr(v.AsString())
	case v.IsList():
		var b strings.Builder
		b.WriteByte('[')
		for i, it := range v.AsList().Items {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(pyRepr(it))
		}
		b.WriteByte(']')
		return b.String()
	case v.IsDict():
		d := v.AsDict()
		var b strings.Builder
		b.WriteByte('{')
		for i, k := range d.Keys {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(pyStrRepr(k))
			b.WriteString(": ")
			b.WriteString(pyRepr(d.Data[k]))
		}
		b.WriteByte('}')
		return b.String()
	}
	return "<function>"
}

// pyStrRepr is repr() of a str: single quotes unless the text has ' and no ".
func pyStrRepr(s string) string {
	q := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == rune(q):
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r > 0x7f && !unicode.IsPrint(r) && r != ' ':
			switch {
			case r <= 0xff:
				fmt.Fprintf(&b, `\x%02x`, r)
			case r <= 0xffff:
				fmt.Fprintf(&b, `\u%04x`, r)
			default:
				fmt.Fprintf(&b, `\U%08x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}
