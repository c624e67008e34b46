package main

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/server"
	"github.com/kvgate/kvgate/tokenize"
)

// enricher tokenizes each request exactly as the workers will (chat template, tokenizer,
// cache_salt, LoRA) and fills the routing request's prompt tokens and its local and chained
// block hashes.
type enricher struct {
	tok       *tokenize.Tokenizer
	blockSize int
	baseModel string
	// baseNames are the model's name and aliases (models[].aliases); nil: baseModel alone.
	baseNames []string
}

// Enrich implements server.RequestEnricher. A chat-template or request error is the client's:
// it comes back as server.BadRequest with the template's own message (vLLM answers 400 the
// same way). Anything else (a tokenizer fault, a cancelled context) is returned as is, and the
// server routes the request without block hashes.
func (e *enricher) Enrich(ctx context.Context, in *apireq.Request, req *router.Request) error {
	req.Stream = in.Stream
	if in.PreviousResponseID != "" {
		// The prompt starts with turns only the worker storing that response holds: the
		// request is routed by its pin (router.Request.PinResponseID), without block hashes.
		return nil
	}
	if in.Endpoint == apireq.Responses && e.tok.Harmony() {
		// vLLM renders a gpt-oss model's Responses with the Harmony encoding, not the chat
		// template (responses/serving.py, use_harmony); the gateway does not reproduce it, so
		// the request is routed without block hashes rather than with wrong ones.
		return nil
	}
	// vLLM needs room for one output token: a prompt of MaxModelLen tokens is refused.
	limit := max(in.MaxModelLen-1, 0)
	// The body was parsed once, by the request model: tokenize reads its views.
	ti := tokenize.Input{AddSpecialTokens: in.AddSpecialTokens, CacheSalt: in.CacheSalt}
	var err error
	if in.Endpoint == apireq.ChatCompletions || in.Endpoint.IsMessages() || in.Endpoint == apireq.Responses {
		ti.Chat, err = in.TemplateInput()
	} else {
		ti.Prompts, err = in.Prompts()
	}
	var p *tokenize.Prompt
	if err == nil {
		p, err = e.tok.TokenizeInput(ctx, ti, limit)
	}
	if err != nil {
		var te *tokenize.TemplateError
		var re *tokenize.RequestError
		var tl *tokenize.TooLongError
		switch {
		case errors.As(err, &tl):
			return server.ContextLengthError(in.MaxModelLen, tl.Tokens, tl.Exact)
		case errors.As(err, &te):
			return server.BadRequest("", te.Message)
		case errors.As(err, &re):
			return server.BadRequest(re.Param, re.Message)
		}
		return fmt.Errorf("tokenize: %w", err)
	}
	// A model other than the served one (or an alias of it) is a LoRA adapter the worker listed
	// (the server accepts no other): vLLM folds the adapter's name into every block hash.
	if req.Model != "" && req.Model != e.baseModel && !slices.Contains(e.baseNames, req.Model) {
		p.LoRAName = req.Model
	}
	req.PromptTokens = len(p.TokenIDs)
	req.BlockSize = e.blockSize
	req.LocalHashes = p.LocalHashes(e.blockSize)
	req.BlockHashes = tokenize.SequenceHashes(req.LocalHashes)
	return nil
}
