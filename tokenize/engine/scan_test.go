package engine

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestScannersMatchRegexp2 checks every hand-written scanner against the general regexp2 matcher
// on the whole golden corpus (and on each model's real pattern string, so a scanner cannot be
// picked for a pattern it does not implement). regexp2 lacks Oniguruma's Unicode case folding of
// U+017F (long s) in (?i:'s), so texts containing it are left to the HF goldens.
func TestScannersMatchRegexp2(t *testing.T) {
	texts := corpus(t)
	cases := []struct {
		name, pattern string
	}{
		{"cl100k", patCL100K},
		{"qwen", patQwen},
		{"o200k", patO200K},
		{"deepseek", patDeepSeek},
		{"digits3", patDigits3},
		{"deepseek-cjk", patDeepSeekCJK},
		{"gpt2", patGPT2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sc, ok := scannerFor(c.pattern)
			if !ok {
				t.Fatal("no scanner")
			}
			re, err := newRegexMatcher(c.pattern)
			if err != nil {
				t.Fatal(err)
			}
			checked := 0
			for i, line := range texts {
				s := validUTF8(line.Text)
				if strings.ContainsRune(s, 'ſ') {
					continue
				}
				got := sc.findAll(nil, s)
				want := re.findAll(nil, s)
				if !slices.Equal(got, want) {
					t.Fatalf("text %d %q:\nscanner %v\nregexp2 %v", i, clipS(s), got, want)
				}
				checked++
			}
			if checked < 3000 {
				t.Fatalf("only %d texts checked", checked)
			}
		})
	}
}

// TestModelPatternsUseScanners pins that the five reference models get hand-written scanners for
// all their Split regexes (the fast path), by reading the patterns from their tokenizer.json.
func TestModelPatternsUseScanners(t *testing.T) {
	for _, m := range goldenModels {
		data, err := os.ReadFile(filepath.Join(modelsDir, m, "tokenizer.json"))
		if err != nil {
			skipOrFail(t, "models missing: run scripts/fetch-tokenizers.sh: %v", err)
		}
		var f struct {
			Pre json.RawMessage `json:"pre_tokenizer"`
		}
		if err := json.Unmarshal(data, &f); err != nil {
			t.Fatal(err)
		}
		var patterns []string
		var collect func(raw json.RawMessage)
		collect = func(raw json.RawMessage) {
			c, err := parseComponent(raw)
			if err != nil || c == nil {
				return
			}
			if c.Pattern != nil && c.Pattern.Regex != nil {
				patterns = append(patterns, *c.Pattern.Regex)
			}
			for _, r := range c.Pretokenizers {
				collect(r)
			}
		}
		if !isNull(f.Pre) {
			collect(f.Pre)
		}
		for _, p := range patterns {
			if _, ok := scannerFor(p); !ok {
				t.Errorf("%s: no scanner for %q", m, p)
			}
		}
	}
}

// FuzzScannersMatchRegexp2 extends TestScannersMatchRegexp2 to generated inputs
// (go test -fuzz FuzzScannersMatchRegexp2 ./tokenize/engine/); plain go test runs the seeds.
func FuzzScannersMatchRegexp2(f *testing.F) {
	for _, s := range []string{"", "Hello world", "  #x", "a\r\n\r\n  b", "I'LL don't 'S", "123456789",
		"你好,世界", "e\u0301\u0302x", "\t\t\u3000 \u00a0x", "👨‍👩‍👧 ok", "HTTPServer's", "==> /path/ok\n/"} {
		f.Add(s)
	}
	patterns := []string{patCL100K, patQwen, patO200K, patDeepSeek, patDigits3, patDeepSeekCJK, patGPT2}
	regexes := make([]*regexMatcher, len(patterns))
	for i, p := range patterns {
		re, err := newRegexMatcher(p)
		if err != nil {
			f.Fatal(err)
		}
		regexes[i] = re
	}
	f.Fuzz(func(t *testing.T, s string) {
		s = validUTF8(s)
		if strings.ContainsRune(s, 'ſ') {
			return // Oniguruma folds it to 's' in (?i:...), regexp2 does not; see the goldens
		}
		for i, p := range patterns {
			sc, _ := scannerFor(p)
			if got, want := sc.findAll(nil, s), regexes[i].findAll(nil, s); !slices.Equal(got, want) {
				t.Fatalf("pattern %d on %q: scanner %v, regexp2 %v", i, s, got, want)
			}
		}
	})
}
