package main

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench"
)

// kvbench replays one Weka-style conversation through the gateway as chat completions,
// Anthropic Messages and stateless Responses: every request succeeds with usage, each turn's
// worker-reported prompt tokens are the same under the three APIs (the conversions render the
// same prompt), later turns read the cache, and the gateway's token count never differs from the
// worker's.
func TestKvbenchAPIs(t *testing.T) {
	tok := needModel(t)
	const bs = 64
	synth, err := bench.NewSynth(tok, bs)
	if err != nil {
		t.Fatal(err)
	}
	trace := func() *bench.Trace {
		s := &bench.Session{ID: "s", Namespace: "s", Mode: bench.ContextWeka, SystemTokens: 2 * bs, Turns: []bench.Turn{
			{InputTokens: 4*bs + 10, HashIDs: []int64{1, 2, 3, 4}, OutputTokens: 8},
			{InputTokens: 7*bs + 5, HashIDs: []int64{1, 2, 3, 4, 5, 6, 7}, OutputTokens: 8},
			{InputTokens: 9*bs + 20, HashIDs: []int64{1, 2, 3, 4, 5, 6, 7, 8, 9}, OutputTokens: 8},
		}}
		return &bench.Trace{Format: bench.FormatWeka, BlockSize: bs, Sessions: []*bench.Session{s}}
	}
	prompts := map[bench.API][]int{}
	for _, api := range []bench.API{bench.APIChat, bench.APIMessages, bench.APIResponses} {
		t.Run(string(api), func(t *testing.T) {
			f := startFleet(t, tok, fleetSpec{workers: 2, events: true})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := bench.Replay(ctx, trace(), synth, bench.ReplayOptions{URL: f.gw.URL, Model: servedModel, API: api,
				Mode: bench.ModeConcurrency, Concurrency: 1, IgnoreEOS: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Records) != 3 {
				t.Fatalf("%d records, want 3", len(res.Records))
			}
			for i, r := range res.Records {
				if !r.OK() || !r.HasUsage || r.OutputTokens != 8 || r.Chunks == 0 || r.TTFT <= 0 {
					t.Fatalf("turn %d: %+v", i, r)
				}
				prompts[api] = append(prompts[api], r.PromptTokens)
				if i > 0 && r.CachedTokens < 4*bs {
					t.Errorf("turn %d: %d cached tokens, want the earlier turns' blocks (>= %d)", i, r.CachedTokens, 4*bs)
				}
			}
			f.awaitSettled()
			// Every worker usage reached the gateway's feedback (with or without cached tokens).
			if n := f.metric("kvgate_router_usage_reports_total", nil) + f.metric("kvgate_router_usage_without_cached_tokens_total", nil); n != 3 {
				t.Errorf("%v usage reports, want 3", n)
			}
			if n := f.metric("kvgate_router_prompt_token_mismatches_total", nil); n != 0 {
				t.Errorf("%v prompt-token mismatches, want 0", n)
			}
		})
	}
	for _, api := range []bench.API{bench.APIMessages, bench.APIResponses} {
		if got, want := prompts[api], prompts[bench.APIChat]; len(got) != len(want) || len(want) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
			t.Errorf("%s prompt tokens %v, chat %v", api, got, want)
		}
	}
}
