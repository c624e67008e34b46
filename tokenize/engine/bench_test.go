package engine

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Encode throughput on the golden corpus, one goroutine (compare with
// scripts/goldens/bench-tokens.mjs, which times HF tokenizers on the same texts).
// Piece cache on (HF's BPE has its own word cache too), segment cache off.
func BenchmarkEncodeCorpus(b *testing.B) {
	benchCorpus(b, 1<<16)
}

// BenchmarkEncodeCorpusNoCache is the same with the piece cache off too: every pre-token goes
// through BPE, the engine's raw speed.
func BenchmarkEncodeCorpusNoCache(b *testing.B) {
	benchCorpus(b, 0)
}

func benchCorpus(b *testing.B, pieceCache int) {
	texts := corpus(b)
	var bytes int64
	for _, c := range texts {
		bytes += int64(len(c.Text))
	}
	for _, m := range goldenModels {
		b.Run(m, func(b *testing.B) {
			dir := filepath.Join(modelsDir, m)
			tk, err := Load(dir, WithPieceCache(pieceCache), WithoutTokenizerConfig())
			if err != nil {
				skipOrFail(b, "run scripts/fetch-tokenizers.sh: %v", err)
			}
			var tokens int
			b.SetBytes(bytes)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tokens = 0
				for _, c := range texts {
					ids, err := tk.Encode(c.Text, false)
					if err != nil {
						b.Fatal(err)
					}
					tokens += len(ids)
				}
			}
			b.ReportMetric(float64(tokens)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkEncodeShort reports allocations for one typical ~1 KB prompt.
func BenchmarkEncodeShort(b *testing.B) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog; it's 2026-11-30.\n", 16)
	for _, m := range goldenModels {
		b.Run(m, func(b *testing.B) {
			tk := loadModel(b, m, 0)
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := tk.Encode(text, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// chatHistory builds a ChatML conversation of about n tokens from corpus texts; each message is
// a segment between special tokens, as in a rendered chat template.
func chatHistory(texts []corpusLine, approxChars int) []string {
	var msgs []string
	size := 0
	for i := 0; size < approxChars; i++ {
		c := texts[(i*7)%len(texts)].Text
		if len(c) < 200 || len(c) > 5000 {
			continue
		}
		role := []string{"user", "assistant"}[len(msgs)%2]
		m := "<|im_start|>" + role + "\n" + c + "<|im_end|>\n"
		msgs = append(msgs, m)
		size += len(m)
	}
	return msgs
}

// BenchmarkHistoryTurn encodes a ~100k-token conversation whose previous turn was already
// encoded, with and without the segment cache.
func BenchmarkHistoryTurn(b *testing.B) {
	texts := corpus(b)
	msgs := chatHistory(texts, 400000)
	prev := strings.Join(msgs[:len(msgs)-1], "")
	full := strings.Join(msgs, "")
	for _, cache := range []int{0, 256 << 20} {
		b.Run(fmt.Sprintf("qwen3/segment-cache=%dMiB", cache>>20), func(b *testing.B) {
			tk := loadModel(b, "qwen3", cache)
			ids, err := tk.Encode(prev, false)
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if ids, err = tk.Encode(full, false); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(ids)), "tokens")
		})
	}
}

// BenchmarkLoad reports the load time and the heap a loaded tokenizer keeps.
func BenchmarkLoad(b *testing.B) {
	for _, m := range goldenModels {
		b.Run(m, func(b *testing.B) {
			dir := filepath.Join(modelsDir, m)
			var heap uint64
			for i := 0; i < b.N; i++ {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				tk, err := Load(dir)
				if err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				heap = after.HeapAlloc - before.HeapAlloc
				runtime.KeepAlive(tk)
			}
			b.ReportMetric(float64(heap)/(1<<20), "heap-MiB")
		})
	}
}
