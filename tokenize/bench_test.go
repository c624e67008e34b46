package tokenize

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tokenize/chat"
	"github.com/kvgate/kvgate/tokenize/engine"
)

// agenticConversation builds a deterministic coding-agent conversation for Qwen3: a system
// prompt, tools, and turns of user request / assistant tool call / tool result (source files)
// until the rendered prompt reaches about targetTokens.
func agenticConversation(tk *Tokenizer, targetTokens int) []map[string]any {
	rng := rand.New(rand.NewPCG(7, 11))
	words := strings.Fields("func return if err nil ctx context buffer index block hash worker route token cache prefix session request response stream error value config handler server client model event batch queue window limit retry timeout metric score")
	code := func(lines int) string {
		var b strings.Builder
		for i := range lines {
			fmt.Fprintf(&b, "%s%s := %s(%s, %d) // %s %s\n", strings.Repeat("\t", 1+i%3), words[rng.IntN(len(words))], words[rng.IntN(len(words))], words[rng.IntN(len(words))], rng.IntN(1000), words[rng.IntN(len(words))], words[rng.IntN(len(words))])
		}
		return b.String()
	}
	msgs := []map[string]any{{"role": "system", "content": "You are a coding agent working in a Go repository. Use the tools to read and edit files."}}
	for turn := 0; ; turn++ {
		msgs = append(msgs,
			map[string]any{"role": "user", "content": fmt.Sprintf("Step %d: look at pkg/file%d.go and fix the failing test.", turn, turn)},
			map[string]any{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{"id": fmt.Sprintf("call_%d", turn), "type": "function", "function": map[string]any{"name": "read_file", "arguments": fmt.Sprintf(`{"path": "pkg/file%d.go"}`, turn)}}}},
			map[string]any{"role": "tool", "tool_call_id": fmt.Sprintf("call_%d", turn), "content": code(60)},
			map[string]any{"role": "assistant", "content": fmt.Sprintf("I changed pkg/file%d.go: %s", turn, code(4))},
		)
		body, _ := json.Marshal(map[string]any{"messages": msgs, "tools": benchTools})
		p, err := tk.TokenizeChat(context.Background(), body)
		if err != nil {
			panic(err)
		}
		if len(p.TokenIDs) >= targetTokens {
			return msgs
		}
	}
}

var benchTools = []any{
	map[string]any{"type": "function", "function": map[string]any{"name": "read_file", "description": "Read a file", "parameters": map[string]any{"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string"}}, "required": []any{"path"}}}},
	map[string]any{"type": "function", "function": map[string]any{"name": "write_file", "description": "Write a file", "parameters": map[string]any{"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string"}, "content": map[string]any{"type": "string"}}}}},
}

// benchTokenizer loads Qwen3 with (warm) or without (cold) the engine's segment cache and the
// chat message cache.
func benchTokenizer(b *testing.B, segmentCache bool) *Tokenizer {
	b.Helper()
	dir := filepath.Join(repoRoot, "models", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		b.Skip("model files missing")
	}
	var opts []engine.Option
	if segmentCache {
		opts = append(opts, engine.WithSegmentCache(256<<20))
	} else {
		opts = append(opts, engine.WithSegmentCache(0))
	}
	enc, err := engine.Load(dir, opts...)
	if err != nil {
		b.Fatal(err)
	}
	o := Options{}
	if !segmentCache {
		o.MessageCacheBytes = -1
	}
	tk, err := NewWithEncoder(enc, dir, o)
	if err != nil {
		b.Fatal(err)
	}
	return tk
}

// runRequests times the full request path (parse, render, encode, block hashes) per body and
// reports p50/p90 in ms; ns/op and allocs/op cover the same work.
func runRequests(b *testing.B, tk *Tokenizer, bodies [][]byte) {
	b.Helper()
	durs := make([]time.Duration, 0, b.N)
	var tokens int
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		p, err := tk.TokenizeChat(context.Background(), bodies[i%len(bodies)])
		if err != nil {
			b.Fatal(err)
		}
		h := p.BlockHashes(16)
		durs = append(durs, time.Since(start))
		tokens = len(p.TokenIDs) + len(h)*0
	}
	b.StopTimer()
	// CPU time per request (user+sys of the process, GC included) is robust against other
	// processes competing for the machine, unlike the wall-clock percentiles.
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
	slices.Sort(durs)
	b.ReportMetric(float64(durs[len(durs)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(durs[len(durs)*9/10].Microseconds())/1000, "p90-ms")
	b.ReportMetric(float64(tokens), "tokens")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkAgentic32kCold: a 32k-token agentic chat request never seen before (no segment
// cache, no message cache; the BPE piece cache is warm, as in a running gateway).
func BenchmarkAgentic32kCold(b *testing.B) {
	tk := benchTokenizer(b, false)
	msgs := agenticConversation(tk, 32000)
	body, _ := json.Marshal(map[string]any{"messages": msgs, "tools": benchTools})
	runRequests(b, tk, [][]byte{body})
}

// BenchmarkAgentic32kNextTurn: the previous turn of the same conversation was tokenized; each
// iteration sends the history plus a new assistant reply and a new user message (every body
// distinct, so nothing is served from an identical earlier request).
func BenchmarkAgentic32kNextTurn(b *testing.B) {
	tk := benchTokenizer(b, true)
	msgs := agenticConversation(tk, 32000)
	prev, _ := json.Marshal(map[string]any{"messages": msgs, "tools": benchTools})
	if _, err := tk.TokenizeChat(context.Background(), prev); err != nil {
		b.Fatal(err)
	}
	bodies := make([][]byte, b.N)
	for i := range bodies {
		next := append(slices.Clip(msgs),
			map[string]any{"role": "assistant", "content": fmt.Sprintf("Done with step %d.", i)},
			map[string]any{"role": "user", "content": fmt.Sprintf("Now run the tests for change %d and report.", i)})
		bodies[i], _ = json.Marshal(map[string]any{"messages": next, "tools": benchTools})
	}
	runRequests(b, tk, bodies)
}

// BenchmarkAgentic32kStages splits the warm next-turn path into its stages.
func BenchmarkAgentic32kStages(b *testing.B) {
	tk := benchTokenizer(b, true)
	msgs := agenticConversation(tk, 32000)
	body, _ := json.Marshal(map[string]any{"messages": msgs, "tools": benchTools})
	p, err := tk.TokenizeChat(context.Background(), body)
	if err != nil {
		b.Fatal(err)
	}
	stages := []struct {
		name string
		fn   func() error
	}{
		{"parse", func() error { _, err := chat.ParseChatBody(body); return err }},
		{"parse+render", func() error {
			cb, err := chat.ParseChatBody(body)
			if err == nil {
				_, err = tk.RenderChat(&cb.Request)
			}
			return err
		}},
		{"encode-cached", func() error { _, err := tk.Encode(p.Text, false); return err }},
		{"hash", func() error { p.BlockHashes(16); return nil }},
	}
	for _, st := range stages {
		b.Run(st.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				if err := st.fn(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
}
