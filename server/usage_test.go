package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/router"
)

func TestUsageCapture(t *testing.T) {
	chunk := func(s string) string { return "data: " + s + "\n\n" }
	cases := []struct {
		name   string
		body   string   // non-stream body
		events []string // SSE events, in order
		want   router.Usage
		ok     bool
	}{
		{"non-stream with details", `{"id":"x","usage":{"prompt_tokens":40,"total_tokens":42,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":32}}}`, nil,
			router.Usage{PromptTokens: 40, CachedTokens: 32, HasCached: true}, true},
		{"non-stream miss without details", `{"usage":{"prompt_tokens":9,"completion_tokens":1}}`, nil, router.Usage{PromptTokens: 9}, true},
		{"non-stream details null", `{"usage":{"prompt_tokens":9,"prompt_tokens_details":null}}`, nil, router.Usage{PromptTokens: 9}, true},
		{"non-stream cached 0 reported", `{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":0}}}`, nil, router.Usage{PromptTokens: 9, HasCached: true}, true},
		{"no usage", `{"id":"x","choices":[]}`, nil, router.Usage{}, false},
		{"usage null", `{"usage":null}`, nil, router.Usage{}, false},
		{"not JSON", `<html>`, nil, router.Usage{}, false},
		{"stream usage chunk", "", []string{chunk(`{"choices":[{"delta":{"content":"a"}}]}`),
			chunk(`{"choices":[],"usage":{"prompt_tokens":64,"prompt_tokens_details":{"cached_tokens":48}}}`), chunk("[DONE]")},
			router.Usage{PromptTokens: 64, CachedTokens: 48, HasCached: true}, true},
		{"stream continuous usage: the last wins", "", []string{
			chunk(`{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":64,"completion_tokens":1}}`),
			chunk(`{"choices":[{"delta":{"content":"b"}}],"usage":{"prompt_tokens":64,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":16}}}`),
			chunk("[DONE]")}, router.Usage{PromptTokens: 64, CachedTokens: 16, HasCached: true}, true},
		{"stream CRLF and split data lines", "", []string{"data: {\"usage\":\r\ndata: {\"prompt_tokens\":7}}\r\n\r\n"}, router.Usage{PromptTokens: 7}, true},
		{"stream without usage", "", []string{chunk(`{"choices":[{"delta":{"content":"a"}}]}`), chunk("[DONE]")}, router.Usage{}, false},
		// Anthropic usage (vllm/entrypoints/anthropic/serving.py, _build_anthropic_usage):
		// input_tokens excludes the cache read and creation counts.
		{"anthropic non-stream with cache fields", `{"id":"msg","type":"message","usage":{"input_tokens":8,"output_tokens":2,"cache_read_input_tokens":32,"cache_creation_input_tokens":4}}`, nil,
			router.Usage{PromptTokens: 44, CachedTokens: 32, HasCached: true}, true},
		{"anthropic non-stream without details", `{"usage":{"input_tokens":9,"output_tokens":1}}`, nil, router.Usage{PromptTokens: 9}, true},
		{"anthropic stream: message_delta wins over message_start", "", []string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":64,\"output_tokens\":0}}}\n\n",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":16,\"output_tokens\":3,\"cache_read_input_tokens\":48}}\n\n",
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
			router.Usage{PromptTokens: 64, CachedTokens: 48, HasCached: true}, true},
		{"anthropic stream message_start only", "", []string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":0}}}\n\n"},
			router.Usage{PromptTokens: 5}, true},
		// Responses usage (vllm/entrypoints/openai/responses/serving.py; OpenAI's ResponseUsage):
		// input_tokens includes the cached ones, reported in input_tokens_details.
		{"responses non-stream", `{"id":"resp_1","object":"response","usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":32},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":42}}`, nil,
			router.Usage{PromptTokens: 40, CachedTokens: 32, HasCached: true}, true},
		{"responses stream: response.completed", "", []string{
			"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\n",
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n",
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":64,\"input_tokens_details\":{\"cached_tokens\":48},\"output_tokens\":3,\"total_tokens\":67}}}\n\n"},
			router.Usage{PromptTokens: 64, CachedTokens: 48, HasCached: true}, true},
		{"oversized body is not read", `{"usage":{"prompt_tokens":1}}` + strings.Repeat(" ", maxUsageBody), nil, router.Usage{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := &usageCapture{}
			// Bodies arrive in pieces; write them in two.
			if tc.body != "" {
				half := len(tc.body) / 2
				u.body([]byte(tc.body[:half]))
				_, _ = u.Write([]byte(tc.body[half:]))
			}
			for _, ev := range tc.events {
				u.event([]byte(ev))
			}
			got, ok := u.usage()
			if ok != tc.ok || got != tc.want {
				t.Errorf("got %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
	var nilCapture *usageCapture
	nilCapture.body([]byte("x"))
	nilCapture.event([]byte(`data: {"usage":{"prompt_tokens":1}}`))
	if _, ok := nilCapture.usage(); ok {
		t.Error("a nil capture reported usage")
	}
}

// observingRouter is a round-robin router that records the usage the server reported on each
// attempt's Lifecycle (UsageSeen).
type observingRouter struct {
	router.Router
	mu   sync.Mutex
	seen []router.Usage
}

func (p *observingRouter) Route(ctx context.Context, req *router.Request, cands []router.Candidate) (router.Decision, router.Lifecycle, error) {
	d, life, err := p.Router.Route(ctx, req, cands)
	if err != nil {
		return d, nil, err
	}
	return d, observingLife{Lifecycle: life, p: p, req: req, d: d}, nil
}

type observingLife struct {
	router.Lifecycle
	p   *observingRouter
	req *router.Request
	d   router.Decision
}

func (l observingLife) UsageSeen(u router.Usage) {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	if l.req.Model == testModel && l.d.Chosen.Worker != "" {
		l.p.seen = append(l.p.seen, u)
	}
	l.Lifecycle.UsageSeen(u)
}

func (p *observingRouter) observed() []router.Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]router.Usage(nil), p.seen...)
}

// The server reads usage from non-stream bodies and from a stream's usage chunk (relayed
// unchanged) and hands it to the policy; error answers report nothing.
func TestUsageReachesObserver(t *testing.T) {
	a := startSim(t, fastSim())
	pol := &observingRouter{Router: routerFor(t, &router.RoundRobin{})}
	g := startGatewayWith(t, testGatewayConfig(a.srv.URL), pol, nil)
	ctx := context.Background()
	resp, err := g.client().CreateChatCompletion(ctx, chatReq(false, 2))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Header().Get(router.HeaderCachedBlocks); got != "0" {
		t.Errorf("%s = %q, want 0 for a policy that matches no blocks", router.HeaderCachedBlocks, got)
	}
	body := `{"model":"` + testModel + `","stream":true,"stream_options":{"include_usage":true},"max_tokens":2,"messages":[{"role":"user","content":"Hello there, how are you?"}]}`
	sresp, data := g.post(t, pathChat, body, nil)
	if sresp.StatusCode != http.StatusOK || !strings.Contains(string(data), `"usage":{"prompt_tokens":`) {
		t.Fatalf("stream: %d %s", sresp.StatusCode, data)
	}
	// A stream without include_usage has nothing to read.
	body = strings.Replace(body, `"stream_options":{"include_usage":true},`, "", 1)
	if sresp, _ := g.post(t, pathChat, body, nil); sresp.StatusCode != http.StatusOK {
		t.Fatal(sresp.Status)
	}
	// An error answer from the worker (over-long max_tokens) is not usage.
	if sresp, _ := g.post(t, pathChat, `{"model":"`+testModel+`","max_tokens":100000000,"messages":[{"role":"user","content":"x"}]}`, nil); sresp.StatusCode == http.StatusOK {
		t.Fatal("expected the worker to refuse max_tokens")
	}
	seen := pol.observed()
	if len(seen) != 2 || seen[0].PromptTokens != resp.Usage.PromptTokens || seen[1].PromptTokens != seen[0].PromptTokens {
		t.Errorf("observed %+v, want the non-stream and the include_usage stream (%d prompt tokens)", seen, resp.Usage.PromptTokens)
	}
}

// refusingEnricher refuses requests whose last message says "refuse" (as a chat template
// would) and fails internally on "crash".
type refusingEnricher struct{}

func (refusingEnricher) Enrich(_ context.Context, in *apireq.Request, _ *router.Request) error {
	if in.Messages() == 0 {
		return nil
	}
	var last struct{ Content string }
	_ = json.Unmarshal(in.RawMessage(in.Messages()-1), &last)
	switch last.Content {
	case "refuse":
		return BadRequest("messages", "Conversation roles must alternate user/assistant/user/assistant/...")
	case "crash":
		return errors.New("tokenizer exploded")
	}
	return nil
}

// An enricher's BadRequest is the client's error (400, its message, nothing sent to a worker);
// any other enricher error is logged and the request routed without enrichment.
func TestEnricherErrors(t *testing.T) {
	a := startSim(t, fastSim())
	g := startGatewayWith(t, testGatewayConfig(a.srv.URL), routerFor(t, &router.RoundRobin{}), refusingEnricher{})
	body := func(content string) string {
		return `{"model":"` + testModel + `","max_tokens":1,"messages":[{"role":"user","content":"` + content + `"}]}`
	}
	for _, path := range []string{pathChat, "/debug/route"} {
		resp, data := g.post(t, path, body("refuse"), nil)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(data), `"message":"Conversation roles must alternate`) ||
			!strings.Contains(string(data), `"param":"messages"`) || !strings.Contains(string(data), `"type":"BadRequestError"`) {
			t.Errorf("%s refused: %d %s", path, resp.StatusCode, data)
		}
	}
	if n := a.Stats().Requests; n != 0 {
		t.Errorf("a refused request reached the worker (%d requests)", n)
	}
	if resp, data := g.post(t, pathChat, body("crash"), nil); resp.StatusCode != http.StatusOK {
		t.Errorf("enricher fault failed the request: %d %s", resp.StatusCode, data)
	}
}
