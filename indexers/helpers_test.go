package indexers

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// omap is an ordered msgpack map for hand-built test payloads.
type omap []any

// EncodeMsgpack writes the pairs in order.
func (m omap) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := enc.EncodeMapLen(len(m) / 2); err != nil {
		return err
	}
	for _, v := range m {
		if err := enc.Encode(v); err != nil {
			return err
		}
	}
	return nil
}

func arr(v ...any) []any { return v }
func mapv(v ...any) omap { return omap(v) }

// mp encodes v with an independent msgpack implementation (compact ints, like msgspec).
func mp(t testing.TB, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
