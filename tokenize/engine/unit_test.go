package engine

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// tinyJSON builds a small byte-level tokenizer.json: vocabulary = the 256 bytes plus "ab" and
// "abc" with merges (a b) and (ab c); components can be overridden.
func tinyJSON(over map[string]string) []byte {
	bl := newByteLevelTables()
	var vocab []string
	for b := 0; b < 256; b++ {
		vocab = append(vocab, fmt.Sprintf("%q: %d", string(bl.byteToRune[b]), b))
	}
	vocab = append(vocab, `"ab": 256`, `"abc": 257`)
	parts := map[string]string{
		"added_tokens":   `[{"id": 258, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}]`,
		"normalizer":     `null`,
		"pre_tokenizer":  `{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true}`,
		"post_processor": `{"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [258], "tokens": ["<s>"]}}}`,
		"decoder":        `{"type": "ByteLevel"}`,
		"model":          `{"type": "BPE", "vocab": {` + strings.Join(vocab, ", ") + `}, "merges": ["a b", "ab c"]}`,
		"truncation":     `null`,
		"padding":        `null`,
	}
	for k, v := range over {
		parts[k] = v
	}
	var sb strings.Builder
	sb.WriteString("{")
	first := true
	for k, v := range parts {
		if !first {
			sb.WriteString(",")
		}
		first = false
		fmt.Fprintf(&sb, "%q: %s", k, v)
	}
	sb.WriteString("}")
	return []byte(sb.String())
}

func TestTinyTokenizer(t *testing.T) {
	tk, err := FromJSON(tinyJSON(nil))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		text    string
		special bool
		want    []uint32
	}{
		{"", false, []uint32{}},
		{"", true, []uint32{258}},
		{"abc", false, []uint32{257}},
		{"abcab", false, []uint32{257, 256}},
		{"x<s>abc", true, []uint32{258, 'x', 258, 257}},
		{"ab c", false, []uint32{256, ' ', 'c'}},
	}
	for _, tc := range tests {
		got, err := tk.Encode(tc.text, tc.special)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("Encode(%q, %v) = %v, %v; want %v", tc.text, tc.special, got, err, tc.want)
		}
	}
	if s, err := tk.Decode([]uint32{258, 257, 32}, true); err != nil || s != "abc " {
		t.Errorf("Decode = %q, %v", s, err)
	}
	if _, err := tk.Decode([]uint32{9999}, false); !errors.Is(err, ErrUnknownID) {
		t.Errorf("Decode(unknown) err = %v, want ErrUnknownID", err)
	}
	if id, ok := tk.TokenToID("ab"); !ok || id != 256 {
		t.Errorf("TokenToID(ab) = %d, %v", id, ok)
	}
	if s, ok := tk.IDToToken(258); !ok || s != "<s>" {
		t.Errorf("IDToToken(258) = %q, %v", s, ok)
	}
}

func TestUnsupportedComponentsFailAtLoad(t *testing.T) {
	tests := []struct {
		key, value, name string
	}{
		{"model", `{"type": "Unigram", "vocab": [["a", 0.0]]}`, "Unigram"},
		{"model", `{"type": "WordPiece", "vocab": {"a": 0}}`, "WordPiece"},
		{"normalizer", `{"type": "BertNormalizer"}`, "BertNormalizer"},
		{"normalizer", `{"type": "Precompiled", "precompiled_charsmap": ""}`, "Precompiled"},
		{"pre_tokenizer", `{"type": "UnicodeScripts"}`, "UnicodeScripts"},
		{"decoder", `{"type": "WordPiece", "prefix": "##"}`, "WordPiece"},
		{"decoder", `{"type": "CTC"}`, "CTC"},
		{"post_processor", `{"type": "BertProcessing2"}`, "BertProcessing2"},
		{"truncation", `{"max_length": 8}`, "truncation"},
		{"pre_tokenizer", `{"type": "Split", "pattern": {"Regex": "(?<=a"}, "behavior": "Isolated", "invert": false}`, "(?<=a"},
	}
	for _, tc := range tests {
		_, err := FromJSON(tinyJSON(map[string]string{tc.key: tc.value}))
		if err == nil || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s=%s: err = %v, want an error naming %q", tc.key, tc.value, err, tc.name)
		}
	}
}

// Rust's String::from_utf8_lossy replaces each maximal ill-formed subpart with one U+FFFD.
func TestUTF8LossyMatchesRust(t *testing.T) {
	tests := []struct {
		in   []byte
		want string
	}{
		{[]byte("ok"), "ok"},
		{[]byte{0xE2, 0x82}, "\uFFFD"},
		{[]byte{0xE2, 0x82, 'a'}, "\uFFFDa"},
		{[]byte{0xF0, 0x9F, 0x98}, "\uFFFD"},
		{[]byte{0x80, 0x80}, "\uFFFD\uFFFD"},
		{[]byte{0xED, 0xA0, 0x80}, "\uFFFD\uFFFD\uFFFD"},
		{[]byte{0xC0, 0xAF}, "\uFFFD\uFFFD"},
		{[]byte{0xF4, 0x90, 0x80, 0x80}, "\uFFFD\uFFFD\uFFFD\uFFFD"},
		{[]byte{'a', 0xE0, 0xA0, 'b'}, "a\uFFFDb"},
	}
	for _, tc := range tests {
		if got := utf8Lossy(tc.in); got != tc.want {
			t.Errorf("utf8Lossy(% x) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestSegmentCacheBoundedLRU(t *testing.T) {
	c := newSegmentCache(10 * (128 + segmentOverhead + 4*4))
	key := func(i int) string { return fmt.Sprintf("%0128d", i) }
	for i := 0; i < 50; i++ {
		c.put(key(i), []uint32{1, 2, 3, 4})
		if i == 2 {
			c.get(key(0)) // touch: 0 becomes most recent
		}
	}
	n, bytes := c.stats()
	if n > 10 || bytes > c.maxBytes {
		t.Fatalf("cache holds %d entries / %d bytes, bound %d", n, bytes, c.maxBytes)
	}
	if _, ok := c.get(key(49)); !ok {
		t.Error("most recent entry evicted")
	}
	if _, ok := c.get(key(1)); ok {
		t.Error("old entry kept")
	}
	if _, ok := c.get("short"); ok {
		t.Error("short keys must not be cached")
	}
}

// TestConcurrentEncode shares one tokenizer (with both caches) between goroutines; with -race it
// checks the caches' locking, and every result is compared with the HF goldens.
func TestConcurrentEncode(t *testing.T) {
	texts := corpus(t)
	golden := readJSONL[goldenLine](t, tokensDir+"/qwen3.jsonl.gz")
	tk := loadModel(t, "qwen3", 8<<20)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < len(texts); i += 3 {
				ids, err := tk.Encode(texts[i].Text, false)
				if err != nil || !slices.Equal(ids, golden[i].IDs) {
					errs <- fmt.Errorf("goroutine %d text %d differs (err %v)", g, i, err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestInvalidUTF8Input(t *testing.T) {
	tk, err := FromJSON(tinyJSON(nil))
	if err != nil {
		t.Fatal(err)
	}
	got, err := tk.Encode("a\xffb", false)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := tk.Encode("a\uFFFDb", false)
	if !slices.Equal(got, want) {
		t.Fatalf("invalid UTF-8 encodes as %v, want the U+FFFD encoding %v", got, want)
	}
}

// TestTokenizerConfigBOS pins transformers' behaviour for Llama-class tokenizers: with
// add_bos_token the post-processor becomes [bos] $A (DeepSeek V3 ships no BOS template in
// tokenizer.json, so HF tokenizers alone adds nothing); other classes keep tokenizer.json's.
func TestTokenizerConfigBOS(t *testing.T) {
	tests := []struct {
		model   string
		wantBOS int64 // -1: nothing prepended
	}{
		{"deepseek_v3", 0},   // <｜begin▁of▁sentence｜>
		{"gemma3", 2},        // <bos>, same as its tokenizer.json template
		{"llama3_1", 128000}, // PreTrainedTokenizerFast: tokenizer.json template kept
		{"qwen3", -1},        // Qwen2Tokenizer: nothing
		{"gptoss", -1},       // PreTrainedTokenizerFast, no template
	}
	for _, tc := range tests {
		dir := filepath.Join(modelsDir, tc.model)
		tk, err := Load(dir, WithPieceCache(0))
		if err != nil {
			skipOrFail(t, "models missing: run scripts/fetch-tokenizers.sh: %v", err)
		}
		plain, err := tk.Encode("Hello world", false)
		if err != nil {
			t.Fatal(err)
		}
		withSpecial, err := tk.Encode("Hello world", true)
		if err != nil {
			t.Fatal(err)
		}
		want := plain
		if tc.wantBOS >= 0 {
			want = append([]uint32{uint32(tc.wantBOS)}, plain...)
		}
		if !slices.Equal(withSpecial, want) {
			t.Errorf("%s: Encode(add_special_tokens) = %v, want %v", tc.model, withSpecial, want)
		}
	}
}

// Expected values are HF's Lowercase normalizer: Rust's char::to_lowercase on each character
// (full mappings, no Final_Sigma rule; the qwen3-normalizers golden variant confirms it).
func TestLowercaseMatchesRust(t *testing.T) {
	tests := []struct{ in, want string }{
		{"HELLO", "hello"},
		{"ΣΑΣ", "σασ"},
		{"Σ", "σ"},
		{"İstanbul", "i\u0307stanbul"},
		{"ΣΊΣΥΦΟΣ", "σίσυφοσ"},
	}
	for _, tc := range tests {
		if got := (lowercase{}).normalize(tc.in); got != tc.want {
			t.Errorf("lowercase(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestRegexTimeoutIsAnError checks that a regexp2 failure surfaces as an error from Encode
// rather than as silently truncated pre-tokens.
func TestRegexTimeoutIsAnError(t *testing.T) {
	tk, err := FromJSON(tinyJSON(map[string]string{
		"pre_tokenizer": `{"type": "Sequence", "pretokenizers": [
			{"type": "Split", "pattern": {"Regex": "(a+)+b"}, "behavior": "Isolated", "invert": false},
			{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}`,
	}))
	if err != nil {
		t.Fatal(err)
	}
	rm, ok := tk.pre.(splitPre).m.(*regexMatcher)
	if !ok {
		t.Fatalf("pre-tokenizer is %T, want a regexp2 Split", tk.pre)
	}
	rm.re.MatchTimeout = time.Millisecond
	if _, err := tk.Encode(strings.Repeat("a", 40)+"c", false); err == nil {
		t.Fatal("catastrophic regex: Encode succeeded, want a timeout error")
	}
	if ids, err := tk.Encode("ab", false); err != nil || !slices.Equal(ids, []uint32{256}) {
		t.Fatalf("Encode(ab) = %v, %v after a timeout", ids, err)
	}
}
