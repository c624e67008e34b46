package apireq

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/kvkey"
)

// Parse maps each endpoint's body into the one model, reading every field from one parse.
func TestParseFields(t *testing.T) {
	p := NewParser(DefaultIdentity())
	tr, fa := true, false
	cases := []struct {
		name     string
		endpoint Endpoint
		body     string
		want     Request
		messages int
	}{
		{"chat defaults", ChatCompletions, `{"messages":[{"role":"user","content":"hi"}]}`,
			Request{}, 1},
		{"chat fields", ChatCompletions, `{"model":"m","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":false},"cache_salt":"s/1","add_special_tokens":true,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"nvext":{"session_control":{"session_id":"x","parent_session_id":"y","action":"close"}}}`,
			Request{Model: "m", Stream: true, StreamOptions: &StreamOptions{IncludeUsage: &tr, ContinuousUsageStats: &fa}, CacheSalt: "s/1", AddSpecialTokens: true,
				SessionControl: &SessionControl{SessionID: "x", ParentSessionID: "y", Action: "close"}}, 2},
		{"message shapes", ChatCompletions, `{"messages":[null,{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":null,"tool_calls":[],"reasoning_content":"r","x":5},{"role":"tool","tool_call_id":"c","content":"r"}]}`,
			Request{}, 4},
		{"completions default add_special_tokens", Completions, `{"model":"m","prompt":"x"}`,
			Request{Model: "m", AddSpecialTokens: true}, 0},
		{"completions nulls are absent", Completions, `{"model":null,"prompt":[1,2],"stream_options":null,"cache_salt":null,"add_special_tokens":false}`,
			Request{}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, e := p.Parse(tc.endpoint, []byte(tc.body))
			if e != nil {
				t.Fatal(e)
			}
			if string(r.Body) != tc.body || r.Endpoint != tc.endpoint {
				t.Errorf("body or endpoint altered: %q %q", r.Body, r.Endpoint)
			}
			w := tc.want
			if r.Model != w.Model || r.Stream != w.Stream || r.CacheSalt != w.CacheSalt || r.AddSpecialTokens != w.AddSpecialTokens {
				t.Errorf("got model %q stream %v salt %q special %v, want %+v", r.Model, r.Stream, r.CacheSalt, r.AddSpecialTokens, w)
			}
			if (r.StreamOptions == nil) != (w.StreamOptions == nil) ||
				(r.StreamOptions != nil && (*r.StreamOptions.IncludeUsage != *w.StreamOptions.IncludeUsage || *r.StreamOptions.ContinuousUsageStats != *w.StreamOptions.ContinuousUsageStats)) {
				t.Errorf("stream options %+v, want %+v", r.StreamOptions, w.StreamOptions)
			}
			if (r.SessionControl == nil) != (w.SessionControl == nil) || (r.SessionControl != nil && *r.SessionControl != *w.SessionControl) {
				t.Errorf("session control %+v, want %+v", r.SessionControl, w.SessionControl)
			}
			if r.Messages() != tc.messages {
				t.Errorf("%d messages, want %d", r.Messages(), tc.messages)
			}
		})
	}
}

// The views the template path reads come from the same parse: no field is decoded twice.
func TestParseViews(t *testing.T) {
	p := NewParser(DefaultIdentity())
	r, e := p.Parse(ChatCompletions, []byte(`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":false}`))
	if e != nil {
		t.Fatal(e)
	}
	ti, err := r.TemplateInput()
	if err != nil || ti.AddGenerationPrompt {
		t.Fatalf("template input %+v, %v", ti, err)
	}
	if _, err := r.Prompts(); err == nil {
		t.Error("a chat request has no completions prompts")
	}
	// A request chat_template is the template path's refusal (vLLM's), not the parse's.
	r, e = p.Parse(ChatCompletions, []byte(`{"messages":[{"role":"user","content":"hi"}],"chat_template":"x"}`))
	if e != nil {
		t.Fatal(e)
	}
	if _, err := r.TemplateInput(); err == nil || !strings.Contains(err.Error(), "trust-request-chat-template") {
		t.Errorf("chat_template: %v", err)
	}
	c, e := p.Parse(Completions, []byte(`{"prompt":[[1,2],[3]]}`))
	if e != nil {
		t.Fatal(e)
	}
	ps, err := c.Prompts()
	if err != nil || len(ps) != 2 || len(ps[0].TokenIDs) != 2 || ps[1].TokenIDs[0] != 3 {
		t.Errorf("prompts %+v, %v", ps, err)
	}
}

// Refusals keep the gateway's messages (status, param, text).
func TestParseErrors(t *testing.T) {
	p := NewParser(DefaultIdentity())
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name     string
		endpoint Endpoint
		body     string
		status   int
		param    string
		msg      string
	}{
		{"empty", ChatCompletions, "  ", 400, "", "request body is empty; expected a JSON object"},
		{"unknown endpoint", "/v1/nope", "{}", 404, "", "unknown endpoint /v1/nope"},
		{"malformed", ChatCompletions, `{"a":1,}`, 400, "", "malformed JSON at byte 8: invalid character '}' looking for beginning of object key string"},
		{"malformed inside a message", ChatCompletions, `{"messages":[{"role":"user","content":"x\q"}]}`, 400, "", "malformed JSON at byte"},
		{"truncated", ChatCompletions, `{"model":"m"`, 400, "", "malformed JSON"},
		{"not an object", ChatCompletions, `[1]`, 400, "", "request body must be a JSON object"},
		{"missing messages", ChatCompletions, `{"model":"m"}`, 400, "messages", "messages: must be a non-empty array of messages"},
		{"messages not an array", ChatCompletions, `{"messages":"hi"}`, 400, "messages", "invalid type for messages: expected []openai.ChatCompletionMessage, got JSON string"},
		{"message not an object", ChatCompletions, `{"messages":["hi"]}`, 400, "messages", "invalid type for messages[0]"},
		{"role not a string", ChatCompletions, `{"messages":[{"role":5,"content":"x"}]}`, 400, "messages.role", "invalid type for messages.role: expected string, got JSON number"},
		{"content a number", ChatCompletions, `{"messages":[{"role":"user","content":5}]}`, 400, "messages.content", "invalid type for messages.content"},
		{"content an object", ChatCompletions, `{"messages":[{"role":"user","content":{"a":1}}]}`, 400, "messages.content", "got JSON object"},
		{"tool_calls an object", ChatCompletions, `{"messages":[{"role":"assistant","tool_calls":{}}]}`, 400, "messages.tool_calls", "invalid type for messages.tool_calls"},
		{"second message wrong", ChatCompletions, `{"messages":[{"role":"user","content":"x"},{"role":true}]}`, 400, "messages.role", "got JSON bool"},
		{"wrong int", ChatCompletions, `{` + msgs + `,"max_tokens":"ten"}`, 400, "max_tokens", "invalid type for max_tokens: expected int, got JSON string"},
		{"fraction for an int", Completions, `{"prompt":"x","max_tokens":1.5}`, 400, "max_tokens", "invalid type for max_tokens: expected int, got JSON number 1.5"},
		{"wrong bool", ChatCompletions, `{` + msgs + `,"stream":"yes"}`, 400, "stream", "invalid type for stream: expected bool, got JSON string"},
		{"nested", ChatCompletions, `{` + msgs + `,"stream":true,"stream_options":{"include_usage":1}}`, 400, "stream_options.include_usage", "invalid type for stream_options.include_usage: expected bool, got JSON number"},
		{"first error in key order", ChatCompletions, `{"temperature":"hot",` + msgs + `,"max_tokens":"ten"}`, 400, "temperature", "invalid type for temperature: expected float32"},
		{"bad stop", ChatCompletions, `{` + msgs + `,"stop":7}`, 400, "", "invalid request: stop: expected a string or an array of strings"},
		{"stop list of numbers", Completions, `{"prompt":"x","stop":["a",1]}`, 400, "", "stop: expected a string"},
		{"stream_options without stream", ChatCompletions, `{` + msgs + `,"stream_options":{}}`, 400, "stream_options", "Stream options can only be defined when `stream=True`."},
		{"empty salt", ChatCompletions, `{` + msgs + `,"cache_salt":""}`, 400, "cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided."},
		{"numeric salt", Completions, `{"prompt":"x","cache_salt":5}`, 400, "cache_salt", "non-empty string"},
		{"missing prompt", Completions, `{"prompt":null}`, 400, "prompt", "prompt: is required"},
		{"empty prompt", Completions, `{"prompt":[]}`, 400, "prompt", "prompt: must not be an empty array"},
		{"object prompt", Completions, `{"prompt":{}}`, 400, "prompt", "prompt: must be a string, an array of strings, or an array of token ids"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, e := p.Parse(tc.endpoint, []byte(tc.body))
			if e == nil {
				t.Fatal("accepted")
			}
			if e.Status != tc.status || e.Param != tc.param || !strings.Contains(e.Message, tc.msg) {
				t.Errorf("got %d %q %q, want %d %q %q", e.Status, e.Param, e.Message, tc.status, tc.param, tc.msg)
			}
		})
	}
}

// Identify reads the session from the headers and the same parse of the body.
func TestIdentify(t *testing.T) {
	p := NewParser(DefaultIdentity())
	r, e := p.Parse(ChatCompletions, []byte(`{"messages":[{"role":"user","content":"hi"}],"nvext":{"session_control":{"session_id":"b","action":"close"}}}`))
	if e != nil {
		t.Fatal(e)
	}
	if e := p.Identify(r, http.Header{}); e != nil {
		t.Fatal(e)
	}
	if r.Session != (Identity{SessionID: kvkey.HashSessionID("b"), Final: true, Source: "body:nvext.session_control.session_id"}) {
		t.Errorf("identity %+v", r.Session)
	}
	h := http.Header{}
	h.Set("X-Session-ID", strings.Repeat("x", MaxIDLength+1))
	if e := p.Identify(r, h); e == nil || e.Status != 400 {
		t.Errorf("too long an id: %v", e)
	}
}
