package tokenize

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tokenize/chat"
)

const repoRoot = ".."

type chatGoldenHeader struct {
	TemplateFile string `json:"template_file"`
	ModelDir     string `json:"model_dir"`
	Now          string `json:"now"`
}

type idsGolden struct {
	I      int      `json:"i"`
	N      int      `json:"n"`
	SHA256 string   `json:"sha256"`
	Head   []uint32 `json:"head"`
}

// loadGoldenTokenizer loads the model folder and template a chat golden file was made with.
func loadGoldenTokenizer(t testing.TB, h chatGoldenHeader) *Tokenizer {
	t.Helper()
	dir := filepath.Join(repoRoot, "models", h.ModelDir)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("model files missing (run scripts/fetch-tokenizers.sh): %v", err)
	}
	now, err := time.Parse("2006-01-02T15:04:05", h.Now)
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Now: func() time.Time { return now }}
	if h.TemplateFile != "" {
		out, err := exec.Command("go", "env", "GOMODCACHE").Output()
		if err != nil {
			t.Skipf("go env GOMODCACHE: %v", err)
		}
		b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "github.com/ardanlabs/jinja@v1.8.0/testdata/templates", h.TemplateFile))
		if err != nil {
			t.Skipf("template not in module cache: %v", err)
		}
		opts.ChatTemplate = string(b)
	}
	tk, err := testEncoders.load(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func readLines(t testing.TB, path string) [][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var out [][]byte
	for sc.Scan() {
		out = append(out, append([]byte(nil), sc.Bytes()...))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func idsDigest(ids []uint32) string {
	b := make([]byte, 4*len(ids))
	for i, id := range ids {
		binary.LittleEndian.PutUint32(b[4*i:], id)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestGoldenChatTokenIDs runs every golden chat request through the full path (vLLM
// preprocessing, template, encode) and requires the token ids HF tokenizers produced for the
// Jinja2-rendered prompt (scripts/goldens/gen-chat.py + gen-chat-ids.mjs).
func TestGoldenChatTokenIDs(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(repoRoot, "testdata/chat/*.ids.jsonl"))
	if len(files) == 0 {
		t.Fatal("no token-id goldens under testdata/chat")
	}
	for _, idsPath := range files {
		name := strings.TrimSuffix(filepath.Base(idsPath), ".ids.jsonl")
		t.Run(name, func(t *testing.T) {
			lines := readLines(t, filepath.Join(repoRoot, "testdata/chat", name+".jsonl"))
			var h chatGoldenHeader
			if err := json.Unmarshal(lines[0], &h); err != nil {
				t.Fatal(err)
			}
			tk := loadGoldenTokenizer(t, h)
			goldens := readLines(t, idsPath)
			if len(goldens) < 300 {
				t.Errorf("only %d token-id goldens", len(goldens))
			}
			bad := 0
			for _, line := range goldens {
				var g idsGolden
				if err := json.Unmarshal(line, &g); err != nil {
					t.Fatal(err)
				}
				var rec struct {
					Request json.RawMessage `json:"request"`
				}
				if err := json.Unmarshal(lines[g.I+1], &rec); err != nil {
					t.Fatal(err)
				}
				p, err := tk.TokenizeRequest(context.Background(), rec.Request)
				if err != nil {
					t.Errorf("#%d: %v", g.I, err)
					bad++
				} else if len(p.TokenIDs) != g.N || idsDigest(p.TokenIDs) != g.SHA256 {
					bad++
					head := p.TokenIDs[:min(len(p.TokenIDs), len(g.Head))]
					t.Errorf("#%d: %d ids (want %d), head %v, want head %v", g.I, len(p.TokenIDs), g.N, head, g.Head)
				}
				if bad > 5 {
					t.Fatal("stopping after 5 mismatches")
				}
			}
		})
	}
}

func TestTokenizeRequestKinds(t *testing.T) {
	tk := loadGoldenTokenizer(t, chatGoldenHeader{ModelDir: "llama3_1", Now: "2026-03-14T15:09:26"})
	bos, err := tk.Encode("<|begin_of_text|>", false)
	if err != nil || len(bos) != 1 {
		t.Fatalf("encode BOS: %v %v", bos, err)
	}
	hello, err := tk.Encode("Hello world", false)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		body     string
		wantIDs  []uint32 // nil: not checked
		wantText string
		wantSalt string
		wantErr  any
		batch    int
	}{
		{name: "completion string adds BOS", body: `{"prompt":"Hello world"}`, wantIDs: append(append([]uint32{}, bos...), hello...), wantText: "Hello world"},
		{name: "completion without special tokens", body: `{"prompt":"Hello world","add_special_tokens":false}`, wantIDs: hello},
		{name: "completion ids taken as is", body: `{"prompt":[5,6,7],"cache_salt":"s1"}`, wantIDs: []uint32{5, 6, 7}, wantSalt: "s1"},
		{name: "completion batch of strings", body: `{"prompt":["Hello world","x"],"add_special_tokens":false}`, wantIDs: hello, batch: 2},
		{name: "completion batch of ids", body: `{"prompt":[[1,2],[3]]}`, wantIDs: []uint32{1, 2}, batch: 2},
		{name: "chat carries BOS once", body: `{"messages":[{"role":"user","content":"Hello world"}]}`, wantText: "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello world<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
		{name: "negative id", body: `{"prompt":[1,-2]}`, wantErr: &RequestError{}},
		{name: "empty salt", body: `{"prompt":"x","cache_salt":""}`, wantErr: &RequestError{}},
		{name: "neither messages nor prompt", body: `{"model":"m"}`, wantErr: &RequestError{}},
		{name: "not json", body: `{"messages":`, wantErr: &RequestError{}},
		{name: "both generation flags", body: `{"messages":[{"role":"user","content":"a"}],"continue_final_message":true}`, wantErr: &RequestError{}},
		{name: "request chat_template refused", body: `{"messages":[{"role":"user","content":"a"}],"chat_template":"{{ 1 }}"}`, wantErr: &RequestError{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := tk.TokenizeRequest(context.Background(), []byte(tc.body))
			if tc.wantErr != nil {
				var re *RequestError
				if !errors.As(err, &re) {
					t.Fatalf("err = %v, want *RequestError", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantIDs != nil && !equalIDs(p.TokenIDs, tc.wantIDs) {
				t.Errorf("ids %v, want %v", p.TokenIDs, tc.wantIDs)
			}
			if tc.wantText != "" && p.Text != tc.wantText {
				t.Errorf("text %q, want %q", p.Text, tc.wantText)
			}
			if tc.name == "chat carries BOS once" && (len(p.TokenIDs) == 0 || p.TokenIDs[0] != bos[0] || (len(p.TokenIDs) > 1 && p.TokenIDs[1] == bos[0])) {
				t.Errorf("chat ids should start with exactly one BOS: %v", p.TokenIDs[:min(4, len(p.TokenIDs))])
			}
			if p.CacheSalt != tc.wantSalt {
				t.Errorf("salt %q, want %q", p.CacheSalt, tc.wantSalt)
			}
			if len(p.Batch) != tc.batch && !(tc.batch == 0 && p.Batch == nil) {
				t.Errorf("batch %d, want %d", len(p.Batch), tc.batch)
			}
			// An already parsed request (the gateway's one parse) tokenizes the same.
			in := parsedInput(t, tc.body)
			q, err := tk.TokenizeInput(context.Background(), in, 0)
			if err != nil {
				t.Fatal(err)
			}
			if q.Text != p.Text || !equalIDs(q.TokenIDs, p.TokenIDs) || q.CacheSalt != p.CacheSalt || len(q.Batch) != len(p.Batch) {
				t.Errorf("TokenizeInput %+v, TokenizeRequest %+v", q, p)
			}
		})
	}
}

// parsedInput maps a body into tokenize.Input from one chat.Document, as the request model does.
func parsedInput(t *testing.T, body string) Input {
	t.Helper()
	doc, err := chat.ParseDocument([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	salt, err := doc.CacheSalt()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := doc.Get("messages"); ok {
		cb, err := doc.ChatBody()
		if err != nil {
			t.Fatal(err)
		}
		return Input{Chat: &cb.Request, AddSpecialTokens: cb.AddSpecialTokens, CacheSalt: salt}
	}
	cb, err := doc.CompletionBody()
	if err != nil {
		t.Fatal(err)
	}
	return Input{Prompts: cb.Prompts, AddSpecialTokens: cb.AddSpecialTokens, CacheSalt: salt}
}

func TestTemplateErrorIsTyped(t *testing.T) {
	tk := loadGoldenTokenizer(t, chatGoldenHeader{ModelDir: "gemma3", Now: "2026-03-14T15:09:26"})
	_, err := tk.TokenizeChat(context.Background(), []byte(`{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`))
	var te *TemplateError
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want *TemplateError", err)
	}
	if te.Message != "Conversation roles must alternate user/assistant/user/assistant/..." {
		t.Errorf("message %q is not the template's raise_exception text", te.Message)
	}
}

func TestPromptBlockHashes(t *testing.T) {
	ids := make([]uint32, 40)
	for i := range ids {
		ids[i] = uint32(i + 1)
	}
	plain := (&Prompt{TokenIDs: ids}).BlockHashes(16)
	salted := (&Prompt{TokenIDs: ids, CacheSalt: "s"}).BlockHashes(16)
	lora := (&Prompt{TokenIDs: ids, LoRAName: "a"}).BlockHashes(16)
	if len(plain) != 2 || len(salted) != 2 || len(lora) != 2 {
		t.Fatalf("want 2 full blocks of 16 from 40 ids: %d %d %d", len(plain), len(salted), len(lora))
	}
	want := BlockHashes(ids, 16, HashOptions{CacheSalt: "s"})
	if salted[0] != want[0] || salted[1] != want[1] {
		t.Errorf("salted hashes differ from BlockHashes with CacheSalt")
	}
	if plain[0] == salted[0] || plain[0] == lora[0] || salted[0] == lora[0] {
		t.Errorf("salt and LoRA must change block 0's hash")
	}
}

func TestContextCancelled(t *testing.T) {
	tk := loadGoldenTokenizer(t, chatGoldenHeader{ModelDir: "llama3_1", Now: "2026-03-14T15:09:26"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tk.TokenizeRequest(ctx, []byte(`{"prompt":"x"}`)); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func equalIDs(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestConcurrentRequests shares one Tokenizer (and its message and segment caches) between
// goroutines; every result must equal the sequential one (run with -race).
func TestConcurrentRequests(t *testing.T) {
	lines := readLines(t, filepath.Join(repoRoot, "testdata/chat/qwen3.jsonl"))
	var h chatGoldenHeader
	if err := json.Unmarshal(lines[0], &h); err != nil {
		t.Fatal(err)
	}
	tk := loadGoldenTokenizer(t, h)
	var bodies [][]byte
	var want []string
	for _, l := range lines[1:min(len(lines), 61)] {
		var rec struct {
			Request json.RawMessage `json:"request"`
		}
		if err := json.Unmarshal(l, &rec); err != nil {
			t.Fatal(err)
		}
		p, err := tk.TokenizeRequest(context.Background(), rec.Request)
		if err != nil {
			continue
		}
		bodies = append(bodies, rec.Request)
		want = append(want, idsDigest(p.TokenIDs))
	}
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			for i := range bodies {
				k := (i + g*7) % len(bodies)
				p, err := tk.TokenizeRequest(context.Background(), bodies[k])
				if err != nil {
					errs <- err
					return
				}
				if idsDigest(p.TokenIDs) != want[k] {
					errs <- fmt.Errorf("request %d: concurrent result differs", k)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
