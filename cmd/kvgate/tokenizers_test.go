package main

import (
	"context"
	"io"
	"sync"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/tokenize"
)

// testTokenizers shares the tokenizers this test binary loads. Loading Qwen3's takes about
// 8 CPU-seconds under -race, and each end-to-end test would otherwise load it once for its
// simulated workers and again for every gateway it assembles. A Tokenizer is safe for
// concurrent use and its caches only memoize, so sharing one changes no result.
var testTokenizers = &tokenizerCache{m: map[string]*loadedTokenizer{}}

// tokenizerCache loads each tokenizer folder once.
type tokenizerCache struct {
	mu sync.Mutex
	m  map[string]*loadedTokenizer // by folder
}

type loadedTokenizer struct {
	once sync.Once
	tok  *tokenize.Tokenizer
	err  error
}

// load is loadTokenizer (a tokenizerLoader), shared per folder. A config with a chat template
// override or default template kwargs gets its own tokenizer, as the gateway builds it.
func (c *tokenizerCache) load(cfg configs.Config) (*tokenize.Tokenizer, error) {
	if cfg.ChatTemplate != "" || cfg.DefaultChatTemplateKwargs != "" {
		return loadTokenizer(cfg)
	}
	c.mu.Lock()
	e := c.m[cfg.Tokenizer]
	if e == nil {
		e = &loadedTokenizer{}
		c.m[cfg.Tokenizer] = e
	}
	c.mu.Unlock()
	e.once.Do(func() { e.tok, e.err = loadTokenizer(cfg) })
	return e.tok, e.err
}

// loadFolder is tokenize.Load for runTokenizeWith: a folder loaded without options (no chat
// template override) is the shared one of testTokenizers.
func (c *tokenizerCache) loadFolder(dir string, opts tokenize.Options) (*tokenize.Tokenizer, error) {
	if opts.ChatTemplate != "" || opts.DefaultChatTemplateKwargs != nil || opts.Now != nil ||
		opts.SegmentCacheBytes != 0 || opts.MessageCacheBytes != 0 {
		return tokenize.Load(dir, opts)
	}
	return c.load(configs.Config{Tokenizer: dir})
}

// runTokenizeShared is runTokenize with the test binary's shared tokenizers.
func runTokenizeShared(ctx context.Context, args []string, stdout io.Writer) error {
	return runTokenizeWith(ctx, args, stdout, testTokenizers.loadFolder)
}
