package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
)

// BenchmarkRequestRouting measures the gateway's per-request routing work for a chat request of
// about 4,200 tokens over 8 targets, one of which holds the prompt in its index: "enrich" is the
// chat template, tokenization and block hashing of a repeated prompt (the tokenizer's caches
// warm), "enrich-cold" the same for prompts never seen (64 distinct ones, so at most the first
// 64 iterations are cold: use -benchtime 64x), "enrich+pick" adds the tiered match, scoring and
// choice; "parse+enrich" is "enrich" plus the request model's parse of the body. Run: go test ./cmd/kvgate -run '^$' -bench RequestRouting -benchtime 64x
func BenchmarkRequestRouting(b *testing.B) {
	tok := needModel(b)
	e := &enricher{tok: tok, blockSize: 16, baseModel: servedModel}
	body, err := json.Marshal(chatRequest("You are a benchmark.", longText(5, 280)))
	if err != nil {
		b.Fatal(err)
	}
	parser := apireq.NewParser(apireq.DefaultIdentity())
	in, perr := parser.Parse(apireq.ChatCompletions, body)
	if perr != nil {
		b.Fatal(perr)
	}
	ctx := context.Background()
	req := &router.Request{Model: servedModel}
	if err := e.Enrich(ctx, in, req); err != nil {
		b.Fatal(err)
	}

	ix := indexers.NewIndex(indexers.Options{BlockSize: 16})
	var cands []router.Candidate
	for i := range 8 {
		cands = append(cands, router.Candidate{Target: kvkey.Target{Worker: fmt.Sprintf("http://10.0.0.%d:8000", i)}})
	}
	prompt, err := tok.TokenizeChat(ctx, body)
	if err != nil {
		b.Fatal(err)
	}
	full := len(prompt.TokenIDs) / 16 * 16
	st := &indexers.BlockStored{TokenIDs: prompt.TokenIDs[:full], BlockSize: 16}
	for i := range full / 16 {
		st.BlockHashes = append(st.BlockHashes, indexers.IntHash(uint64(1000+i))) // vLLM's opaque ids
	}
	if err := ix.Apply(cands[3].Target, &indexers.EventBatch{Events: []indexers.Event{st}}); err != nil {
		b.Fatal(err)
	}
	pol, err := router.NewKV(router.DefaultKVConfig(), router.KVDeps{Matcher: ix})
	if err != nil {
		b.Fatal(err)
	}
	d, err := pol.Pick(ctx, req, cands)
	if err != nil || d.Chosen.Target != cands[3].Target || router.CachedBlocks(d) != len(req.BlockHashes) {
		b.Fatalf("setup: chose %v with %d cached blocks of %d (%v)", d.Chosen.Target, router.CachedBlocks(d), len(req.BlockHashes), err)
	}
	b.Logf("prompt: %d tokens, %d blocks", req.PromptTokens, len(req.BlockHashes))

	// Distinct prompts defeat the tokenizer's segment and message caches: the cost of a prompt
	// the gateway has never seen.
	const cold = 64
	colds := make([]*apireq.Request, cold)
	for i := range colds {
		cb, _ := json.Marshal(chatRequest(fmt.Sprintf("You are benchmark %d.", i), longText(100+i, 280)))
		if colds[i], perr = parser.Parse(apireq.ChatCompletions, cb); perr != nil {
			b.Fatal(perr)
		}
	}
	b.Run("enrich-cold", func(b *testing.B) {
		i := 0
		for b.Loop() {
			r := &router.Request{Model: servedModel}
			if err := e.Enrich(ctx, colds[i%cold], r); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("enrich", func(b *testing.B) {
		for b.Loop() {
			r := &router.Request{Model: servedModel}
			if err := e.Enrich(ctx, in, r); err != nil {
				b.Fatal(err)
			}
		}
	})
	// parse+enrich adds the request model's one parse of the body (the server's step before
	// the enricher): the whole request-side work before the policy's choice.
	b.Run("parse+enrich", func(b *testing.B) {
		for b.Loop() {
			pin, perr := parser.Parse(apireq.ChatCompletions, body)
			if perr != nil {
				b.Fatal(perr)
			}
			r := &router.Request{Model: servedModel}
			if err := e.Enrich(ctx, pin, r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("enrich+pick", func(b *testing.B) {
		for b.Loop() {
			r := &router.Request{Model: servedModel}
			if err := e.Enrich(ctx, in, r); err != nil {
				b.Fatal(err)
			}
			if _, err := pol.Pick(ctx, r, cands); err != nil {
				b.Fatal(err)
			}
		}
	})
}
