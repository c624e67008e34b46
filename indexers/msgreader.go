package indexers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Decoder errors. A structural error aborts the batch; a wrong type inside a field only
// invalidates that field or event.
var (
	ErrTruncated = errors.New("kv-event payload truncated")
	ErrTooDeep   = errors.New("kv-event payload nested too deeply")
	ErrBadLength = errors.New("kv-event payload declares a length larger than the message")
	ErrNotBatch  = errors.New("kv-event payload is not an array or map batch")
)

// maxDepth bounds recursion when skipping or reading free-form values (extra keys).
const maxDepth = 16

// msgpack type classes returned by kind().
const (
	kNil = iota
	kBool
	kInt
	kFloat
	kStr
	kBin
	kArray
	kMap
	kExt
	kInvalid
)

// reader is a bounds-checked msgpack cursor over one payload. Every declared length is checked
// against the bytes that remain, so a hostile length prefix can never make us allocate more
// than the message size (each array element or map entry takes at least one byte).
type reader struct {
	b []byte
	p int
}

func (r *reader) remaining() int { return len(r.b) - r.p }

func (r *reader) kind() int {
	if r.p >= len(r.b) {
		return kInvalid
	}
	c := r.b[r.p]
	switch {
	case c <= 0x7f || c >= 0xe0:
		return kInt
	case c <= 0x8f:
		return kMap
	case c <= 0x9f:
		return kArray
	case c <= 0xbf:
		return kStr
	}
	switch c {
	case 0xc0:
		return kNil
	case 0xc2, 0xc3:
		return kBool
	case 0xc4, 0xc5, 0xc6:
		return kBin
	case 0xca, 0xcb:
		return kFloat
	case 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3:
		return kInt
	case 0xd9, 0xda, 0xdb:
		return kStr
	case 0xdc, 0xdd:
		return kArray
	case 0xde, 0xdf:
		return kMap
	case 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return kExt
	}
	return kInvalid
}

func (r *reader) need(n int) error {
	if n < 0 || r.remaining() < n {
		return ErrTruncated
	}
	return nil
}

func (r *reader) u8() (byte, error) {
	if err := r.need(1); err != nil {
		return 0, err
	}
	c := r.b[r.p]
	r.p++
	return c, nil
}

func (r *reader) be(n int) (uint64, error) {
	if err := r.need(n); err != nil {
		return 0, err
	}
	var v uint64
	for _, c := range r.b[r.p : r.p+n] {
		v = v<<8 | uint64(c)
	}
	r.p += n
	return v, nil
}

// length reads a length of width n bytes and checks it against the remaining payload, where
// each unit takes at least per bytes.
func (r *reader) length(n, per int) (int, error) {
	v, err := r.be(n)
	if err != nil {
		return 0, err
	}
	if v > uint64(r.remaining()/per) {
		return 0, ErrBadLength
	}
	return int(v), nil
}

func (r *reader) arrayLen() (int, error) {
	c, err := r.u8()
	if err != nil {
		return 0, err
	}
	switch {
	case c >= 0x90 && c <= 0x9f:
		n := int(c & 0x0f)
		if n > r.remaining() {
			return 0, ErrBadLength
		}
		return n, nil
	case c == 0xdc:
		return r.length(2, 1)
	case c == 0xdd:
		return r.length(4, 1)
	}
	return 0, fmt.Errorf("kv-event: expected array, got 0x%02x", c)
}

func (r *reader) mapLen() (int, error) {
	c, err := r.u8()
	if err != nil {
		return 0, err
	}
	switch {
	case c >= 0x80 && c <= 0x8f:
		n := int(c & 0x0f)
		if 2*n > r.remaining() {
			return 0, ErrBadLength
		}
		return n, nil
	case c == 0xde:
		return r.length(2, 2)
	case c == 0xdf:
		return r.length(4, 2)
	}
	return 0, fmt.Errorf("kv-event: expected map, got 0x%02x", c)
}

// bytesVal reads a str or bin and returns a slice aliasing the payload.
func (r *reader) bytesVal() ([]byte, error) {
	c, err := r.u8()
	if err != nil {
		return nil, err
	}
	var n int
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = int(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		n, err = r.length(1, 1)
	case c == 0xda || c == 0xc5:
		n, err = r.length(2, 1)
	case c == 0xdb || c == 0xc6:
		n, err = r.length(4, 1)
	default:
		return nil, fmt.Errorf("kv-event: expected str/bin, got 0x%02x", c)
	}
	if err != nil {
		return nil, err
	}
	if err := r.need(n); err != nil {
		return nil, err
	}
	s := r.b[r.p : r.p+n]
	r.p += n
	return s, nil
}

// intVal reads any msgpack int; the result is the 64-bit pattern and whether it was negative.
func (r *reader) intVal() (uint64, bool, error) {
	c, err := r.u8()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= 0x7f:
		return uint64(c), false, nil
	case c >= 0xe0:
		return uint64(int64(int8(c))), true, nil
	}
	var v uint64
	switch c {
	case 0xcc:
		v, err = r.be(1)
	case 0xcd:
		v, err = r.be(2)
	case 0xce:
		v, err = r.be(4)
	case 0xcf:
		v, err = r.be(8)
	case 0xd0:
		v, err = r.be(1)
		v = uint64(int64(int8(v)))
	case 0xd1:
		v, err = r.be(2)
		v = uint64(int64(int16(v)))
	case 0xd2:
		v, err = r.be(4)
		v = uint64(int64(int32(v)))
	case 0xd3:
		v, err = r.be(8)
	default:
		return 0, false, fmt.Errorf("kv-event: expected int, got 0x%02x", c)
	}
	return v, c >= 0xd0 && int64(v) < 0, err
}

func (r *reader) floatVal() (float64, error) {
	switch r.kind() {
	case kInt:
		u, neg, err := r.intVal()
		if neg {
			return float64(int64(u)), err
		}
		return float64(u), err
	case kFloat:
		c, _ := r.u8()
		if c == 0xca {
			v, err := r.be(4)
			return float64(math.Float32frombits(uint32(v))), err
		}
		v, err := r.be(8)
		return math.Float64frombits(v), err
	}
	return 0, fmt.Errorf("kv-event: expected float")
}

// skip consumes one value of any type.
func (r *reader) skip(depth int) error {
	if depth > maxDepth {
		return ErrTooDeep
	}
	switch r.kind() {
	case kNil, kBool:
		r.p++
		return nil
	case kInt:
		_, _, err := r.intVal()
		return err
	case kFloat:
		_, err := r.floatVal()
		return err
	case kStr, kBin:
		_, err := r.bytesVal()
		return err
	case kArray:
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		for range n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case kMap:
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case kExt:
		return r.skipExt()
	}
	if r.p >= len(r.b) {
		return ErrTruncated
	}
	return fmt.Errorf("kv-event: invalid msgpack byte 0x%02x", r.b[r.p])
}

func (r *reader) skipExt() error {
	c, _ := r.u8()
	var n int
	var err error
	switch c {
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		n = 1 << (c - 0xd4)
	case 0xc7:
		n, err = r.length(1, 1)
	case 0xc8:
		n, err = r.length(2, 1)
	case 0xc9:
		n, err = r.length(4, 1)
	}
	if err != nil {
		return err
	}
	if err := r.need(n + 1); err != nil { // type byte + data
		return err
	}
	r.p += n + 1
	return nil
}

// anyVal reads a free-form value (extra keys) into string, []byte, int64, uint64, float64,
// bool, nil or []any. Maps and ext values are skipped and read as nil.
func (r *reader) anyVal(depth int) (any, error) {
	if depth > maxDepth {
		return nil, ErrTooDeep
	}
	switch r.kind() {
	case kNil:
		r.p++
		return nil, nil
	case kBool:
		c, _ := r.u8()
		return c == 0xc3, nil
	case kInt:
		u, neg, err := r.intVal()
		if neg {
			return int64(u), err
		}
		return u, err
	case kFloat:
		return r.floatVal()
	case kStr:
		b, err := r.bytesVal()
		return string(b), err
	case kBin:
		b, err := r.bytesVal()
		return append([]byte(nil), b...), err
	case kArray:
		n, err := r.arrayLen()
		if err != nil {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = r.anyVal(depth + 1); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, r.skip(depth)
}

// be64 is the 8-byte big-endian helper shared with the frame code.
func be64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }
