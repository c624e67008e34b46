package kvkey

import "testing"

func TestAsBlockHashes(t *testing.T) {
	tests := []struct {
		name string
		in   []uint64
	}{
		{"nil", nil},
		{"empty", []uint64{}},
		{"one", []uint64{42}},
		{"chain", []uint64{1, 1 << 63, ^uint64(0)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := AsBlockHashes(tc.in)
			if len(got) != len(tc.in) {
				t.Fatalf("len = %d, want %d", len(got), len(tc.in))
			}
			for i := range tc.in {
				if uint64(got[i]) != tc.in[i] {
					t.Errorf("[%d] = %d, want %d", i, got[i], tc.in[i])
				}
			}
		})
	}
	// A view, not a copy: it shares the memory of its input.
	in := []uint64{7, 8}
	v := AsBlockHashes(in)
	in[1] = 9
	if v[1] != 9 {
		t.Fatalf("view did not follow its input: %d", v[1])
	}
}
