package indexers

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Layout selects which vLLM schema generation the encoder reproduces byte for byte.
type Layout int

const (
	// LayoutMap is vLLM ≥ 0.24: array batch, events as tagged maps with None-valued optional
	// keys omitted (msgspec omit_defaults). The default.
	LayoutMap Layout = iota
	// LayoutArray is v0.22/v0.23: events as tagged arrays with every field present
	// (BlockStored 12 slots, BlockRemoved 4).
	LayoutArray
	// LayoutV090 is v0.9.0: 2-element batch [ts, events], BlockStored 6 slots, BlockRemoved 2
	// (vllm/distributed/kv_events.py at v0.9.0).
	LayoutV090
)

// String names the layout for flags and logs.
func (l Layout) String() string {
	switch l {
	case LayoutMap:
		return "map"
	case LayoutArray:
		return "array"
	case LayoutV090:
		return "v0.9.0"
	}
	return fmt.Sprintf("layout(%d)", int(l))
}

// ParseLayout maps "map", "array" or "v0.9.0" to a Layout.
func ParseLayout(s string) (Layout, error) {
	switch s {
	case "", "map":
		return LayoutMap, nil
	case "array", "v0.23", "legacy":
		return LayoutArray, nil
	case "v0.9.0", "v090":
		return LayoutV090, nil
	}
	return 0, fmt.Errorf("unknown kv-event layout %q (want map, array or v0.9.0)", s)
}

// EncodeOptions selects the wire variant produced by EncodeBatch.
type EncodeOptions struct {
	Layout Layout
	// BytesHashes writes every int hash as a 32-byte bin (24 zero bytes ‖ U big-endian), the shape
	// of VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0; hashes that carry Raw are always written as bytes.
	BytesHashes bool
}

// EncodeBatch encodes a batch exactly as msgspec would for the chosen layout; the payload is
// frame 2 of a live message (see LiveFrames).
func EncodeBatch(b *EventBatch, opt EncodeOptions) ([]byte, error) {
	return AppendBatch(make([]byte, 0, 256), b, opt)
}

// AppendBatch is EncodeBatch appending to dst.
func AppendBatch(dst []byte, b *EventBatch, opt EncodeOptions) ([]byte, error) {
	w := writer{buf: dst, opt: opt}
	if opt.Layout == LayoutV090 {
		w.arrayHdr(2)
	} else {
		w.arrayHdr(3)
	}
	w.float(b.TS)
	w.arrayHdr(len(b.Events))
	for _, ev := range b.Events {
		var err error
		switch e := ev.(type) {
		case *BlockStored:
			err = w.stored(e)
		case *BlockRemoved:
			w.removed(e)
		case *AllBlocksCleared:
			w.cleared()
		default:
			err = fmt.Errorf("encode: unsupported event %T", ev)
		}
		if err != nil {
			return dst, err
		}
	}
	if opt.Layout != LayoutV090 {
		w.optInt(b.DPRank)
	}
	return w.buf, nil
}

// writer implements msgspec's msgpack encoding (msgspec _core.c,
// mpack_encode_*: smallest ints, float64 always,
// str/bin/array headers by length).
type writer struct {
	buf []byte
	opt EncodeOptions
}

func (w *writer) nil() { w.buf = append(w.buf, 0xc0) }
func (w *writer) float(f float64) {
	w.buf = binary.BigEndian.AppendUint64(append(w.buf, 0xcb), math.Float64bits(f))
}

func (w *writer) uint(u uint64) {
	switch {
	case u < 128:
		w.buf = append(w.buf, byte(u))
	case u <= math.MaxUint8:
		w.buf = append(w.buf, 0xcc, byte(u))
	case u <= math.MaxUint16:
		w.buf = binary.BigEndian.AppendUint16(append(w.buf, 0xcd), uint16(u))
	case u <= math.MaxUint32:
		w.buf = binary.BigEndian.AppendUint32(append(w.buf, 0xce), uint32(u))
	default:
		w.buf = binary.BigEndian.AppendUint64(append(w.buf, 0xcf), u)
	}
}

func (w *writer) int(i int64) {
	switch {
	case i >= 0:
		w.uint(uint64(i))
	case i >= -32:
		w.buf = append(w.buf, byte(i))
	case i >= math.MinInt8:
		w.buf = append(w.buf, 0xd0, byte(i))
	case i >= math.MinInt16:
		w.buf = binary.BigEndian.AppendUint16(append(w.buf, 0xd1), uint16(i))
	case i >= math.MinInt32:
		w.buf = binary.BigEndian.AppendUint32(append(w.buf, 0xd2), uint32(i))
	default:
		w.buf = binary.BigEndian.AppendUint64(append(w.buf, 0xd3), uint64(i))
	}
}

func (w *writer) optInt(o Opt[int64]) {
	if !o.Set {
		w.nil()
		return
	}
	w.int(o.V)
}

func (w *writer) str(s string) {
	n := len(s)
	switch {
	case n < 32:
		w.buf = append(w.buf, 0xa0|byte(n))
	case n <= math.MaxUint8:
		w.buf = append(w.buf, 0xd9, byte(n))
	case n <= math.MaxUint16:
		w.buf = binary.BigEndian.AppendUint16(append(w.buf, 0xda), uint16(n))
	default:
		w.buf = binary.BigEndian.AppendUint32(append(w.buf, 0xdb), uint32(n))
	}
	w.buf = append(w.buf, s...)
}

func (w *writer) optStr(o Opt[string]) {
	if !o.Set {
		w.nil()
		return
	}
	w.str(o.V)
}

func (w *writer) bin(b []byte) {
	n := len(b)
	switch {
	case n <= math.MaxUint8:
		w.buf = append(w.buf, 0xc4, byte(n))
	case n <= math.MaxUint16:
		w.buf = binary.BigEndian.AppendUint16(append(w.buf, 0xc5), uint16(n))
	default:
		w.buf = binary.BigEndian.AppendUint32(append(w.buf, 0xc6), uint32(n))
	}
	w.buf = append(w.buf, b...)
}

func (w *writer) arrayHdr(n int) {
	switch {
	case n < 16:
		w.buf = append(w.buf, 0x90|byte(n))
	case n <= math.MaxUint16:
		w.buf = binary.BigEndian.AppendUint16(append(w.buf, 0xdc), uint16(n))
	default:
		w.buf = binary.BigEndian.AppendUint32(append(w.buf, 0xdd), uint32(n))
	}
}

func (w *writer) hash(h WireHash) {
	switch {
	case h.Raw != nil:
		w.bin(h.Raw)
	case w.opt.BytesHashes:
		var d [32]byte
		binary.BigEndian.PutUint64(d[24:], h.U)
		w.bin(d[:])
	case h.Neg:
		w.int(int64(h.U))
	default:
		w.uint(h.U)
	}
}

func (w *writer) hashes(hs []WireHash) {
	w.arrayHdr(len(hs))
	for _, h := range hs {
		w.hash(h)
	}
}

func (w *writer) optHash(o Opt[WireHash]) {
	if !o.Set {
		w.nil()
		return
	}
	w.hash(o.V)
}

func (w *writer) any(v any) error {
	switch x := v.(type) {
	case nil:
		w.nil()
	case string:
		w.str(x)
	case []byte:
		w.bin(x)
	case int:
		w.int(int64(x))
	case int64:
		w.int(x)
	case uint64:
		w.uint(x)
	case uint32:
		w.uint(uint64(x))
	case float64:
		w.float(x)
	case bool:
		if x {
			w.buf = append(w.buf, 0xc3)
		} else {
			w.buf = append(w.buf, 0xc2)
		}
	case []any:
		w.arrayHdr(len(x))
		for _, e := range x {
			if err := w.any(e); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("encode: unsupported extra key value %T", v)
	}
	return nil
}

func (w *writer) extraKeys(keys [][]any) error {
	if keys == nil {
		w.nil()
		return nil
	}
	w.arrayHdr(len(keys))
	for _, k := range keys {
		if k == nil {
			w.nil()
			continue
		}
		if err := w.any(k); err != nil {
			return err
		}
	}
	return nil
}

func (w *writer) tokens(ts []uint32) {
	w.arrayHdr(len(ts))
	for _, t := range ts {
		w.uint(uint64(t))
	}
}

func (w *writer) key(k string) { w.str(k) }

func (w *writer) stored(e *BlockStored) error {
	switch w.opt.Layout {
	case LayoutV090:
		w.arrayHdr(6)
		w.str(TagBlockStored)
		w.hashes(e.BlockHashes)
		w.optHash(e.ParentBlockHash)
		w.tokens(e.TokenIDs)
		w.int(e.BlockSize)
		w.optInt(e.LoRAID)
		return nil
	case LayoutArray:
		w.arrayHdr(12)
		w.str(TagBlockStored)
		w.hashes(e.BlockHashes)
		w.optHash(e.ParentBlockHash)
		w.tokens(e.TokenIDs)
		w.int(e.BlockSize)
		w.optInt(e.LoRAID)
		w.optStr(e.Medium)
		w.optStr(e.LoRAName)
		if err := w.extraKeys(e.ExtraKeys); err != nil {
			return err
		}
		w.optInt(e.GroupIdx)
		w.optStr(e.KVCacheSpecKind)
		w.optInt(e.KVCacheSpecSlidingWindow)
		return nil
	}
	// Map layout: 15 possible entries < 16, so always a fixmap (as msgspec writes it).
	n := 8
	for _, set := range []bool{e.ExtraKeys != nil, e.GroupIdx.Set, e.KVCacheSpecKind.Set,
		e.KVCacheSpecSlidingWindow.Set, e.Locality.Set, e.Ownership.Set, e.SessionID.Set} {
		if set {
			n++
		}
	}
	w.buf = append(w.buf, 0x80|byte(n))
	w.key("type")
	w.str(TagBlockStored)
	w.key("block_hashes")
	w.hashes(e.BlockHashes)
	w.key("parent_block_hash")
	w.optHash(e.ParentBlockHash)
	w.key("token_ids")
	w.tokens(e.TokenIDs)
	w.key("block_size")
	w.int(e.BlockSize)
	w.key("lora_id")
	w.optInt(e.LoRAID)
	w.key("medium")
	w.optStr(e.Medium)
	w.key("lora_name")
	w.optStr(e.LoRAName)
	if e.ExtraKeys != nil {
		w.key("extra_keys")
		if err := w.extraKeys(e.ExtraKeys); err != nil {
			return err
		}
	}
	w.optKeyInt("group_idx", e.GroupIdx)
	w.optKeyStr("kv_cache_spec_kind", e.KVCacheSpecKind)
	w.optKeyInt("kv_cache_spec_sliding_window", e.KVCacheSpecSlidingWindow)
	w.optKeyStr("locality", e.Locality)
	w.optKeyStr("ownership", e.Ownership)
	w.optKeyStr("session_id", e.SessionID)
	return nil
}

func (w *writer) optKeyInt(k string, o Opt[int64]) {
	if o.Set {
		w.key(k)
		w.int(o.V)
	}
}

func (w *writer) optKeyStr(k string, o Opt[string]) {
	if o.Set {
		w.key(k)
		w.str(o.V)
	}
}

func (w *writer) removed(e *BlockRemoved) {
	switch w.opt.Layout {
	case LayoutV090:
		w.arrayHdr(2)
		w.str(TagBlockRemoved)
		w.hashes(e.BlockHashes)
		return
	case LayoutArray:
		w.arrayHdr(4)
		w.str(TagBlockRemoved)
		w.hashes(e.BlockHashes)
		w.optStr(e.Medium)
		w.optInt(e.GroupIdx)
		return
	}
	n := 3
	for _, set := range []bool{e.GroupIdx.Set, e.Locality.Set, e.Ownership.Set} {
		if set {
			n++
		}
	}
	w.buf = append(w.buf, 0x80|byte(n))
	w.key("type")
	w.str(TagBlockRemoved)
	w.key("block_hashes")
	w.hashes(e.BlockHashes)
	w.key("medium")
	w.optStr(e.Medium)
	w.optKeyInt("group_idx", e.GroupIdx)
	w.optKeyStr("locality", e.Locality)
	w.optKeyStr("ownership", e.Ownership)
}

func (w *writer) cleared() {
	if w.opt.Layout == LayoutMap {
		w.buf = append(w.buf, 0x81)
		w.key("type")
	} else {
		w.arrayHdr(1)
	}
	w.str(TagAllBlocksCleared)
}
