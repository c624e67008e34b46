package indexers

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// errBadEvent marks an event whose essential fields have the wrong type; it is skipped and
// counted, the rest of the batch still decodes.
var errBadEvent = errors.New("kv-event: malformed event")

// DecodeStats counts what DecodeBatch tolerated inside an otherwise valid batch.
type DecodeStats struct {
	// Unknown counts events with an unknown type tag (ignored; docs/ARCHITECTURE.md, "KV-event wire
	// format").
	Unknown int
	// Malformed counts events skipped because an essential field had the wrong type.
	Malformed int
}

// DecodeBatch decodes one payload of any layout vLLM has published: 2- or 3-element
// array batches (or, defensively, a map batch), events as tagged arrays or tagged maps,
// unknown keys and trailing elements ignored, missing optional keys defaulted, hashes as ints
// of any width and sign or as bytes (docs/ARCHITECTURE.md, "KV-event wire format").
func DecodeBatch(payload []byte) (*EventBatch, error) {
	b, _, err := DecodeBatchStats(payload)
	return b, err
}

// DecodeBatchStats is DecodeBatch that also reports tolerated problems.
func DecodeBatchStats(payload []byte) (*EventBatch, DecodeStats, error) {
	var st DecodeStats
	r := &reader{b: payload}
	b := &EventBatch{}
	switch r.kind() {
	case kArray:
		n, err := r.arrayLen()
		if err != nil {
			return nil, st, err
		}
		if n < 2 {
			return nil, st, fmt.Errorf("%w: %d elements", ErrNotBatch, n)
		}
		if b.TS, err = r.floatVal(); err != nil {
			return nil, st, err
		}
		if err := decodeEvents(r, b, &st); err != nil {
			return nil, st, err
		}
		if n >= 3 {
			if b.DPRank, err = r.optInt(); err != nil {
				return nil, st, err
			}
		}
		for i := 3; i < n; i++ {
			if err := r.skip(1); err != nil {
				return nil, st, err
			}
		}
	case kMap:
		n, err := r.mapLen()
		if err != nil {
			return nil, st, err
		}
		for range n {
			k, err := r.key()
			if err != nil {
				return nil, st, err
			}
			switch k {
			case "ts":
				b.TS, err = r.floatVal()
			case "events":
				err = decodeEvents(r, b, &st)
			case "data_parallel_rank":
				b.DPRank, err = r.optInt()
			default:
				err = r.skip(1)
			}
			if err != nil {
				return nil, st, err
			}
		}
	default:
		return nil, st, ErrNotBatch
	}
	if r.remaining() != 0 {
		return nil, st, fmt.Errorf("kv-event: %d trailing bytes after batch", r.remaining())
	}
	return b, st, nil
}

func decodeEvents(r *reader, b *EventBatch, st *DecodeStats) error {
	if r.kind() == kNil {
		r.p++
		return nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	b.Events = make([]Event, 0, n)
	for range n {
		ev, err := decodeEvent(r)
		switch {
		case errors.Is(err, errBadEvent):
			st.Malformed++
		case err != nil:
			return err
		case ev == nil:
			st.Unknown++
		default:
			b.Events = append(b.Events, ev)
		}
	}
	return nil
}

// key reads a map key; a non-string key is skipped and returned as "".
func (r *reader) key() (string, error) {
	if r.kind() != kStr {
		return "", r.skip(1)
	}
	b, err := r.bytesVal()
	return intern(b), err
}

// intern returns the known wire strings without allocating (the compiler does not allocate for
// string(b) in a switch); other strings are copied.
func intern(b []byte) string {
	switch string(b) {
	case "type":
		return "type"
	case "block_hashes":
		return "block_hashes"
	case "parent_block_hash":
		return "parent_block_hash"
	case "token_ids":
		return "token_ids"
	case "block_size":
		return "block_size"
	case "lora_id":
		return "lora_id"
	case "medium":
		return "medium"
	case "lora_name":
		return "lora_name"
	case "extra_keys":
		return "extra_keys"
	case "group_idx":
		return "group_idx"
	case "kv_cache_spec_kind":
		return "kv_cache_spec_kind"
	case "kv_cache_spec_sliding_window":
		return "kv_cache_spec_sliding_window"
	case "locality":
		return "locality"
	case "ownership":
		return "ownership"
	case "session_id":
		return "session_id"
	case TagBlockStored:
		return TagBlockStored
	case TagBlockRemoved:
		return TagBlockRemoved
	case TagAllBlocksCleared:
		return TagAllBlocksCleared
	case MediumGPU:
		return MediumGPU
	case MediumCPU:
		return MediumCPU
	case "full_attention":
		return "full_attention"
	case "LOCAL":
		return "LOCAL"
	}
	return string(b)
}

// optInt reads nil or an int; any other type is skipped and read as unset.
func (r *reader) optInt() (Opt[int64], error) {
	if r.kind() != kInt {
		return Opt[int64]{}, r.skip(1)
	}
	u, _, err := r.intVal()
	return Opt[int64]{V: int64(u), Set: true}, err
}

// optStr reads nil or a str; any other type is skipped and read as unset.
func (r *reader) optStr() (Opt[string], error) {
	if r.kind() != kStr {
		return Opt[string]{}, r.skip(1)
	}
	b, err := r.bytesVal()
	return Opt[string]{V: intern(b), Set: true}, err
}

// hash reads an int (any width or sign) or a bytes/str hash; ok is false for other types.
func (r *reader) hash() (WireHash, bool, error) {
	switch r.kind() {
	case kInt:
		u, neg, err := r.intVal()
		return WireHash{U: u, Neg: neg}, true, err
	case kBin, kStr:
		b, err := r.bytesVal()
		return BytesHash(append([]byte(nil), b...)), true, err
	}
	return WireHash{}, false, r.skip(1)
}

func (r *reader) optHash() (Opt[WireHash], bool, error) {
	if r.kind() == kNil {
		r.p++
		return Opt[WireHash]{}, true, nil
	}
	h, ok, err := r.hash()
	return Opt[WireHash]{V: h, Set: ok}, ok, err
}

// hashList reads an array of hashes; nil reads as empty. ok is false on any non-hash element.
func (r *reader) hashList() ([]WireHash, bool, error) {
	switch r.kind() {
	case kNil:
		r.p++
		return nil, true, nil
	case kArray:
	default:
		return nil, false, r.skip(1)
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, false, err
	}
	out := make([]WireHash, n)
	ok := true
	for i := range out {
		if b := r.b[r.p:]; len(b) >= 9 && b[0] == 0xcf { // the common 64-bit hash
			out[i] = WireHash{U: binary.BigEndian.Uint64(b[1:9])}
			r.p += 9
			continue
		}
		h, good, err := r.hash()
		if err != nil {
			return nil, false, err
		}
		ok = ok && good
		out[i] = h
	}
	return out, ok, nil
}

// tokenList reads token ids; ok is false if any is not a non-negative int below 2^32.
func (r *reader) tokenList() ([]uint32, bool, error) {
	switch r.kind() {
	case kNil:
		r.p++
		return nil, true, nil
	case kArray:
	default:
		return nil, false, r.skip(1)
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, false, err
	}
	out := make([]uint32, n)
	ok := true
	for i := range out {
		// Fast path for the unsigned widths msgspec writes for token ids.
		if b := r.b[r.p:]; len(b) >= 5 {
			switch c := b[0]; {
			case c <= 0x7f:
				out[i] = uint32(c)
				r.p++
				continue
			case c == 0xcc:
				out[i] = uint32(b[1])
				r.p += 2
				continue
			case c == 0xcd:
				out[i] = uint32(b[1])<<8 | uint32(b[2])
				r.p += 3
				continue
			case c == 0xce:
				out[i] = binary.BigEndian.Uint32(b[1:5])
				r.p += 5
				continue
			}
		}
		if r.kind() != kInt {
			ok = false
			if err := r.skip(1); err != nil {
				return nil, false, err
			}
			continue
		}
		u, neg, err := r.intVal()
		if err != nil {
			return nil, false, err
		}
		if neg || u > 0xffffffff {
			ok = false
		}
		out[i] = uint32(u)
	}
	return out, ok, nil
}

// extraKeys reads list[tuple | None] | None. A non-array entry is kept as a 1-element tuple.
func (r *reader) extraKeys() ([][]any, error) {
	if r.kind() != kArray {
		return nil, r.skip(1)
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	out := make([][]any, n)
	for i := range out {
		v, err := r.anyVal(2)
		if err != nil {
			return nil, err
		}
		switch x := v.(type) {
		case nil:
		case []any:
			out[i] = x
		default:
			out[i] = []any{x}
		}
	}
	return out, nil
}

// decodeEvent reads one event; (nil, nil) means a well-formed event of unknown type.
func decodeEvent(r *reader) (Event, error) {
	switch r.kind() {
	case kArray:
		return decodeArrayEvent(r)
	case kMap:
		return decodeMapEvent(r)
	}
	if err := r.skip(1); err != nil {
		return nil, err
	}
	return nil, errBadEvent
}

// decodeArrayEvent reads a tagged array event with the positional slots of vLLM's array_like
// event structs (vllm/distributed/kv_events.py, v0.9.0 to v0.23), guarded by
// the array length; trailing elements are skipped.
func decodeArrayEvent(r *reader) (Event, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, errBadEvent
	}
	var tag string
	if r.kind() == kStr {
		b, _ := r.bytesVal()
		tag = intern(b)
	} else if err := r.skip(1); err != nil {
		return nil, err
	}
	var ev Event
	bad := false
	i := 1
	switch tag {
	case TagBlockStored:
		s := &BlockStored{}
		for ; i < n && i <= 11 && err == nil; i++ {
			ok := true
			err = s.readField(r, storedSlots[i], &ok)
			bad = bad || !ok
		}
		ev = s
	case TagBlockRemoved:
		e := &BlockRemoved{}
		for ; i < n && i <= 3 && err == nil; i++ {
			ok := true
			err = e.readField(r, removedSlots[i], &ok)
			bad = bad || !ok
		}
		ev = e
	case TagAllBlocksCleared:
		ev = &AllBlocksCleared{}
	}
	if err != nil {
		return nil, err
	}
	for ; i < n; i++ {
		if err := r.skip(1); err != nil {
			return nil, err
		}
	}
	if bad {
		return nil, errBadEvent
	}
	return ev, nil
}

// Positional slot names (vllm/distributed/kv_events.py field order, v0.22/v0.23 and v0.9.0).
var (
	storedSlots = [...]string{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
		"lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
		"kv_cache_spec_sliding_window"}
	removedSlots = [...]string{"type", "block_hashes", "medium", "group_idx"}
)

// decodeMapEvent reads a tagged map event; keys may come in any order, unknown keys are
// skipped, missing keys stay unset.
func decodeMapEvent(r *reader) (Event, error) {
	n, err := r.mapLen()
	if err != nil {
		return nil, err
	}
	// Fields are read into both shapes; the tag decides which one is returned. BlockRemoved's
	// fields are a subset of BlockStored's, so one BlockStored collects everything.
	s := &BlockStored{}
	var tag string
	bad := false
	for range n {
		k, err := r.key()
		if err != nil {
			return nil, err
		}
		if k == "type" {
			if r.kind() == kStr {
				b, _ := r.bytesVal()
				tag = intern(b)
				continue
			}
			if err := r.skip(1); err != nil {
				return nil, err
			}
			continue
		}
		ok := true
		if err := s.readField(r, k, &ok); err != nil {
			return nil, err
		}
		bad = bad || !ok
	}
	switch tag {
	case TagBlockStored:
		if bad {
			return nil, errBadEvent
		}
		return s, nil
	case TagBlockRemoved:
		if bad {
			return nil, errBadEvent
		}
		return &BlockRemoved{BlockHashes: s.BlockHashes, Medium: s.Medium, GroupIdx: s.GroupIdx,
			Locality: s.Locality, Ownership: s.Ownership}, nil
	case TagAllBlocksCleared:
		return &AllBlocksCleared{}, nil
	}
	return nil, nil
}

// readField reads one named field; *ok becomes false when an essential field is malformed.
func (s *BlockStored) readField(r *reader, k string, ok *bool) error {
	var err error
	switch k {
	case "block_hashes":
		s.BlockHashes, *ok, err = r.hashList()
	case "parent_block_hash":
		s.ParentBlockHash, *ok, err = r.optHash()
		if h := s.ParentBlockHash.V; s.ParentBlockHash.Set && h.U == 0 && !h.Neg && h.Raw == nil {
			// Integer 0 means "no parent": llm-d-inference-sim writes the root block's parent as
			// 0 rather than nil, and llm-d's kvcache indexer reads it so
			// (llm-d-kv-cache pkg/kvevents/pool.go, processEventBatch: ParentHash != 0).
			s.ParentBlockHash = Opt[WireHash]{}
		}
	case "token_ids":
		s.TokenIDs, *ok, err = r.tokenList()
	case "block_size":
		var o Opt[int64]
		o, err = r.optInt()
		s.BlockSize = o.V
	case "lora_id":
		s.LoRAID, err = r.optInt()
	case "medium":
		s.Medium, err = r.optStr()
	case "lora_name":
		s.LoRAName, err = r.optStr()
	case "extra_keys":
		s.ExtraKeys, err = r.extraKeys()
	case "group_idx":
		s.GroupIdx, err = r.optInt()
	case "kv_cache_spec_kind":
		s.KVCacheSpecKind, err = r.optStr()
	case "kv_cache_spec_sliding_window":
		s.KVCacheSpecSlidingWindow, err = r.optInt()
	case "locality":
		s.Locality, err = r.optStr()
	case "ownership":
		s.Ownership, err = r.optStr()
	case "session_id":
		s.SessionID, err = r.optStr()
	default:
		err = r.skip(1)
	}
	return err
}

func (e *BlockRemoved) readField(r *reader, k string, ok *bool) error {
	var err error
	switch k {
	case "block_hashes":
		e.BlockHashes, *ok, err = r.hashList()
	case "medium":
		e.Medium, err = r.optStr()
	case "group_idx":
		e.GroupIdx, err = r.optInt()
	default:
		err = r.skip(1)
	}
	return err
}
