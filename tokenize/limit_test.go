package tokenize

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func loadLlama(t *testing.T) *Tokenizer {
	t.Helper()
	dir := filepath.Join(repoRoot, "models", "llama3_1")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("model files missing (run scripts/fetch-tokenizers.sh): %v", err)
	}
	tk, err := testEncoders.load(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func chatBody(t *testing.T, contents ...string) []byte {
	t.Helper()
	msgs := make([]map[string]string, len(contents))
	for i, c := range contents {
		msgs[i] = map[string]string{"role": []string{"user", "assistant"}[i%2], "content": c}
	}
	b, err := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A limited tokenization equals the unlimited one within the limit and is a *TooLongError
// beyond it, for chat and completions bodies.
func TestTokenizeLimit(t *testing.T) {
	tk := loadLlama(t)
	ctx := context.Background()
	para := strings.Repeat("Lorem ipsum dolor sit amet, consectetur adipiscing elit. ", 2000)
	many := make([]string, 200)
	for i := range many {
		many[i] = para[:500+i]
	}
	ids := make([]int, 3000)
	for i := range ids {
		ids[i] = i % 1000
	}
	idsBody, _ := json.Marshal(map[string]any{"model": "m", "prompt": ids})
	strBody, _ := json.Marshal(map[string]any{"model": "m", "prompt": para})
	cases := []struct {
		name string
		body []byte
		run  func(context.Context, []byte, int) (*Prompt, error)
	}{
		{"chat, one long message", chatBody(t, para), tk.TokenizeChatLimit},
		{"chat, many messages", chatBody(t, many...), tk.TokenizeChatLimit},
		{"completion string", strBody, tk.TokenizeCompletionLimit},
		{"completion token ids", idsBody, tk.TokenizeCompletionLimit},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			full, err := tc.run(ctx, tc.body, 0)
			if err != nil {
				t.Fatal(err)
			}
			n := len(full.TokenIDs)
			for _, limit := range []int{n, n + 10} {
				p, err := tc.run(ctx, tc.body, limit)
				if err != nil || !slices.Equal(p.TokenIDs, full.TokenIDs) {
					t.Fatalf("limit %d of %d tokens: err %v", limit, n, err)
				}
			}
			for _, limit := range []int{n - 1, n / 2, 10} {
				_, err := tc.run(ctx, tc.body, limit)
				var tl *TooLongError
				if !errors.As(err, &tl) || tl.Limit != limit || tl.Tokens <= limit || tl.Tokens > n {
					t.Fatalf("limit %d of %d tokens: err %v, want a *TooLongError with %d < Tokens <= %d", limit, n, err, limit, n)
				}
			}
		})
	}
}

// The 30 MiB bodies of the abuse report are refused against a real context length (functional
// check only; scripts/measure-oversize.sh measures time and memory on the gateway process).
func TestTokenizeLimitHugeBodies(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("30 MiB bodies: not under -short or -race")
	}
	tk := loadLlama(t)
	text := strings.Repeat("hello world, this is a test of things. ", (30<<20)/39)
	parts := make([]string, 30<<10)
	for i := range parts {
		parts[i] = text[:1<<10]
	}
	for name, body := range map[string][]byte{"one message": chatBody(t, text), "many messages": chatBody(t, parts...)} {
		_, err := tk.TokenizeChatLimit(context.Background(), body, 131071)
		var tl *TooLongError
		if !errors.As(err, &tl) || tl.Tokens <= 131071 {
			t.Errorf("%s: err %v, want a *TooLongError", name, err)
		}
	}
}
