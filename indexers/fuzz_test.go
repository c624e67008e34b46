package indexers

import (
	"testing"
)

// FuzzDecodeBatch: no input may panic the decoder, and every declared length is checked against
// the payload, so a hostile prefix cannot allocate more than a small constant factor of the
// message size. A payload that decodes re-encodes and decodes to the same number of events.
func FuzzDecodeBatch(f *testing.F) {
	for _, tc := range vectorCases(f) {
		f.Add(unhex(f, tc.hex))
	}
	f.Add([]byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := DecodeBatch(payload)
		if err != nil {
			return
		}
		enc, err := EncodeBatch(b, EncodeOptions{})
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := DecodeBatch(enc)
		if err != nil {
			t.Fatalf("decode of re-encoded batch: %v", err)
		}
		if len(again.Events) != len(b.Events) {
			t.Fatalf("events %d → %d", len(b.Events), len(again.Events))
		}
	})
}

func TestEncodeBytesHashes(t *testing.T) {
	b := oneEvent(&BlockRemoved{BlockHashes: []WireHash{IntHash(0x0102030405060708)}, Medium: Some(MediumGPU)}, Some[int64](0))
	enc, err := EncodeBatch(b, EncodeOptions{BytesHashes: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeBatch(enc)
	if err != nil {
		t.Fatal(err)
	}
	h := got.Events[0].(*BlockRemoved).BlockHashes[0]
	if len(h.Raw) != 32 || h.U != 0x0102030405060708 {
		t.Fatalf("bytes hash round trip: %+v", h)
	}
}
