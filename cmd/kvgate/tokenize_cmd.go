package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/tokenize"
)

const tokenizeUsage = `usage: kvgate tokenize --tokenizer DIR (--request FILE|- | --requests FILE.jsonl|-) [flags]

Prints what the gateway computes for an OpenAI request, as JSON:
  {"prompt": "...", "token_ids": [...], "block_size": 16, "block_hashes": [...]}
The request may be a /v1/chat/completions body ("messages"), a /v1/completions body ("prompt":
a string or token ids; a batch prints one line per prompt), an Anthropic /v1/messages body
(detected, or --api messages: rendered as vLLM's Anthropic entrypoint converts it), a
/v1/responses body ("input", mapped as vLLM's Responses entrypoint does; or --api responses), or
{"text": "..."} to tokenize raw text without special tokens. --requests reads one request per line and writes one JSON line
per request ({"error": "..."} for a request that fails).
`

// runTokenize implements `kvgate tokenize`.
func runTokenize(ctx context.Context, args []string, stdout io.Writer) error {
	return runTokenizeWith(ctx, args, stdout, tokenize.Load)
}

// runTokenizeWith is runTokenize with the tokenizer loaded by load: the tests pass one that
// shares a loaded tokenizer across the test binary (a load takes seconds under -race).
func runTokenizeWith(ctx context.Context, args []string, stdout io.Writer, load func(dir string, opts tokenize.Options) (*tokenize.Tokenizer, error)) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dir := fs.String("tokenizer", "", "HF model folder with tokenizer.json and tokenizer_config.json (or a hub model id, downloaded into the HF cache)")
	reqPath := fs.String("request", "", "file holding one request body, or - for stdin")
	reqsPath := fs.String("requests", "", "JSONL file with one request body per line, or - for stdin")
	blockSize := fs.Int("block-size", 16, "KV block size of the workers (vLLM --block-size)")
	chatTemplate := fs.String("chat-template", "", "file with a chat template overriding the folder's")
	lora := fs.String("lora", "", "LoRA adapter name folded into the block hashes")
	api := fs.String("api", "auto", "request API: auto (detected from the body), openai (chat or completions), chat, completions, messages (Anthropic) or responses")
	inlineSystem := fs.String("inline-system", "merge", "Messages bodies: merge inline system messages into the leading one, or preserve them in place (anthropic.inline_system)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, tokenizeUsage)
			return nil
		}
		return fmt.Errorf("tokenize: %w\n%s", err, tokenizeUsage)
	}
	switch *api {
	case "auto", "openai", "chat", "completions", "messages", "responses":
	default:
		return fmt.Errorf("tokenize: --api %q is not auto, openai, chat, completions, messages or responses\n%s", *api, tokenizeUsage)
	}
	if *dir == "" || (*reqPath == "") == (*reqsPath == "") || *blockSize <= 0 {
		return fmt.Errorf("tokenize: need --tokenizer and exactly one of --request or --requests, and a positive --block-size\n%s", tokenizeUsage)
	}
	opts := tokenize.Options{}
	if *chatTemplate != "" {
		b, err := os.ReadFile(*chatTemplate)
		if err != nil {
			return fmt.Errorf("tokenize: read chat template: %w", err)
		}
		opts.ChatTemplate = string(b)
	}
	folder, err := tokenizerFolder(ctx, *dir)
	if err != nil {
		return err
	}
	tk, err := load(folder, opts)
	if err != nil {
		return fmt.Errorf("tokenize: %w", err)
	}
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false) // prompts are full of <|special|> tokens; keep them readable
	t := tokenizeRun{tk: tk, blockSize: *blockSize, lora: *lora, out: enc, api: *api,
		parser: apireq.NewParser(apireq.DefaultIdentity())}
	if err := t.parser.SetInlineSystem(*inlineSystem); err != nil {
		return fmt.Errorf("tokenize: --inline-system: %w", err)
	}
	if *reqPath != "" {
		body, err := readInput(*reqPath)
		if err != nil {
			return err
		}
		return t.one(ctx, body)
	}
	in, closeIn, err := openInput(*reqsPath)
	if err != nil {
		return err
	}
	defer closeIn()
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if err := t.one(ctx, line); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err := t.out.Encode(map[string]string{"error": err.Error()}); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("tokenize: read %s: %w", *reqsPath, err)
	}
	return nil
}

// tokenizerFolder returns dir when it is a folder; otherwise it treats it as a hub model id.
func tokenizerFolder(ctx context.Context, dir string) (string, error) {
	if st, err := os.Stat(dir); err == nil && st.IsDir() {
		return dir, nil
	}
	folder, err := tokenize.DownloadTokenizer(ctx, dir, tokenize.HubOptions{})
	if err != nil {
		return "", fmt.Errorf("tokenize: %s is not a folder and could not be fetched from the hub: %w", dir, err)
	}
	return folder, nil
}

// errHarmonyResponses is `kvgate tokenize`'s answer for a Responses body on a gpt-oss model.
var errHarmonyResponses = errors.New("gpt-oss (Harmony) model: vLLM renders /v1/responses with the Harmony encoding, not the chat template; " +
	"kvgate does not reproduce it and routes such requests without block hashes")

type tokenizeRun struct {
	tk        *tokenize.Tokenizer
	blockSize int
	lora      string
	out       *json.Encoder
	api       string         // auto, openai, chat, completions, messages or responses
	parser    *apireq.Parser // maps Messages and Responses bodies
}

type tokenizeOutput struct {
	Prompt      string            `json:"prompt"`
	TokenIDs    []uint32          `json:"token_ids"`
	BlockSize   int               `json:"block_size"`
	BlockHashes []kvkey.BlockHash `json:"block_hashes"`
}

func (t *tokenizeRun) one(ctx context.Context, body []byte) error {
	// The probe only tells the body kinds apart; the chosen endpoint's parser reads the body
	// (the server's own parse), so a Responses "text": {"format": ...} is not mistaken.
	var probe struct {
		Text     json.RawMessage `json:"text"`
		Messages json.RawMessage `json:"messages"`
		Prompt   json.RawMessage `json:"prompt"`
		Input    json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(body, &probe); err != nil {
		return fmt.Errorf("request is not a JSON object: %w", err)
	}
	var prompts []*tokenize.Prompt
	var endpoint apireq.Endpoint
	switch {
	case t.api == "messages" || (t.api == "auto" && apireq.LooksLikeMessages(body)):
		endpoint = apireq.Messages
	case t.api == "responses" || (t.api == "auto" && probe.Input != nil && probe.Messages == nil && probe.Prompt == nil):
		endpoint = apireq.Responses
	}
	if endpoint == apireq.Responses && t.tk.Harmony() {
		return errHarmonyResponses
	}
	if endpoint != "" {
		in, e := t.parser.Parse(endpoint, body)
		if e != nil {
			return e
		}
		ti, err := in.TemplateInput()
		if err != nil {
			return err
		}
		p, err := t.tk.TokenizeInput(ctx, tokenize.Input{Chat: ti, AddSpecialTokens: in.AddSpecialTokens, CacheSalt: in.CacheSalt}, 0)
		if err != nil {
			return err
		}
		prompts = []*tokenize.Prompt{p}
	} else if text, ok := rawText(probe.Text); ok && probe.Messages == nil && probe.Prompt == nil {
		ids, err := t.tk.Encode(text, false)
		if err != nil {
			return err
		}
		prompts = []*tokenize.Prompt{{Text: text, TokenIDs: ids}}
	} else {
		p, err := t.tk.TokenizeRequest(ctx, body)
		if err != nil {
			return err
		}
		prompts = []*tokenize.Prompt{p}
		if p.Batch != nil {
			prompts = p.Batch
		}
	}
	for _, p := range prompts {
		p.LoRAName = t.lora
		hashes := p.BlockHashes(t.blockSize)
		if hashes == nil {
			hashes = []kvkey.BlockHash{}
		}
		ids := p.TokenIDs
		if ids == nil {
			ids = []uint32{}
		}
		if err := t.out.Encode(tokenizeOutput{Prompt: p.Text, TokenIDs: ids, BlockSize: t.blockSize, BlockHashes: hashes}); err != nil {
			return err
		}
	}
	return nil
}

// rawText is the {"text": "..."} request's string; ok is false when text is absent or not a
// string.
func rawText(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

func readInput(path string) ([]byte, error) {
	if path == "-" {
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return nil, fmt.Errorf("tokenize: read stdin: %w", err)
		}
		return b, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	return b, nil
}

func openInput(path string) (io.Reader, func(), error) {
	if path == "-" {
		return os.Stdin, func() {}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("tokenize: %w", err)
	}
	return f, func() { f.Close() }, nil
}
