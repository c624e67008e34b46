package tokenize

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/tokenize/chat"
	"github.com/kvgate/kvgate/tokenize/engine"
)

// TemplateInput is the input of a chat-template render (messages, tools, documents, flags);
// not to be confused with apireq.Request, the gateway's model of a whole request.
type TemplateInput = chat.Request

// CompletionPrompt is one prompt of a completions request: text to encode, or token ids.
type CompletionPrompt = chat.CompletionPrompt

// Input is a request body already parsed (once, by the gateway's request model): either the
// chat template input or the completions prompts, with what else shapes the tokens.
type Input struct {
	// Chat is the template input of a chat request; nil for completions.
	Chat *TemplateInput
	// Prompts are the prompts of a completions request (one per batch entry).
	Prompts []CompletionPrompt
	// AddSpecialTokens applies the tokenizer's post-processor (e.g. BOS) to encoded text.
	AddSpecialTokens bool
	// CacheSalt is the validated cache_salt ("" for none); it enters block 0's hash.
	CacheSalt string
}

// TemplateError is a failure raised by or inside the model's chat template; servers answer it
// with HTTP 400 and its Message, as vLLM does.
type TemplateError = chat.TemplateError

// RequestError is a malformed OpenAI body; servers answer it with HTTP 400 and its Message.
type RequestError = chat.RequestError

// TooLongError is a prompt with more tokens than the limit it was tokenized against (the
// model's max_model_len). Tokenizing stopped as soon as that was certain: Tokens is the exact
// count when Exact, else a lower bound. Servers answer it with HTTP 400, as vLLM does.
type TooLongError struct {
	Limit  int
	Tokens int
	Exact  bool
}

func (e *TooLongError) Error() string {
	n := fmt.Sprint(e.Tokens)
	if !e.Exact {
		n = "at least " + n
	}
	return fmt.Sprintf("prompt has %s tokens; the limit is %d", n, e.Limit)
}

// Options tunes a loaded Tokenizer. The zero value is usable.
type Options struct {
	// SegmentCacheBytes bounds the encoder's cache of already-tokenized text segments (the text
	// between special tokens, LRU by bytes). 0 keeps the backend's default; negative disables it.
	// Backends without such a cache ignore it.
	SegmentCacheBytes int64
	// ChatTemplate overrides the model folder's template (a Jinja source, like vLLM's
	// --chat-template). Empty: chat_template.jinja, else tokenizer_config.json "chat_template".
	ChatTemplate string
	// DefaultChatTemplateKwargs is a JSON object merged under every request's
	// chat_template_kwargs (vLLM's --default-chat-template-kwargs); request keys win.
	DefaultChatTemplateKwargs json.RawMessage
	// Now is the clock of the templates' strftime_now (tests inject a fixed time). Nil: time.Now.
	Now func() time.Time
	// MessageCacheBytes bounds the cache of preprocessed chat messages reused when a
	// conversation re-sends its history. 0: chat.DefaultMessageCacheBytes (64 MiB); negative
	// disables it.
	MessageCacheBytes int64
}

// Tokenizer turns OpenAI request bodies into the prompt text and token ids a vLLM worker
// serving the same model folder computes. It is safe for concurrent use.
type Tokenizer struct {
	enc     Encoder
	tmpl    *chat.Template // nil when the folder has no chat template
	opts    Options
	harmony bool // a gpt-oss model: vLLM renders its Responses with Harmony
}

// Load reads a HF model folder: tokenizer.json (required), tokenizer_config.json (special
// tokens, chat_template), and optionally chat_template.jinja and generation_config.json. A
// folder without any chat template loads; RenderChat then fails with a *TemplateError.
func Load(dir string, opts Options) (*Tokenizer, error) {
	enc, err := newEncoder(dir, opts.SegmentCacheBytes)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", dir, err)
	}
	return newTokenizer(enc, dir, opts)
}

// NewWithEncoder builds a Tokenizer around an already loaded Encoder, reading only the chat
// template configuration from dir (for alternative backends and tests).
func NewWithEncoder(enc Encoder, dir string, opts Options) (*Tokenizer, error) {
	return newTokenizer(enc, dir, opts)
}

func newTokenizer(enc Encoder, dir string, opts Options) (*Tokenizer, error) {
	cfg, err := chat.LoadConfig(dir)
	if err != nil {
		return nil, fmt.Errorf("load chat config %s: %w", dir, err)
	}
	if opts.ChatTemplate != "" {
		cfg.Template = opts.ChatTemplate
	}
	t := &Tokenizer{enc: enc, opts: opts}
	if t.harmony, err = harmonyModel(dir, enc); err != nil {
		return nil, err
	}
	if cfg.Template != "" {
		t.tmpl, err = chat.NewTemplate(cfg.Template, chat.TemplateOptions{
			Config:            cfg,
			Now:               opts.Now,
			DefaultKwargs:     opts.DefaultChatTemplateKwargs,
			MessageCacheBytes: opts.MessageCacheBytes,
		})
		if err != nil {
			return nil, fmt.Errorf("compile chat template of %s: %w", dir, err)
		}
	}
	return t, nil
}

// Harmony reports whether the model is a gpt-oss model, whose /v1/responses vLLM renders with
// the Harmony encoding instead of the chat template (responses/serving.py: use_harmony when
// hf_config.model_type is "gpt_oss"). The gateway does not reproduce Harmony rendering.
func (t *Tokenizer) Harmony() bool { return t.harmony }

// harmonyModel tells a gpt-oss folder: by config.json's model_type when the folder has one (as
// vLLM decides), else by the tokenizer, which then has Harmony's format tokens <|start|>,
// <|channel|> and <|message|> as single special tokens (tokenizer-only folders, like the ones
// scripts/fetch-tokenizers.sh and the hub download fetch, carry no config.json).
func harmonyModel(dir string, enc Encoder) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	switch {
	case err == nil:
		var cfg struct {
			ModelType string `json:"model_type"`
		}
		if err := json.Unmarshal(b, &cfg); err != nil {
			return false, fmt.Errorf("read %s/config.json: %w", dir, err)
		}
		return cfg.ModelType == "gpt_oss", nil
	case !errors.Is(err, fs.ErrNotExist):
		return false, fmt.Errorf("read %s/config.json: %w", dir, err)
	}
	for _, tok := range []string{"<|start|>", "<|channel|>", "<|message|>"} {
		ids, err := enc.Encode(tok, false)
		if err != nil {
			return false, fmt.Errorf("probe Harmony tokens: %w", err)
		}
		if len(ids) != 1 {
			return false, nil
		}
	}
	return true, nil
}

// Encoder returns the underlying tokenizer.json backend.
func (t *Tokenizer) Encoder() Encoder { return t.enc }

// HasChatTemplate reports whether the model folder (or Options) supplied a chat template.
func (t *Tokenizer) HasChatTemplate() bool { return t.tmpl != nil }

// Encode tokenizes text exactly as HF tokenizers does; addSpecialTokens applies the
// post-processor (e.g. Llama's BOS).
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	return t.enc.Encode(text, addSpecialTokens)
}

// Decode turns token ids back into text as HF tokenizers does.
func (t *Tokenizer) Decode(ids []uint32, skipSpecialTokens bool) (string, error) {
	return t.enc.Decode(ids, skipSpecialTokens)
}

// RenderChat renders the model's chat template for req the way HF transformers renders it
// (inside vLLM), after vLLM's message preprocessing. Template failures are *TemplateError,
// malformed messages *RequestError.
func (t *Tokenizer) RenderChat(req *TemplateInput) (string, error) {
	if t.tmpl == nil {
		return "", &TemplateError{Message: "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat template if the tokenizer does not define one."}
	}
	return t.tmpl.Render(req)
}

// Prompt is a tokenized request: what the worker will prefill, and what enters its block hashes.
type Prompt struct {
	// Text is the rendered chat prompt or the completions prompt ("" when given as token ids).
	Text string
	// TokenIDs are the prompt token ids the worker computes.
	TokenIDs []uint32
	// CacheSalt is the request's cache_salt ("" if none); it enters block 0's hash.
	CacheSalt string
	// LoRAName is the LoRA adapter the request targets ("" for the base model). The tokenizer
	// cannot tell adapters from model names; the server sets it from its model registry.
	LoRAName string
	// Batch holds every prompt of a batched completions request (prompt given as a list of
	// several strings or id lists), in order, when there is more than one; the receiver then
	// equals Batch[0]. Nil otherwise.
	Batch []*Prompt
}

// BlockHashes returns the chained hashes of the prompt's full blocks with its cache salt and
// LoRA folded in (see docs/routing.md, "Keys").
func (p *Prompt) BlockHashes(blockSize int) []kvkey.BlockHash {
	return SequenceHashes(p.LocalHashes(blockSize))
}

// LocalHashes returns the unchained hashes of the prompt's full blocks with its cache salt and
// LoRA folded in; SequenceHashes of them is BlockHashes.
func (p *Prompt) LocalHashes(blockSize int) []uint64 {
	return LocalHashes(p.TokenIDs, blockSize, HashOptions{LoRAName: p.LoRAName, CacheSalt: p.CacheSalt})
}

// TokenizeRequest tokenizes an OpenAI chat completions body (has "messages") or completions body
// (has "prompt") exactly as vLLM would. A body with neither is a *RequestError.
func (t *Tokenizer) TokenizeRequest(ctx context.Context, body []byte) (*Prompt, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, err := chat.ParseBody(body)
	if err != nil {
		return nil, err
	}
	if b.Kind == chat.KindChat {
		return t.tokenizeChat(ctx, b.Chat, 0)
	}
	return t.tokenizeCompletion(ctx, b.Completion, 0)
}

// TokenizeInput tokenizes an already parsed request exactly as TokenizeChatLimit or
// TokenizeCompletionLimit tokenize its body (nothing is parsed again), failing with a
// *TooLongError beyond maxTokens tokens (0: no limit).
func (t *Tokenizer) TokenizeInput(ctx context.Context, in Input, maxTokens int) (*Prompt, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if in.Chat != nil {
		return t.tokenizeChat(ctx, &chat.ChatBody{Request: *in.Chat, AddSpecialTokens: in.AddSpecialTokens, CacheSalt: in.CacheSalt}, maxTokens)
	}
	if len(in.Prompts) == 0 {
		return nil, &RequestError{Message: "'prompt' is required", Param: "prompt"}
	}
	return t.tokenizeCompletion(ctx, &chat.CompletionBody{Prompts: in.Prompts, AddSpecialTokens: in.AddSpecialTokens, CacheSalt: in.CacheSalt}, maxTokens)
}

// TokenizeChat tokenizes an OpenAI /v1/chat/completions body the way vLLM does: preprocess the
// messages, render the template (add_generation_prompt defaults to true), then encode the text
// with add_special_tokens defaulting to false because the template already carries BOS.
func (t *Tokenizer) TokenizeChat(ctx context.Context, body []byte) (*Prompt, error) {
	return t.TokenizeChatLimit(ctx, body, 0)
}

// TokenizeChatLimit is TokenizeChat that fails with a *TooLongError when the prompt has more than
// maxTokens tokens (0: no limit), stopping the encoder as soon as that is certain.
func (t *Tokenizer) TokenizeChatLimit(ctx context.Context, body []byte, maxTokens int) (*Prompt, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cb, err := chat.ParseChatBody(body)
	if err != nil {
		return nil, err
	}
	return t.tokenizeChat(ctx, cb, maxTokens)
}

func (t *Tokenizer) tokenizeChat(ctx context.Context, cb *chat.ChatBody, maxTokens int) (*Prompt, error) {
	text, err := t.RenderChat(&cb.Request)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids, err := t.encodeLimit(text, cb.AddSpecialTokens, maxTokens)
	if err != nil {
		return nil, fmt.Errorf("encode chat prompt: %w", err)
	}
	return &Prompt{Text: text, TokenIDs: ids, CacheSalt: cb.CacheSalt}, nil
}

// TokenizeCompletion tokenizes an OpenAI /v1/completions body the way vLLM does. "prompt" may be
// a string, a list of token ids, or a list of strings / of id lists (a batch, see Prompt.Batch);
// strings are encoded with add_special_tokens (default true), ids are taken as they are.
func (t *Tokenizer) TokenizeCompletion(ctx context.Context, body []byte) (*Prompt, error) {
	return t.TokenizeCompletionLimit(ctx, body, 0)
}

// TokenizeCompletionLimit is TokenizeCompletion that fails with a *TooLongError when any prompt
// of the request has more than maxTokens tokens (0: no limit).
func (t *Tokenizer) TokenizeCompletionLimit(ctx context.Context, body []byte, maxTokens int) (*Prompt, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cb, err := chat.ParseCompletionBody(body)
	if err != nil {
		return nil, err
	}
	return t.tokenizeCompletion(ctx, cb, maxTokens)
}

func (t *Tokenizer) tokenizeCompletion(ctx context.Context, cb *chat.CompletionBody, maxTokens int) (*Prompt, error) {
	out := make([]*Prompt, 0, len(cb.Prompts))
	for _, in := range cb.Prompts {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		p := &Prompt{Text: in.Text, TokenIDs: in.TokenIDs, CacheSalt: cb.CacheSalt}
		if in.TokenIDs == nil {
			ids, err := t.encodeLimit(in.Text, cb.AddSpecialTokens, maxTokens)
			if err != nil {
				return nil, fmt.Errorf("encode completion prompt: %w", err)
			}
			p.TokenIDs = ids
		} else if maxTokens > 0 && len(in.TokenIDs) > maxTokens {
			return nil, &TooLongError{Limit: maxTokens, Tokens: len(in.TokenIDs), Exact: true}
		}
		out = append(out, p)
	}
	first := out[0]
	if len(out) > 1 {
		first.Batch = out
	}
	return first, nil
}

// encodeLimit encodes text, failing with a *TooLongError beyond maxTokens (0: no limit).
func (t *Tokenizer) encodeLimit(text string, addSpecialTokens bool, maxTokens int) ([]uint32, error) {
	if maxTokens <= 0 {
		return t.enc.Encode(text, addSpecialTokens)
	}
	le, ok := t.enc.(LimitEncoder)
	if !ok {
		ids, err := t.enc.Encode(text, addSpecialTokens)
		if err == nil && len(ids) > maxTokens {
			return nil, &TooLongError{Limit: maxTokens, Tokens: len(ids), Exact: true}
		}
		return ids, err
	}
	ids, err := le.EncodeLimit(text, addSpecialTokens, maxTokens)
	var lim *engine.LimitError
	if errors.As(err, &lim) {
		return nil, &TooLongError{Limit: maxTokens, Tokens: lim.AtLeast}
	}
	return ids, err
}

// CacheMemory reports the accounted bytes and byte budgets of the tokenizer's two caches: the
// engine's segment cache (Options.SegmentCacheBytes; 0 for a backend without one) and the chat
// template's preprocessed-message cache (Options.MessageCacheBytes; 0 without a template).
func (t *Tokenizer) CacheMemory() (segUsed, segBudget, msgUsed, msgBudget int64) {
	if e, ok := t.enc.(interface{ SegmentCacheMemory() (int64, int64) }); ok {
		segUsed, segBudget = e.SegmentCacheMemory()
	}
	if t.tmpl != nil {
		msgUsed, msgBudget = t.tmpl.MessageCacheMemory()
	}
	return segUsed, segBudget, msgUsed, msgBudget
}
