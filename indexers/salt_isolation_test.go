package indexers

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/kvkey"
)

// An index fed with one tenant's salted stores (the salt string on block 0's extra_keys, as
// vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys emits it) credits that tenant's
// prompt and nobody else's, even when the two salts are 64-hex digests sharing 16 digits.
// Multimodal identifiers with a common prefix stay apart the same way.
func TestSaltIsolationEventSide(t *testing.T) {
	toks := seqTokens(2*16, 500)
	prefix := "fedcba9876543210"
	saltA, saltB := prefix+strings.Repeat("1", 48), prefix+strings.Repeat("2", 48)
	mmA, mmB := prefix+strings.Repeat("a", 48), prefix+strings.Repeat("b", 48)
	tests := []struct {
		name   string
		extra  [][]any
		own    kvkey.HashOptions
		others []kvkey.HashOptions
	}{
		{"cache salt", [][]any{{saltA}, nil},
			kvkey.HashOptions{CacheSalt: saltA},
			[]kvkey.HashOptions{{CacheSalt: saltB}, {}}},
		{"multimodal id", [][]any{{[]any{mmA, int64(0)}}, nil},
			kvkey.HashOptions{ExtraKeys: map[int][]uint64{0: {kvkey.ExtraKeyHash(mmA)}}},
			[]kvkey.HashOptions{{ExtraKeys: map[int][]uint64{0: {kvkey.ExtraKeyHash(mmB)}}}, {}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := NewIndex(Options{BlockSize: 16})
			tg := kvkey.Target{Worker: "w"}
			apply(t, ix, tg, &BlockStored{BlockHashes: exts(21, 22), TokenIDs: toks, BlockSize: 16,
				ExtraKeys: tc.extra, Medium: Some(MediumGPU)})
			if got := overlapOf(ix, tg, kvkey.BlockHashes(toks, 16, tc.own)); got.G1 != 2 {
				t.Fatalf("the owner's prompt matched %d of 2 blocks", got.G1)
			}
			for _, o := range tc.others {
				if got := overlapOf(ix, tg, kvkey.BlockHashes(toks, 16, o)); got.G1 != 0 {
					t.Errorf("another tenant's prompt (%+v) matched %d blocks", o, got.G1)
				}
			}
		})
	}
}
