// Command democlient sends a few chat requests through kvgate with the go-openai client and
// prints what it saw: which worker served each, the text, token usage and timings.
//
//	go run ./scripts/democlient --base http://127.0.0.1:8000/v1 --model demo-model
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	openai "github.com/sashabaranov/go-openai"
)

func main() {
	base := flag.String("base", "http://127.0.0.1:8000/v1", "kvgate's OpenAI base URL")
	model := flag.String("model", "demo-model", "model name")
	n := flag.Int("n", 4, "requests to send (alternating non-stream and stream)")
	flag.Parse()
	if err := run(*base, *model, *n); err != nil {
		fmt.Fprintln(os.Stderr, "democlient:", err)
		os.Exit(1)
	}
}

func run(base, model string, n int) error {
	key := os.Getenv("OPENAI_API_KEY") // kvgate's auth.api_keys, when it has any
	if key == "" {
		key = "unused"
	}
	cfg := openai.DefaultConfig(key)
	cfg.BaseURL = base
	cl := openai.NewClientWithConfig(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	models, err := cl.ListModels(ctx)
	if err != nil {
		return fmt.Errorf("list models: %w", err)
	}
	for _, m := range models.Models {
		fmt.Printf("model served by the fleet: %s (owned by %s)\n", m.ID, m.OwnedBy)
	}
	prompts := []string{
		"Explain KV-cache-aware routing in one sentence.",
		"Why does prefix caching make repeated system prompts cheap?",
		"Name three things a gateway in front of vLLM must do.",
		"What does a round-robin router ignore?",
	}
	for i := range n {
		req := openai.ChatCompletionRequest{
			Model:               model,
			MaxCompletionTokens: 16,
			Messages: []openai.ChatCompletionMessage{
				{Role: openai.ChatMessageRoleSystem, Content: "You are a concise assistant."},
				{Role: openai.ChatMessageRoleUser, Content: prompts[i%len(prompts)]},
			},
		}
		start := time.Now()
		if i%2 == 0 {
			resp, err := cl.CreateChatCompletion(ctx, req)
			if err != nil {
				return fmt.Errorf("request %d: %w", i+1, err)
			}
			fmt.Printf("#%d non-stream  worker=%s  %v  prompt=%d completion=%d tokens\n    %q\n",
				i+1, resp.Header().Get("X-Kvgate-Worker"), time.Since(start).Round(time.Millisecond),
				resp.Usage.PromptTokens, resp.Usage.CompletionTokens, resp.Choices[0].Message.Content)
			continue
		}
		req.Stream = true
		req.StreamOptions = &openai.StreamOptions{IncludeUsage: true}
		st, err := cl.CreateChatCompletionStream(ctx, req)
		if err != nil {
			return fmt.Errorf("request %d: %w", i+1, err)
		}
		var text strings.Builder
		var ttft time.Duration
		chunks := 0
		var usage *openai.Usage
		for {
			ch, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				st.Close()
				return fmt.Errorf("request %d stream: %w", i+1, err)
			}
			if chunks == 0 {
				ttft = time.Since(start)
			}
			chunks++
			if len(ch.Choices) > 0 {
				text.WriteString(ch.Choices[0].Delta.Content)
			}
			if ch.Usage != nil {
				usage = ch.Usage
			}
		}
		st.Close()
		completion := 0
		if usage != nil {
			completion = usage.CompletionTokens
		}
		fmt.Printf("#%d stream      worker=%s  %v (first chunk %v)  %d chunks, %d completion tokens\n    %q\n",
			i+1, st.Header().Get("X-Kvgate-Worker"), time.Since(start).Round(time.Millisecond),
			ttft.Round(time.Millisecond), chunks, completion, text.String())
	}
	return nil
}
