package engine

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// windowed returns the shared cache-less tokenizer of a model with a tiny pre-tokenizer window,
// so that almost every text of the golden corpus is pre-tokenized in several windows; the
// window is restored when the test ends (the engine tests do not run in parallel).
func windowed(t *testing.T, name string, window int) *Tokenizer {
	t.Helper()
	tk := loadModel(t, name, 0)
	old := tk.window
	tk.window = window
	t.Cleanup(func() { tk.window = old })
	return tk
}

// Pre-tokenizing window by window must give exactly HF's ids (the goldens).
func TestWindowedEncodeMatchesGoldens(t *testing.T) {
	texts := corpus(t)
	for _, m := range goldenModels {
		for _, window := range []int{16} {
			t.Run(m, func(t *testing.T) {
				golden := readJSONL[goldenLine](t, filepath.Join(tokensDir, m+".jsonl.gz"))
				tk := windowed(t, m, window)
				fails := 0
				for i := 0; i < len(texts); i += 4 * stride() {
					ids, err := tk.Encode(texts[i].Text, false)
					if err != nil || !slices.Equal(ids, golden[i].IDs) {
						if fails++; fails <= 5 {
							t.Errorf("window %d text %d %q:\n got %v (err %v)\nwant %v", window, i, clipS(texts[i].Text), clip(ids), err, clip(golden[i].IDs))
						}
					}
				}
			})
		}
	}
}

func TestEncodeLimit(t *testing.T) {
	long := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20000) // ~900 KB
	for _, m := range goldenModels {
		t.Run(m, func(t *testing.T) {
			tk := loadModel(t, m, 0)
			full, err := tk.Encode(long, true)
			if err != nil {
				t.Fatal(err)
			}
			n := len(full)
			cases := []struct {
				name    string
				limit   int
				wantErr bool
			}{
				{"no limit", 0, false},
				{"exactly the count", n, false},
				{"above", n + 1, false},
				{"one short", n - 1, true},
				{"far below", 100, true},
			}
			for _, tc := range cases {
				ids, err := tk.EncodeLimit(long, true, tc.limit)
				var le *LimitError
				switch {
				case tc.wantErr && !errors.As(err, &le):
					t.Errorf("%s: err = %v, want a *LimitError", tc.name, err)
				case tc.wantErr && (le.AtLeast <= tc.limit || le.AtLeast > n || le.Limit != tc.limit):
					t.Errorf("%s: AtLeast %d, Limit %d: want limit %d < AtLeast <= %d", tc.name, le.AtLeast, le.Limit, tc.limit, n)
				case !tc.wantErr && (err != nil || !slices.Equal(ids, full)):
					t.Errorf("%s: err %v, %d ids; want the %d ids of Encode", tc.name, err, len(ids), n)
				}
			}
		})
	}
}

// A single pre-token that even the longest vocabulary entries cannot cover within the limit is
// refused without running the model on it.
func TestEncodeLimitLongWord(t *testing.T) {
	tk := loadModel(t, "llama3_1", 0)
	word := strings.Repeat("a", 1<<20) // one \p{L}+ match
	_, err := tk.EncodeLimit(word, false, 1000)
	var le *LimitError
	if !errors.As(err, &le) || le.AtLeast <= 1000 {
		t.Fatalf("err = %v, want a *LimitError over 1000", err)
	}
}
