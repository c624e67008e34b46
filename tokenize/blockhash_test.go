package tokenize

import (
	"testing"

	"github.com/kvgate/kvgate/kvkey"
)

// The request path's bare-uint64 forms must equal the definition in kvkey bit for bit.
func TestBlockHashesMatchKVKey(t *testing.T) {
	tests := []struct {
		name      string
		tokens    int
		blockSize int
		opt       HashOptions
	}{
		{"plain", 64, 16, HashOptions{}},
		{"salt", 64, 16, HashOptions{CacheSalt: "tenant-a"}},
		{"lora", 40, 8, HashOptions{LoRAName: "adapter-a"}},
		{"extra keys", 32, 4, HashOptions{ExtraKeys: map[int][]uint64{1: {7, 3}}}},
		{"partial block", 35, 16, HashOptions{}},
		{"empty", 0, 16, HashOptions{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			toks := make([]uint32, tc.tokens)
			for i := range toks {
				toks[i] = uint32(i * 7)
			}
			got := BlockHashes(toks, tc.blockSize, tc.opt)
			want := kvkey.BlockHashes(toks, tc.blockSize, tc.opt)
			if len(got) != len(want) {
				t.Fatalf("len = %d, want %d", len(got), len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("block %d: %d, want %d", i, got[i], want[i])
				}
			}
		})
	}
}
