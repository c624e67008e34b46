package server

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/kvkey"
	openai "github.com/sashabaranov/go-openai"
)

// End to end with the real go-openai client through the gateway to two simulated workers.
func TestE2EOpenAIClient(t *testing.T) {
	a, b := startSim(t, fastSim()), startSim(t, fastSim())
	g := startGateway(t, nil, a.srv.URL, b.srv.URL)
	cl := g.client()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	t.Run("chat non-stream", func(t *testing.T) {
		resp, err := cl.CreateChatCompletion(ctx, chatReq(false, 8))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Model != testModel || len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
			t.Fatalf("unexpected response %+v", resp)
		}
		if resp.Usage.CompletionTokens != 8 || resp.Usage.PromptTokens == 0 {
			t.Errorf("usage %+v, want 8 completion tokens", resp.Usage)
		}
		if w := resp.Header().Get("X-Kvgate-Worker"); w != a.srv.URL && w != b.srv.URL {
			t.Errorf("X-Kvgate-Worker = %q", w)
		}
	})

	t.Run("chat stream with usage", func(t *testing.T) {
		req := chatReq(true, 6)
		req.StreamOptions = &openai.StreamOptions{IncludeUsage: true}
		st, err := cl.CreateChatCompletionStream(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if w := st.Header().Get("X-Kvgate-Worker"); w == "" {
			t.Error("stream lacks X-Kvgate-Worker")
		}
		if ct := st.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			t.Errorf("Content-Type = %q", ct)
		}
		var text strings.Builder
		var usage *openai.Usage
		chunks := 0
		for {
			ch, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			chunks++
			if len(ch.Choices) > 0 {
				text.WriteString(ch.Choices[0].Delta.Content)
			}
			if ch.Usage != nil {
				usage = ch.Usage
			}
		}
		if text.Len() == 0 || chunks < 6 {
			t.Errorf("got %d chunks, text %q", chunks, text.String())
		}
		if usage == nil || usage.CompletionTokens != 6 {
			t.Errorf("final usage chunk = %+v, want 6 completion tokens", usage)
		}
	})

	t.Run("completions non-stream", func(t *testing.T) {
		resp, err := cl.CreateCompletion(ctx, openai.CompletionRequest{Model: testModel, Prompt: "Once upon a time", MaxTokens: 5})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Choices) != 1 || resp.Choices[0].Text == "" || resp.Usage.CompletionTokens != 5 {
			t.Fatalf("unexpected response %+v", resp)
		}
	})

	t.Run("completions stream", func(t *testing.T) {
		st, err := cl.CreateCompletionStream(ctx, openai.CompletionRequest{Model: testModel, Prompt: "Once upon a time", MaxTokens: 4, Stream: true})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		var text strings.Builder
		for {
			ch, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(ch.Choices) > 0 {
				text.WriteString(ch.Choices[0].Text)
			}
		}
		if text.Len() == 0 {
			t.Error("no text streamed")
		}
	})

	t.Run("models", func(t *testing.T) {
		list, err := cl.ListModels(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Models) != 1 || list.Models[0].ID != testModel || list.Models[0].OwnedBy != "vllm" {
			t.Fatalf("models = %+v, want the workers' one card", list.Models)
		}
	})

	t.Run("unknown model is the OpenAI 404", func(t *testing.T) {
		req := chatReq(false, 4)
		req.Model = "nope"
		_, err := cl.CreateChatCompletion(ctx, req)
		var apiErr *openai.APIError
		if !errors.As(err, &apiErr) || apiErr.HTTPStatusCode != 404 || apiErr.Type != "invalid_request_error" || apiErr.Code != "model_not_found" {
			t.Fatalf("err = %#v", err)
		}
	})
}

func TestRoundRobinSpreads(t *testing.T) {
	a, b := startSim(t, fastSim()), startSim(t, fastSim())
	g := startGateway(t, nil, a.srv.URL, b.srv.URL)
	cl := g.client()
	seen := map[string]int{}
	var order []string
	for range 6 {
		resp, err := cl.CreateChatCompletion(context.Background(), chatReq(false, 2))
		if err != nil {
			t.Fatal(err)
		}
		w := resp.Header().Get("X-Kvgate-Worker")
		seen[w]++
		order = append(order, w)
	}
	if seen[a.srv.URL] != 3 || seen[b.srv.URL] != 3 {
		t.Fatalf("spread %v", seen)
	}
	for i := 1; i < len(order); i++ {
		if order[i] == order[i-1] {
			t.Fatalf("round robin repeated a worker: %v", order)
		}
	}
	if a.Stats().Completed != 3 || b.Stats().Completed != 3 {
		t.Errorf("workers completed %d and %d requests, want 3 each", a.Stats().Completed, b.Stats().Completed)
	}
}

// The body reaches the worker byte for byte (unknown fields, spacing), with X-Session-ID
// taken from the first configured session header (docs/ARCHITECTURE.md, "Session identity").
func TestForwardedByteForByte(t *testing.T) {
	w := startSim(t, fastSim())
	g := startGateway(t, nil, w.srv.URL)
	cases := []struct {
		name        string
		body        string
		header      map[string]string
		wantSession string
	}{
		{
			name:        "unknown fields and odd spacing, X-Correlation-ID",
			body:        `{ "model":"test-model", "messages":[{"role":"user","content":"hi"}],  "max_tokens":2, "top_k": 5, "my_ext": {"a":[1,2]}, "stop": "\n" }`,
			header:      map[string]string{"X-Correlation-ID": "corr-1", "X-Claude-Code-Session-Id": "later"},
			wantSession: "corr-1",
		},
		{
			name:        "first header wins",
			body:        `{"model":"test-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`,
			header:      map[string]string{"X-Session-Affinity": "aff", "X-Dynamo-Session-ID": "dyn"},
			wantSession: "dyn",
		},
		{
			name:        "nvext fallback",
			body:        `{"model":"test-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"nvext":{"session_control":{"session_id":"body-s","action":"close"}},"cache_salt":"salty"}`,
			wantSession: "body-s",
		},
		{
			name: "no session",
			body: `{"prompt":"hi","max_tokens":2}`,
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := pathChat
			if strings.Contains(tc.body, `"prompt"`) {
				path = pathCompletions
			}
			resp, data := g.post(t, path, tc.body, tc.header)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, data)
			}
			got := w.rec.all()[i]
			if string(got.body) != tc.body {
				t.Errorf("worker got body %q, want %q", got.body, tc.body)
			}
			if s := got.header.Get("X-Session-ID"); s != kvkey.HashSessionID(tc.wantSession) {
				t.Errorf("X-Session-ID = %q, want %q", s, tc.wantSession)
			}
			if got.header.Get("X-Forwarded-For") == "" {
				t.Error("no X-Forwarded-For")
			}
		})
	}
}

// TestSessionForwardHeader: the session id reaches the worker in the identity parser's forward
// header, not in a header name fixed in the proxy.
func TestSessionForwardHeader(t *testing.T) {
	w := startSim(t, fastSim())
	g := startGateway(t, nil, w.srv.URL)
	ic := apireq.DefaultIdentity()
	ic.ForwardHeader = "X-Worker-Session"
	g.requests = apireq.NewParser(ic) // before any request is served
	cases := []struct {
		name   string
		header map[string]string
		want   string
	}{
		{"session header", map[string]string{"X-Dynamo-Session-ID": "dyn-1"}, "dyn-1"},
		{"no session", nil, ""},
	}
	body := `{"model":"test-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, data := g.post(t, pathChat, body, tc.header)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, data)
			}
			if got := w.rec.all()[i].header.Get("X-Worker-Session"); got != kvkey.HashSessionID(tc.want) {
				t.Errorf("X-Worker-Session = %q, want %q", got, tc.want)
			}
		})
	}
}
