package tokenize

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// wordEncoder is a stand-in Encoder: every word of its vocabulary is one token, anything else a
// token per byte.
type wordEncoder map[string]bool

func (w wordEncoder) Encode(text string, _ bool) ([]uint32, error) {
	if w[text] {
		return []uint32{1}, nil
	}
	return make([]uint32, len(text)), nil
}

func (w wordEncoder) Decode([]uint32, bool) (string, error) { return "", nil }

// harmonyModel tells gpt-oss folders: by config.json's model_type when present (vLLM's test,
// responses/serving.py use_harmony), else by Harmony's format tokens in the vocabulary.
func TestHarmonyModel(t *testing.T) {
	harmonyVocab := wordEncoder{"<|start|>": true, "<|channel|>": true, "<|message|>": true}
	cases := []struct {
		name, config string // config: config.json's content ("" = no such file)
		enc          Encoder
		want, fails  bool
	}{
		{"Harmony tokens, no config.json", "", harmonyVocab, true, false},
		{"two of the three tokens", "", wordEncoder{"<|start|>": true, "<|message|>": true}, false, false},
		{"no Harmony tokens", "", wordEncoder{}, false, false},
		{"config.json gpt_oss wins", `{"model_type":"gpt_oss","hidden_size":2880}`, wordEncoder{}, true, false},
		{"config.json other type wins", `{"model_type":"qwen3"}`, harmonyVocab, false, false},
		{"unreadable config.json", `{"model_type":`, harmonyVocab, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.config != "" {
				if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(tc.config), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := harmonyModel(dir, tc.enc)
			if (err != nil) != tc.fails || got != tc.want {
				t.Errorf("harmonyModel = %v, %v; want %v (error: %v)", got, err, tc.want, tc.fails)
			}
			if err != nil && !strings.Contains(err.Error(), "config.json") {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

// The real vocabularies: gpt-oss's has the Harmony tokens; Qwen3's and Llama 3.1's (with its
// many reserved <|...|> tokens) do not.
func TestHarmonyRealTokenizers(t *testing.T) {
	if testing.Short() {
		t.Skip("loads the real tokenizers")
	}
	for model, want := range map[string]bool{"gptoss": true, "qwen3": false, "llama3_1": false} {
		t.Run(model, func(t *testing.T) {
			dir := filepath.Join(repoRoot, "models", model)
			if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
				t.Skipf("model files missing (run scripts/fetch-tokenizers.sh): %v", err)
			}
			tk, err := testEncoders.load(dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if tk.Harmony() != want {
				t.Errorf("Harmony() = %v, want %v", tk.Harmony(), want)
			}
		})
	}
}
