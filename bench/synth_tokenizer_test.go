package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvgate/kvgate/tokenize"
)

// modelsDir holds the reference tokenizers (scripts/fetch-tokenizers.sh, run by the Makefile).
var modelsDir = filepath.Join("..", "models")

func loadTokenizer(t *testing.T, name string) *tokenize.Tokenizer {
	t.Helper()
	dir := filepath.Join(modelsDir, name)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("%s/tokenizer.json is absent: run scripts/fetch-tokenizers.sh (make fetches it before tests)", dir)
	}
	tk, err := tokenize.Load(dir, tokenize.Options{})
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	return tk
}

// TestSynthExactWithRealTokenizers checks, with each reference model's real tokenizer.json, that
// every synthetic block of real traces is exactly block_size tokens and that encoding the
// concatenated blocks equals concatenating their encodings (no merge across block boundaries),
// so the replayed prompts share exactly the prefixes the trace records.
func TestSynthExactWithRealTokenizers(t *testing.T) {
	traces := []struct {
		file   string
		blocks int // how many leading hash_ids of the first request to check
	}{
		{"trace_0291.json", 48},
		{"mooncake_conversation.head200.jsonl", 6},
	}
	for _, model := range []string{"qwen3", "llama3_1", "deepseek_v3", "gptoss", "gemma3"} {
		t.Run(model, func(t *testing.T) {
			t.Parallel() // loading a tokenizer.json dominates (seconds under -race)
			tk := loadTokenizer(t, model)
			for _, tc := range traces {
				tr, err := Load(filepath.Join(embeddedTraces, tc.file), LoadOptions{})
				if err != nil {
					t.Fatal(err)
				}
				s, err := NewSynth(tk, tr.BlockSize)
				if err != nil {
					t.Fatal(err)
				}
				ids := tr.Sessions[0].Turns[0].HashIDs
				if err := s.CheckExact(tk, tr.Sessions[0].Namespace, ids[:min(tc.blocks, len(ids))]); err != nil {
					t.Errorf("%s: %v", tc.file, err)
				}
				if model != "qwen3" {
					continue // the whole-turn check below is slow; one model (the demo's) is enough
				}
				// A whole turn of the reconstructed conversation is exactly `in` tokens.
				msgs := newConversation(tr.Sessions[0], s).messages(0)
				n := 0
				for _, m := range msgs {
					enc, err := tk.Encode(m.Content, false)
					if err != nil {
						t.Fatal(err)
					}
					n += len(enc)
				}
				if want := tr.Sessions[0].Turns[0].InputTokens; n != want {
					t.Errorf("%s turn 0: %d tokens, want %d", tc.file, n, want)
				}
			}
		})
	}
}
