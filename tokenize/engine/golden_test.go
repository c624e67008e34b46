package engine

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

// The goldens are produced by scripts/goldens/gen-tokens.mjs with the real HF tokenizers (Rust)
// through the npm binding @anush008/tokenizers (docs/tokenization.md, "Token goldens and benchmarks").

var goldenModels = []string{"qwen3", "llama3_1", "deepseek_v3", "gptoss", "gemma3"}

const (
	modelsDir = "../../models"
	tokensDir = "../../testdata/tokens"
)

type corpusLine struct {
	Text    string `json:"t"`
	Special bool   `json:"s"`
}

type goldenLine struct {
	IDs     []uint32 `json:"ids"`
	IDsS    []uint32 `json:"ids_s"`
	Dec     *string  `json:"dec"`
	DecSkip *string  `json:"dec_skip"`
}

func readJSONL[T any](t testing.TB, path string) []T {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open golden: %v (run node scripts/goldens/gen-tokens.mjs)", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var out []T
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s line %d: %v", path, len(out)+1, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Loading a tokenizer takes up to a second; tests share one per model and cache setting.
var (
	loadMu sync.Mutex
	loaded = map[string]*Tokenizer{}
)

func loadModel(t testing.TB, name string, segmentCache int) *Tokenizer {
	t.Helper()
	dir := filepath.Join(modelsDir, name)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		skipOrFail(t, "%s missing: run scripts/fetch-tokenizers.sh", dir)
	}
	loadMu.Lock()
	defer loadMu.Unlock()
	key := fmt.Sprintf("%s/%d", name, segmentCache)
	if tk, ok := loaded[key]; ok {
		return tk
	}
	tk, err := Load(dir, WithSegmentCache(segmentCache), WithoutTokenizerConfig())
	if err != nil {
		t.Fatal(err)
	}
	loaded[key] = tk
	return tk
}

// skipOrFail skips when the model files are absent, except in CI (CI=true), where a skipped
// golden test would pass without proving anything.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

func corpus(t testing.TB) []corpusLine {
	return readJSONL[corpusLine](t, filepath.Join(tokensDir, "corpus.jsonl.gz"))
}

func TestGoldenTokens(t *testing.T) {
	texts := corpus(t)
	if len(texts) < 3000 {
		t.Fatalf("corpus has %d texts, want >= 3000", len(texts))
	}
	for _, m := range goldenModels {
		t.Run(m, func(t *testing.T) {
			golden := readJSONL[goldenLine](t, filepath.Join(tokensDir, m+".jsonl.gz"))
			if len(golden) != len(texts) {
				t.Fatalf("%d goldens for %d texts", len(golden), len(texts))
			}
			tk := loadModel(t, m, 0)
			fails := 0
			report := func(format string, args ...any) {
				fails++
				if fails <= 10 {
					t.Errorf(format, args...)
				}
			}
			for i := 0; i < len(texts); i += stride() {
				c, g := texts[i], golden[i]
				ids, err := tk.Encode(c.Text, false)
				if err != nil || !slices.Equal(ids, g.IDs) {
					report("text %d %q:\n got %v (err %v)\nwant %v", i, clipS(c.Text), clip(ids), err, clip(g.IDs))
					continue
				}
				want := c.Text
				if g.Dec != nil {
					want = *g.Dec
				}
				if dec, err := tk.Decode(ids, false); err != nil || dec != want {
					report("decode %d: got %q (err %v), want %q", i, clipS(dec), err, clipS(want))
				}
				if !c.Special {
					continue
				}
				idsS, err := tk.Encode(c.Text, true)
				if err != nil || !slices.Equal(idsS, g.IDsS) {
					report("text %d with special tokens:\n got %v (err %v)\nwant %v", i, clip(idsS), err, clip(g.IDsS))
					continue
				}
				if dec, err := tk.Decode(idsS, true); err != nil || g.DecSkip == nil || dec != *g.DecSkip {
					report("decode skip-special %d: got %q (err %v)", i, clipS(dec), err)
				}
			}
			if fails > 0 {
				t.Fatalf("%s: %d of %d texts differ from HF tokenizers", m, fails, len(texts))
			}
		})
	}
}

// TestSegmentCacheExact encodes the corpus through the segment cache twice (cold, then warm)
// and checks both passes against the HF goldens: the cache must never change a result.
func TestSegmentCacheExact(t *testing.T) {
	texts := corpus(t)
	for _, m := range []string{"qwen3", "gemma3"} {
		t.Run(m, func(t *testing.T) {
			golden := readJSONL[goldenLine](t, filepath.Join(tokensDir, m+".jsonl.gz"))
			tk := loadModel(t, m, 64<<20)
			for pass := 0; pass < 2; pass++ {
				for i, c := range texts {
					ids, err := tk.Encode(c.Text, false)
					if err != nil || !slices.Equal(ids, golden[i].IDs) {
						t.Fatalf("pass %d text %d: cached result differs from HF", pass, i)
					}
				}
			}
			if n, _ := tk.CacheStats(); n == 0 {
				t.Fatal("segment cache stayed empty")
			}
		})
	}
}

// stride thins the golden checks in -short mode (every 7th text); the full run checks all.
func stride() int {
	if testing.Short() {
		return 7
	}
	return 1
}

func clip[T any](v []T) []T {
	if len(v) > 40 {
		return v[:40]
	}
	return v
}

func clipS(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}
