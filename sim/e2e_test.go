package sim

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/tokenize"
)

// modelDir returns the repo's Qwen3 tokenizer folder or skips when scripts/fetch-tokenizers.sh
// has not been run.
func modelDir(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "models", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("no tokenizer at %s (run scripts/fetch-tokenizers.sh)", dir)
	}
	return dir
}

// TestRealTokenizerUsage: with --model the worker tokenizes like the gateway does, so
// prompt_tokens is the real count and a repeated prompt reports the cached full blocks.
func TestRealTokenizerUsage(t *testing.T) {
	dir := modelDir(t)
	tok, err := tokenize.Load(dir, tokenize.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, base := startWorker(t, Options{ServedModelName: "Qwen/Qwen3-0.6B", Model: dir, Tokenize: tok, TTFT: time.Millisecond, ITL: time.Millisecond})
	c := newClient(base)
	msgs := []openai.ChatCompletionMessage{
		{Role: "system", Content: "You are a helpful assistant that answers questions about the history of computing in detail."},
		{Role: "user", Content: "Who built the first stored-program computer, and where was it built?"},
	}
	req := openai.ChatCompletionRequest{Model: "Qwen/Qwen3-0.6B", Messages: msgs, MaxCompletionTokens: 20}
	body, _ := json.Marshal(req)
	p, err := tok.TokenizeRequest(context.Background(), body)
	if err != nil {
		t.Fatal(err)
	}
	want := len(p.TokenIDs)
	// POST /tokenize returns exactly the ids the gateway computes.
	resp, err := http.Post(base+"/tokenize", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	var tr tokenizeResponse
	if err := json.NewDecoder(resp.Body).Decode(&tr); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if tr.Count != want || !slices.Equal(tr.Tokens, p.TokenIDs) {
		t.Errorf("/tokenize = %d tokens, want %d identical to tokenize.TokenizeRequest", tr.Count, want)
	}
	r1, err := c.CreateChatCompletion(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Usage.PromptTokens != want || r1.Usage.PromptTokensDetails != nil {
		t.Errorf("first: usage %+v, want %d prompt tokens and no cached tokens", r1.Usage, want)
	}
	r2, err := c.CreateChatCompletion(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	wantCached := (want - 1) / 16 * 16
	if r2.Usage.PromptTokensDetails == nil || r2.Usage.PromptTokensDetails.CachedTokens != wantCached {
		t.Errorf("second: usage %+v, want %d cached tokens", r2.Usage, wantCached)
	}
	// A follow-up turn shares the first prompt's full blocks.
	req.Messages = append(msgs, r1.Choices[0].Message, openai.ChatCompletionMessage{Role: "user", Content: "And when?"})
	r3, err := c.CreateChatCompletion(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if r3.Usage.PromptTokensDetails == nil || r3.Usage.PromptTokensDetails.CachedTokens < want/16*16-16 {
		t.Errorf("follow-up: usage %+v, want at least the first prompt's blocks cached", r3.Usage)
	}
	if got := r1.Choices[0].Message.Content; !strings.HasPrefix(got, "The quick brown fox") {
		t.Errorf("filler output %q", got)
	}
}

// TestTimingModelPrefill: a prompt served from the prefix cache is prefilled faster than the
// same prompt cold by exactly what the model says (PerfModel), and wall-clock time respects
// the speedup (only a lower bound is asserted, so the test is not timing-flaky).
func TestTimingModelPrefill(t *testing.T) {
	const speedup = 20
	records := make(chan RequestRecord, 4)
	_, base := startWorker(t, Options{ServedModelName: "m", Speedup: speedup, OnRequestDone: func(r RequestRecord) { records <- r }})
	ids := make([]string, 1000) // a 1000-token prompt as token ids (completions API)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 10)
	}
	body := `{"model":"m","prompt":[` + strings.Join(ids, ",") + `],"max_tokens":1}`
	perf := DefaultPerfModel()
	prefill := func(n, c int) time.Duration {
		return stepDuration(Options{Perf: perf}, prefillStep(n, c), 0)
	}
	for i, wantCached := range []int{0, 992} {
		start := time.Now()
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		wall := time.Since(start)
		r := <-records
		if r.CachedTokens != wantCached {
			t.Fatalf("request %d: cached %d, want %d", i, r.CachedTokens, wantCached)
		}
		want := prefill(1000-wantCached, wantCached)
		if r.SimTTFT != want {
			t.Errorf("request %d: modelled TTFT %v, want %v (prefill of %d tokens)", i, r.SimTTFT, want, 1000-wantCached)
		}
		if min := want / speedup; wall < min {
			t.Errorf("request %d: took %v wall, less than the modelled %v / speedup %d", i, wall, want, speedup)
		}
	}
	// The saving is the model's difference: 992 fewer tokens through the GEMMs, and attention
	// pairs 1000·500 cold against 8·(992+4) after the hit.
	saving := prefill(1000, 0) - prefill(8, 992)
	wantSaving := time.Duration((perf.PrefillAttn*(1000*500-8*996) + perf.PrefillB*(1000-8)) * float64(time.Millisecond))
	if d := saving - wantSaving; d < -time.Microsecond || d > time.Microsecond {
		t.Errorf("saving %v, want %v", saving, wantSaving)
	}
}
