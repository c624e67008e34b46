package indexers

import (
	"testing"

	"github.com/kvgate/kvgate/tokenize"
	"github.com/kvgate/kvgate/workers"
)

// TestParentZeroIsRoot: llm-d-inference-sim writes the root block's parent_block_hash as integer
// 0 instead of nil. Decoded in either event layout, such a store must index as a root (and its
// children chain under it), not be dropped as parent_not_found.
func TestParentZeroIsRoot(t *testing.T) {
	toks := seqTokens(3*4, 10)
	storedArr := func(hs []uint64, parent any, tk []uint32) []any {
		return arr("BlockStored", hs, parent, tk, 4, nil, "GPU", nil, nil, 0, "full_attention", nil)
	}
	storedMap := func(hs []uint64, parent any, tk []uint32) omap {
		return mapv("type", "BlockStored", "block_hashes", hs, "parent_block_hash", parent,
			"token_ids", tk, "block_size", 4, "medium", "GPU")
	}
	tests := []struct {
		name    string
		payload func(t *testing.T) []byte
	}{
		{"array layout", func(t *testing.T) []byte {
			return mp(t, arr(1.5, arr(storedArr([]uint64{501, 502}, 0, toks[:8]),
				storedArr([]uint64{503}, 502, toks[8:])), 0))
		}},
		{"map layout", func(t *testing.T) []byte {
			return mp(t, arr(1.5, arr(storedMap([]uint64{501, 502}, 0, toks[:8]),
				storedMap([]uint64{503}, 502, toks[8:])), 0))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := DecodeBatch(tc.payload(t))
			if err != nil {
				t.Fatal(err)
			}
			if p := b.Events[0].(*BlockStored).ParentBlockHash; p.Set {
				t.Fatalf("parent 0 decoded as set (%d)", p.V.U)
			}
			ix := NewIndex(Options{BlockSize: 4})
			tg := workers.Target{Worker: "sim"}
			if err := ix.Apply(tg, b); err != nil {
				t.Fatal(err)
			}
			ts := ix.reg.Load().byTarget[tg]
			if n := ts.stats.drops[dropParentNotFound].Load(); n != 0 {
				t.Fatalf("%d blocks dropped as parent_not_found", n)
			}
			if got := overlapOf(ix, tg, tokenize.BlockHashes(toks, 4, tokenize.HashOptions{})); got.G1 != 3 {
				t.Fatalf("matched %d of 3 blocks", got.G1)
			}
		})
	}
}
