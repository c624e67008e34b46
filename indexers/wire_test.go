package indexers

import (
	"bytes"
	"encoding/hex"
	"reflect"
	"strings"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	s = strings.Join(strings.Fields(s), "")
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex: %v", err)
	}
	return b
}

// Vectors produced by real msgspec on replicas of the vLLM event structs
// (vllm/distributed/kv_events.py): the same batch as map events, array events (v0.22/v0.23) and
// the v0.9.0 schema, a v0.26-shaped capture, a rich event and single atoms.
const (
	vec31 = `93cb41d954fc40200000938ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573920102
b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f
73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65
797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f61747465
6e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739101a66d65646975
6da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400`
	vec32 = `93cb41d954fc40200000939cab426c6f636b53746f726564920102c098010203040506070804c0a3475055c092
c0c000ae66756c6c5f617474656e74696f6ec094ac426c6f636b52656d6f7665649101a34750550091b0416c6c
426c6f636b73436c656172656400`
	vec33 = `92cb41d954fc402000009396ab426c6f636b53746f726564920102c098010203040506070804c092ac426c6f63
6b52656d6f766564910191b0416c6c426c6f636b73436c6561726564`
	vec34 = `93cb41daa8dbe0359fe7918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cfda
b89baa7b5857c0b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc0010ce0002505ccd
0368ccc6cd2368cd0176cd0117cd1a42cd013bcd15f01ece0002505dccc6ce0002505cce00012d23ccc6ce0002
5073aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0
aa65787472615f6b65797391c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66
756c6c5f617474656e74696f6e00`
	vec35 = `93cb41d954fc40200000918ca474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cfda
b89baa7b5857c0b1706172656e745f626c6f636b5f68617368cfab54a98ceb1f0ad2a9746f6b656e5f696473dc
00106465666768696a6b6c6d6e6f70717273aa626c6f636b5f73697a6510a76c6f72615f696401a66d65646975
6da3475055a96c6f72615f6e616d65a873716c2d6c6f7261aa65787472615f6b6579739194a873716c2d6c6f72
6192ab6d6d2d686173682d61626303a874656e616e742d61c4020102a967726f75705f69647800b26b765f6361
6368655f737065635f6b696e64ae736c6964696e675f77696e646f77bc6b765f63616368655f737065635f736c
6964696e675f77696e646f77cd100001`
	vec36NilDP   = `93 cb41d954fc40200000 91 81a474797065b0416c6c426c6f636b73436c6561726564 c0`
	vec36CPU     = `88a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cf1e0b2e028ef071cbb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647390aa626c6f636b5f73697a6500a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c0`
	batchPrefix1 = `93cb41d954fc4020000091` // [1700000000.5, [one event ...
	sha256H0     = `c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb`
)

// batch31 is the content of vec31, vec32 and vec33.
func batch31() *EventBatch {
	return &EventBatch{
		TS: 1700000000.5,
		Events: []Event{
			&BlockStored{
				BlockHashes: []WireHash{IntHash(1), IntHash(2)},
				TokenIDs:    []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4,
				Medium: Some(MediumGPU), ExtraKeys: [][]any{nil, nil},
				GroupIdx: Some[int64](0), KVCacheSpecKind: Some("full_attention"),
			},
			&BlockRemoved{BlockHashes: []WireHash{IntHash(1)}, Medium: Some(MediumGPU), GroupIdx: Some[int64](0)},
			&AllBlocksCleared{},
		},
		DPRank: Some[int64](0),
	}
}

func batch34() *EventBatch {
	return &EventBatch{TS: 1789095808.8378847, DPRank: Some[int64](0), Events: []Event{&BlockStored{
		BlockHashes: []WireHash{IntHash(15760518052499183552)},
		TokenIDs: []uint32{151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644,
			77091, 198, 151667},
		BlockSize: 16, Medium: Some(MediumGPU), ExtraKeys: [][]any{nil},
		GroupIdx: Some[int64](0), KVCacheSpecKind: Some("full_attention"),
	}}}
}

func batch35() *EventBatch {
	toks := make([]uint32, 16)
	for i := range toks {
		toks[i] = uint32(100 + i)
	}
	return &EventBatch{TS: 1700000000.5, DPRank: Some[int64](1), Events: []Event{&BlockStored{
		BlockHashes:     []WireHash{IntHash(15760518052499183552)},
		ParentBlockHash: Some(IntHash(12345678901234567890)),
		TokenIDs:        toks, BlockSize: 16, LoRAID: Some[int64](1), Medium: Some(MediumGPU),
		LoRAName:                 Some("sql-lora"),
		ExtraKeys:                [][]any{{"sql-lora", []any{"mm-hash-abc", uint64(3)}, "tenant-a", []byte{1, 2}}},
		GroupIdx:                 Some[int64](0),
		KVCacheSpecKind:          Some("sliding_window"),
		KVCacheSpecSlidingWindow: Some[int64](4096),
	}}}
}

func oneEvent(ev Event, dp Opt[int64]) *EventBatch {
	return &EventBatch{TS: 1700000000.5, Events: []Event{ev}, DPRank: dp}
}

type vectorCase struct {
	name  string
	hex   string
	batch *EventBatch
	opt   EncodeOptions
	// decoded is what decoding yields when the layout cannot carry every field (nil: batch).
	decoded *EventBatch
}

func vectorCases(t testing.TB) []vectorCase {
	sha := unhex(t, sha256H0)
	return []vectorCase{
		{"map", vec31, batch31(), EncodeOptions{Layout: LayoutMap}, nil},
		{"array v0.22/0.23", vec32, batch31(), EncodeOptions{Layout: LayoutArray}, nil},
		{"v0.9.0", vec33, func() *EventBatch { b := batch31(); b.DPRank = Opt[int64]{}; return b }(), EncodeOptions{Layout: LayoutV090},
			&EventBatch{TS: 1700000000.5, Events: []Event{
				&BlockStored{BlockHashes: []WireHash{IntHash(1), IntHash(2)}, TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4},
				&BlockRemoved{BlockHashes: []WireHash{IntHash(1)}}, &AllBlocksCleared{}}}},
		{"v0.26 capture", vec34, batch34(), EncodeOptions{}, nil},
		{"rich", vec35, batch35(), EncodeOptions{}, nil},
		{"nil dp rank", vec36NilDP, oneEvent(&AllBlocksCleared{}, Opt[int64]{}), EncodeOptions{}, nil},
		{"CPU placeholder", batchPrefix1 + vec36CPU + "00", oneEvent(&BlockStored{
			BlockHashes: []WireHash{IntHash(2164874634404590027)}, TokenIDs: []uint32{},
			Medium: Some(MediumCPU)}, Some[int64](0)), EncodeOptions{}, nil},
		{"bytes hash", batchPrefix1 + "83a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391c420" +
			sha256H0 + "a66d656469756da3475055" + "00",
			oneEvent(&BlockRemoved{BlockHashes: []WireHash{BytesHash(sha)}, Medium: Some(MediumGPU)}, Some[int64](0)),
			EncodeOptions{}, nil},
		{"negative int64", batchPrefix1 + "83a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739" +
			"1d3f945989605c9f45fa66d656469756da3475055" + "00",
			oneEvent(&BlockRemoved{BlockHashes: []WireHash{{U: uint64(0xf945989605c9f45f), Neg: true}},
				Medium: Some(MediumGPU)}, Some[int64](0)),
			EncodeOptions{}, nil},
	}
}

func TestEncodeVectors(t *testing.T) {
	for _, tc := range vectorCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EncodeBatch(tc.batch, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			if want := unhex(t, tc.hex); !bytes.Equal(got, want) {
				t.Fatalf("encode mismatch\n got %x\nwant %x", got, want)
			}
		})
	}
}

func TestDecodeVectors(t *testing.T) {
	for _, tc := range vectorCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			got, st, err := DecodeBatchStats(unhex(t, tc.hex))
			if err != nil {
				t.Fatal(err)
			}
			if st != (DecodeStats{}) {
				t.Fatalf("stats %+v", st)
			}
			want := tc.batch
			if tc.decoded != nil {
				want = tc.decoded
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decode mismatch\n got %#v\nwant %#v", got, want)
			}
			// Round trip: re-encoding the decoded batch reproduces the bytes.
			again, err := EncodeBatch(got, tc.opt)
			if err != nil || !bytes.Equal(again, unhex(t, tc.hex)) {
				t.Fatalf("re-encode mismatch: %v", err)
			}
		})
	}
}

func TestDecodeSemantics(t *testing.T) {
	// Negative int64 → bit-cast to u64 (as Dynamo normalises it).
	b, err := DecodeBatch(unhex(t, vectorCases(t)[8].hex))
	if err != nil {
		t.Fatal(err)
	}
	if h := b.Events[0].(*BlockRemoved).BlockHashes[0]; int64(h.U) != -484813614762822561 || !h.Neg {
		t.Fatalf("negative hash decoded as %d", int64(h.U))
	}
	// Bytes hash → low 64 bits of the digest = vLLM's int mode value
	// (vllm/v1/core/kv_cache_utils.py, maybe_convert_block_hash).
	b, err = DecodeBatch(unhex(t, vectorCases(t)[7].hex))
	if err != nil {
		t.Fatal(err)
	}
	if h := b.Events[0].(*BlockRemoved).BlockHashes[0]; h.U != 2164874634404590027 || len(h.Raw) != 32 {
		t.Fatalf("bytes hash decoded as %d (raw %d bytes)", h.U, len(h.Raw))
	}
}

func TestDecodeTolerance(t *testing.T) {
	tests := []struct {
		name    string
		payload []byte
		check   func(t *testing.T, b *EventBatch, st DecodeStats)
	}{
		{"unknown keys and out-of-order keys in a map event", mp(t, arr(1.5, arr(mapv(
			"block_hashes", arr(uint64(7)), "future_key", mapv("x", arr(1, 2)), "type", "BlockStored",
			"token_ids", arr(1, 2), "block_size", 2)), 3)),
			func(t *testing.T, b *EventBatch, st DecodeStats) {
				s := b.Events[0].(*BlockStored)
				if s.BlockHashes[0].U != 7 || len(s.TokenIDs) != 2 || s.Medium.Set || b.DPRank.V != 3 {
					t.Fatalf("got %+v", s)
				}
			}},
		{"extra trailing array slots ignored", mp(t, arr(1.5, arr(arr("BlockRemoved", arr(5), "GPU", 0, "LOCAL", "x", "y")), 0)),
			func(t *testing.T, b *EventBatch, st DecodeStats) {
				if r := b.Events[0].(*BlockRemoved); r.BlockHashes[0].U != 5 || r.Medium.V != "GPU" {
					t.Fatalf("got %+v", r)
				}
			}},
		{"short array event (v0.10 shape)", mp(t, arr(1.5, arr(arr("BlockStored", arr(1), nil, arr(1, 2), 2, nil, "CPU")), 0)),
			func(t *testing.T, b *EventBatch, st DecodeStats) {
				if s := b.Events[0].(*BlockStored); s.Medium.V != "CPU" || s.LoRAName.Set {
					t.Fatalf("got %+v", s)
				}
			}},
		{"unknown event type counted", mp(t, arr(1.5, arr(mapv("type", "BlockInactive", "block_hashes", arr(1)), arr("AllBlocksCleared")), 0)),
			func(t *testing.T, b *EventBatch, st DecodeStats) {
				if st.Unknown != 1 || len(b.Events) != 1 {
					t.Fatalf("stats %+v events %d", st, len(b.Events))
				}
			}},
		{"malformed event skipped, rest kept", mp(t, arr(1.5, arr(mapv("type", "BlockStored", "block_hashes", "nope"), arr("AllBlocksCleared")), 0)),
			func(t *testing.T, b *EventBatch, st DecodeStats) {
				if st.Malformed != 1 || len(b.Events) != 1 {
					t.Fatalf("stats %+v events %d", st, len(b.Events))
				}
			}},
		{"map-shaped batch", mp(t, mapv("ts", 2.5, "events", arr(arr("AllBlocksCleared")), "data_parallel_rank", 4)),
			func(t *testing.T, b *EventBatch, st DecodeStats) {
				if b.TS != 2.5 || b.DPRank.V != 4 || len(b.Events) != 1 {
					t.Fatalf("got %+v", b)
				}
			}},
		{"int timestamp and wide negative hash widths", mp(t, arr(7, arr(arr("BlockRemoved", arr(-1, int64(-200), int64(-40000), int64(-3000000000))), nil))),
			func(t *testing.T, b *EventBatch, st DecodeStats) {
				hs := b.Events[0].(*BlockRemoved).BlockHashes
				want := []int64{-1, -200, -40000, -3000000000}
				for i, h := range hs {
					if int64(h.U) != want[i] {
						t.Fatalf("hash %d = %d", i, int64(h.U))
					}
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, st, err := DecodeBatchStats(tc.payload)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, b, st)
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	tests := []struct {
		name string
		hex  string
	}{
		{"empty", ""},
		{"not a batch", "a3474055"},
		{"1-element batch", "91cb41d954fc40200000"},
		{"truncated", strings.Join(strings.Fields(vec31), "")[:100]},
		{"hostile array32 length", "93cb41d954fc40200000ddffffffff"},
		{"hostile str32 length", "93cb41d954fc4020000091dbffffffff"},
		{"trailing bytes", strings.Join(strings.Fields(vec36NilDP), "") + "00"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := DecodeBatch(unhex(t, tc.hex)); err == nil {
				t.Fatal("expected an error")
			}
		})
	}
}

func TestFrames(t *testing.T) {
	if got := hex.EncodeToString(SeqFrame(258)); got != "0000000000000102" {
		t.Fatal(got)
	}
	if got := hex.EncodeToString(SeqFrame(EndSeq)); got != "ffffffffffffffff" {
		t.Fatal(got)
	}
	payload := unhex(t, vec31)
	m, err := ParseLive(LiveFrames("kv-events", 0, payload))
	if err != nil || m.Topic != "kv-events" || m.Seq != 0 || !bytes.Equal(m.Payload, payload) {
		t.Fatalf("live round trip: %+v %v", m, err)
	}
	if _, err := ParseLive([][]byte{{}, {1, 2}, payload}); err == nil {
		t.Fatal("short seq frame accepted")
	}
	// Replay request as the ROUTER sees it: [identity, "", seq8].
	id, start, err := ParseReplayRequest(append([][]byte{[]byte("id")}, ReplayRequestFrames(7)...))
	if err != nil || string(id) != "id" || start != 7 {
		t.Fatalf("replay request: %q %d %v", id, start, err)
	}
	for _, f := range []ReplayFormat{ReplayWithTopic, ReplayNoTopic} {
		// A DEALER sees the ROUTER's frames minus the identity.
		rep, err := ParseReplayReply(ReplayReplyFrames([]byte("id"), f, "kv-events", 5, payload)[1:])
		if err != nil || rep.Seq != 5 || rep.End || !bytes.Equal(rep.Payload, payload) {
			t.Fatalf("format %d: %+v %v", f, rep, err)
		}
		end, err := ParseReplayReply(ReplayEndFrames([]byte("id"), f)[1:])
		if err != nil || !end.End {
			t.Fatalf("format %d end: %+v %v", f, end, err)
		}
	}
	rb := NewReplayBuffer(3)
	for s := range uint64(5) {
		rb.Add(s, []byte{byte(s)})
	}
	var seen []uint64
	rb.Since(0, func(s uint64, _ []byte) { seen = append(seen, s) })
	if !reflect.DeepEqual(seen, []uint64{2, 3, 4}) {
		t.Fatalf("ring kept %v", seen)
	}
}
