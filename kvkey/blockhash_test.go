package kvkey

import (
	"slices"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"
)

func seqTokens(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(i)
	}
	return out
}

// Vectors: Dynamo's compute_block_hash value (lib/kv-router/src/protocols.rs, test_router_event_new);
// the others computed with github.com/zeebo/xxh3 from the definition in docs/ARCHITECTURE.md,
// "Block hashes".
func TestHashVectors(t *testing.T) {
	if got := xxh3.HashSeed([]byte("test data"), 1337); got != 13226331709069118873 {
		t.Fatalf("xxh3_64_with_seed(test data, 1337) = %d", got)
	}
	tests := []struct {
		name      string
		tokens    int
		blockSize int
		opt       HashOptions
		local     []uint64
		seq       []BlockHash
	}{
		{"plain bs4", 8, 4, HashOptions{},
			[]uint64{9143094415614847814, 12124091508212882195},
			[]BlockHash{9143094415614847814, 9510318385840434533}},
		{"lora bs4", 8, 4, HashOptions{LoRAName: "adapter-a"},
			[]uint64{6665157333201000639, 11721812545976571723},
			[]BlockHash{6665157333201000639, 13351519314849170528}},
		{"plain bs16", 32, 16, HashOptions{},
			[]uint64{15310707395893867146, 15292316782987903195},
			[]BlockHash{15310707395893867146, 13769157705258532664}},
		{"partial trailing block ignored", 35, 16, HashOptions{},
			[]uint64{15310707395893867146, 15292316782987903195},
			[]BlockHash{15310707395893867146, 13769157705258532664}},
		{"mm key on block 0", 2, 2, HashOptions{ExtraKeys: map[int][]uint64{0: {42}}},
			[]uint64{6100948656312251355}, []BlockHash{6100948656312251355}},
		{"no mm", 2, 2, HashOptions{},
			[]uint64{10918435022357402928}, []BlockHash{10918435022357402928}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			local := LocalHashes(seqTokens(tc.tokens), tc.blockSize, tc.opt)
			if !slices.Equal(local, tc.local) {
				t.Errorf("local = %v, want %v", local, tc.local)
			}
			if seq := BlockHashes(seqTokens(tc.tokens), tc.blockSize, tc.opt); !slices.Equal(seq, tc.seq) {
				t.Errorf("seq = %v, want %v", seq, tc.seq)
			}
		})
	}
	if s := LocalSeed("adapter-a"); s != 8842669519798868182 {
		t.Errorf("LocalSeed(adapter-a) = %d", s)
	}
}

func TestCacheSalt(t *testing.T) {
	toks := seqTokens(48)
	plain := BlockHashes(toks, 16, HashOptions{})
	salted := BlockHashes(toks, 16, HashOptions{CacheSalt: "tenant-a"})
	other := BlockHashes(toks, 16, HashOptions{CacheSalt: "tenant-b"})
	for i := range plain {
		if plain[i] == salted[i] || salted[i] == other[i] {
			t.Fatalf("block %d: salt did not separate the chain", i)
		}
	}
	// The salt is an extra key of block 0 only: later local hashes are unchanged.
	lp, ls := LocalHashes(toks, 16, HashOptions{}), LocalHashes(toks, 16, HashOptions{CacheSalt: "tenant-a"})
	if lp[0] == ls[0] || lp[1] != ls[1] || lp[2] != ls[2] {
		t.Fatalf("salt must change block 0 only: %v vs %v", lp, ls)
	}
	if want := LocalBlockHash(toks[:16], []uint64{xxh3.Hash([]byte("tenant-a"))}, HashSeed, nil); ls[0] != want {
		t.Fatalf("salted block 0 = %d, want %d", ls[0], want)
	}
}

func TestExtraKeyHash(t *testing.T) {
	hexSalt := "0123456789abcdef" + "00112233445566778899aabbccddeeff0011223344556677"
	tests := []struct {
		in   string
		want uint64
	}{
		{hexSalt, xxh3.Hash([]byte(hexSalt))},
		{"tenant-a", xxh3.Hash([]byte("tenant-a"))},
		{"zz23456789abcdef00112233445566778899aabbccddeeff0011223344556677", xxh3.Hash([]byte("zz23456789abcdef00112233445566778899aabbccddeeff0011223344556677"))},
	}
	for _, tc := range tests {
		if got := ExtraKeyHash(tc.in); got != tc.want {
			t.Errorf("ExtraKeyHash(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// Two tenants whose salts differ anywhere (here: 64-hex digests sharing their first 16 digits,
// or differing in the last digit only) must never share a block hash.
func TestDifferentSaltsNeverShareBlocks(t *testing.T) {
	prefix := "0123456789abcdef"
	tests := []struct {
		name string
		a, b string
	}{
		{"64-hex sharing 16 digits", prefix + strings.Repeat("0", 48), prefix + strings.Repeat("f", 48)},
		{"64-hex differing in the last digit", strings.Repeat("ab", 31) + "c0", strings.Repeat("ab", 31) + "c1"},
		{"plain strings", "tenant-a", "tenant-b"},
		{"case only", strings.Repeat("ab", 32), strings.Repeat("AB", 32)},
	}
	toks := seqTokens(48)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if ExtraKeyHash(tc.a) == ExtraKeyHash(tc.b) {
				t.Fatalf("ExtraKeyHash(%q) == ExtraKeyHash(%q)", tc.a, tc.b)
			}
			ha := BlockHashes(toks, 16, HashOptions{CacheSalt: tc.a})
			hb := BlockHashes(toks, 16, HashOptions{CacheSalt: tc.b})
			for i := range ha {
				if ha[i] == hb[i] {
					t.Errorf("block %d: salts %q and %q share hash %d", i, tc.a, tc.b, ha[i])
				}
			}
		})
	}
}

func BenchmarkBlockHashes32k(b *testing.B) {
	toks := seqTokens(32768)
	b.SetBytes(int64(len(toks) * 4))
	for b.Loop() {
		BlockHashes(toks, 16, HashOptions{})
	}
}
