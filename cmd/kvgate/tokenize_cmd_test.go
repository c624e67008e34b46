package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tokenize"
)

func TestTokenizeCommand(t *testing.T) {
	dir := filepath.Join("..", "..", "models", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("model files missing (run scripts/fetch-tokenizers.sh): %v", err)
	}
	tmp := t.TempDir()
	one := filepath.Join(tmp, "req.json")
	if err := os.WriteFile(one, []byte(`{"model":"m","messages":[{"role":"user","content":"`+strings.Repeat("Hello there. ", 30)+`"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	many := filepath.Join(tmp, "reqs.jsonl")
	lines := `{"prompt":"Hello world"}
{"text":"<|im_start|>hi"}
{"prompt":[1,2,3,4,5],"cache_salt":"x"}
{"messages":"bad"}
`
	if err := os.WriteFile(many, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	tk, err := testTokenizers.loadFolder(dir, tokenize.Options{})
	if err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	if err := runTokenize(context.Background(), []string{"--tokenizer", dir, "--request", one, "--block-size", "4"}, &out); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Prompt      string   `json:"prompt"`
		TokenIDs    []uint32 `json:"token_ids"`
		BlockSize   int      `json:"block_size"`
		BlockHashes []uint64 `json:"block_hashes"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if !strings.HasPrefix(got.Prompt, "<|im_start|>user\nHello there.") || got.BlockSize != 4 {
		t.Errorf("prompt %q, block size %d", got.Prompt, got.BlockSize)
	}
	want, _ := tk.Encode(got.Prompt, false)
	if len(got.TokenIDs) != len(want) || len(got.BlockHashes) != len(want)/4 {
		t.Errorf("%d ids (want %d), %d hashes (want %d)", len(got.TokenIDs), len(want), len(got.BlockHashes), len(want)/4)
	}
	hashes := tokenize.BlockHashes(got.TokenIDs, 4, tokenize.HashOptions{})
	for i := range hashes {
		if uint64(hashes[i]) != got.BlockHashes[i] {
			t.Fatalf("block hash %d differs from tokenize.BlockHashes", i)
		}
	}

	out.Reset()
	if err := runTokenizeShared(context.Background(), []string{"--tokenizer", dir, "--requests", many}, &out); err != nil {
		t.Fatal(err)
	}
	res := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(res) != 4 {
		t.Fatalf("want 4 JSON lines, got %d: %s", len(res), out.String())
	}
	var raw struct {
		TokenIDs    []uint32 `json:"token_ids"`
		BlockHashes []uint64 `json:"block_hashes"`
		Error       string   `json:"error"`
	}
	if err := json.Unmarshal([]byte(res[1]), &raw); err != nil || len(raw.TokenIDs) != 2 {
		t.Errorf("raw text with a special token inside: %s (%v)", res[1], err)
	}
	if err := json.Unmarshal([]byte(res[2]), &raw); err != nil || len(raw.TokenIDs) != 5 || len(raw.BlockHashes) != 0 {
		t.Errorf("id prompt shorter than a block: %s", res[2])
	}
	raw.Error = ""
	if err := json.Unmarshal([]byte(res[3]), &raw); err != nil || raw.Error == "" {
		t.Errorf("bad request should give an error line: %s", res[3])
	}

	if err := runTokenize(context.Background(), []string{"--request", one}, &out); err == nil {
		t.Error("missing --tokenizer must fail")
	}
}

// kvgate tokenize renders a Messages body as the worker's Anthropic entrypoint does: detected
// by its shape, or forced with --api messages; the same prompt comes out both ways.
func TestTokenizeCommandMessages(t *testing.T) {
	dir := filepath.Join("..", "..", "models", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("model files missing (run scripts/fetch-tokenizers.sh): %v", err)
	}
	tmp := t.TempDir()
	cases := []struct{ name, body string }{
		{"detected", `{"model":"m","max_tokens":4,"system":[{"type":"text","text":"Be terse."}],"messages":[{"role":"user","content":"Hi"}]}`},
		// As a chat body this renders the system turn last; as Messages it is merged first.
		{"forced", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"Hi"},{"role":"system","content":"Be terse."}]}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(tmp, tc.name+".json")
			if err := os.WriteFile(path, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			args := []string{"--tokenizer", dir, "--request", path}
			if tc.name == "forced" {
				args = append(args, "--api", "messages")
			}
			var out bytes.Buffer
			if err := runTokenizeShared(context.Background(), args, &out); err != nil {
				t.Fatal(err)
			}
			var got struct {
				Prompt string `json:"prompt"`
			}
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			want := "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
			if got.Prompt != want {
				t.Errorf("prompt %q, want %q", got.Prompt, want)
			}
		})
	}
}

// TestTokenizeCommandResponses: a Responses body is detected by its "input" (or named with
// --api responses) and rendered as vLLM's Responses entrypoint builds it: instructions first.
func TestTokenizeCommandResponses(t *testing.T) {
	dir := filepath.Join("..", "..", "models", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("model files missing (run scripts/fetch-tokenizers.sh): %v", err)
	}
	req := filepath.Join(t.TempDir(), "resp.json")
	if err := os.WriteFile(req, []byte(`{"model":"m","instructions":"Be brief.","input":"Hi"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{}, {"--api", "responses"}} {
		var out bytes.Buffer
		if err := runTokenizeShared(context.Background(), append([]string{"--tokenizer", dir, "--request", req}, args...), &out); err != nil {
			t.Fatal(err)
		}
		var got struct{ Prompt string }
		_ = json.Unmarshal(out.Bytes(), &got)
		if !strings.HasPrefix(got.Prompt, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi") {
			t.Errorf("%v: prompt %q", args, got.Prompt)
		}
	}
	// Every body the server reads: text.format (an object) and tools are read by the same
	// parser, with and without --api.
	full := filepath.Join(t.TempDir(), "full.json")
	if err := os.WriteFile(full, []byte(`{"model":"m","instructions":"Be brief.","input":"Hi","text":{"format":{"type":"json_schema","name":"a","schema":{"type":"object"}},"verbosity":"low"},"reasoning":{"effort":"low"},"tools":[{"type":"function","name":"f","parameters":{"type":"object"}},{"type":"web_search"}],"tool_choice":"auto","store":false}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{}, {"--api", "responses"}} {
		var out bytes.Buffer
		if err := runTokenizeShared(context.Background(), append([]string{"--tokenizer", dir, "--request", full}, args...), &out); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		var got struct{ Prompt string }
		_ = json.Unmarshal(out.Bytes(), &got)
		if !strings.Contains(got.Prompt, `"name": "f"`) || !strings.Contains(got.Prompt, "<|im_start|>user\nHi") {
			t.Errorf("%v: prompt %q", args, got.Prompt)
		}
	}
	// {"text": "..."} alone is still raw text.
	var raw bytes.Buffer
	rawReq := filepath.Join(t.TempDir(), "raw.json")
	_ = os.WriteFile(rawReq, []byte(`{"text":"Hi there"}`), 0o644)
	if err := runTokenizeShared(context.Background(), []string{"--tokenizer", dir, "--request", rawReq}, &raw); err != nil || !strings.Contains(raw.String(), `"prompt":"Hi there"`) {
		t.Errorf("raw text: %v %s", err, raw.String())
	}
	if err := runTokenizeShared(context.Background(), []string{"--tokenizer", dir, "--request", req, "--api", "anthropic"}, io.Discard); err == nil {
		t.Error("--api anthropic accepted")
	}
}
