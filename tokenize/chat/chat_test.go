package chat

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// render compiles src and renders messages with the given flags and chat_template_kwargs x and f
// (JSON values whose Python rendering the tests pin); a test helper.
func render(t *testing.T, src, messages string, agp bool) (string, error) {
	t.Helper()
	tmpl, err := NewTemplate(src, TemplateOptions{
		Config: Config{Special: map[string]string{"bos_token": "<s>"}},
		Now:    func() time.Time { return time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC) },
	})
	if err != nil {
		t.Fatalf("compile %q: %v", src, err)
	}
	kwargs := `{"x":{"b":[1,{}],"a":"é\u2028<>&\u0001\""},"f":[1.0,1e-05,0.0001,123456789.0,1e16,-0.0]}`
	return tmpl.Render(&Request{Messages: []byte(messages), AddGenerationPrompt: agp, ChatTemplateKwargs: []byte(kwargs)})
}

// Expected values below were printed by Python 3.11 / Jinja2 3.1.6 with HF's environment.
func TestPythonSemantics(t *testing.T) {
	msgs := `[{"role":"user","content":"hi"}]`
	tests := []struct {
		name, src, want string
		wantErr         bool
	}{
		{"tojson python separators and order", `{{ x|tojson }}`, "{\"b\": [1, {}], \"a\": \"é\u2028<>&\\u0001\\\"\"}", false},
		{"tojson indent", `{{ x | tojson(indent=2) }}`, "{\n  \"b\": [\n    1,\n    {}\n  ],\n  \"a\": \"é\u2028<>&\\u0001\\\"\"\n}", false},
		{"tojson ensure_ascii", `{{ {"a": "é😀"}|tojson(ensure_ascii=true) }}`, `{"a": "\u00e9\ud83d\ude00"}`, false},
		{"tojson float repr", `{{ f|tojson }}`, `[1.0, 1e-05, 0.0001, 123456789.0, 1e+16, -0.0]`, false},
		{"tojson operand of concatenation", `{{ "x=" + messages[0].role|tojson + "!" }}`, `x="user"!`, false},
		{"tojson after filter chain", `{{ messages|map(attribute='role')|list|tojson }}`, `["user"]`, false},
		{"print none and floats", `{{ none }}|{{ 1.0 }}|{{ [1,'a',none,true] }}`, `None|1.0|[1, 'a', None, True]`, false},
		{"tilde converts with str", `{{ 'a' ~ none ~ 2.0 }}`, `aNone2.0`, false},
		{"str plus none is an error", `{{ 'a' + none }}`, "", true},
		{"str plus int is an error", `{{ 'a' + 1 }}`, "", true},
		{"str plus undefined is an error", `{{ 'a' + messages[0].missing }}`, "", true},
		{"numbers and lists add", `{{ 1 + 2 }} {{ 1 + 2.5 }} {{ [1] + [2] }}`, `3 3.5 [1, 2]`, false},
		{"precedence of + and ~", `{{ 'a' ~ 'b' + 'c' }}`, `abc`, false},
		{"generation tag stripped", "{% generation %}X{% endgeneration %}", "X", false},
		{"strftime_now fixed clock", `{{ strftime_now("%d %b %Y %H:%M") }}`, `14 Mar 2026 15:09`, false},
		{"raise_exception", `{{ raise_exception("bad roles") }}`, "", true},
		{"bos token", `{{ bos_token }}`, `<s>`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := render(t, tc.src, msgs, true)
			if tc.wantErr {
				var te *TemplateError
				if !errors.As(err, &te) {
					t.Fatalf("want *TemplateError, got %q, %v", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestRaiseExceptionMessage(t *testing.T) {
	_, err := render(t, `{{ raise_exception("Conversation roles must alternate") }}`, `[]`, true)
	var te *TemplateError
	if !errors.As(err, &te) || te.Message != "Conversation roles must alternate" {
		t.Fatalf("err %v: want the template's message verbatim", err)
	}
}

func TestDetectContentFormat(t *testing.T) {
	tests := []struct {
		src  string
		want ContentFormat
	}{
		{`{% for m in messages %}{{ m.content }}{% endfor %}`, ContentString},
		{`{% for m in messages %}{% for c in m['content'] %}{{ c.text }}{% endfor %}{% endfor %}`, ContentOpenAI},
		{`{% for m in messages %}{% for c in m.content | selectattr('type','eq','text') %}{% endfor %}{% endfor %}`, ContentOpenAI},
		{`{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% for c in m.content %}{% endfor %}{% endfor %}`, ContentOpenAI},
		{`{% for m in messages[0] %}{% for c in m.content %}{% endfor %}{% endfor %}`, ContentString},
		{`{% for c in other.content %}{% endfor %}`, ContentString},
	}
	for _, tc := range tests {
		if got := DetectContentFormat(tc.src); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.src, got, tc.want)
		}
	}
}

func TestPreprocessing(t *testing.T) {
	src := `{% for m in messages %}{{ m|tojson }}
{% endfor %}`
	tests := []struct {
		name, messages, want string
		wantErr              bool
	}{
		{"text parts joined with newline", `[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]`,
			`{"role": "user", "content": "a\nb"}`, false},
		{"null content is empty", `[{"role":"assistant","content":null}]`, `{"role": "assistant", "content": ""}`, false},
		{"reasoning copied to both names, arguments parsed", `[{"role":"assistant","content":"x","reasoning_content":"r","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"b\": 1, \"a\": 2}"}}]}]`,
			`{"role": "assistant", "content": "x", "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": 2}}}], "reasoning": "r", "reasoning_content": "r"}`, false},
		{"invalid arguments become {}", `[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":"nope"}}]}]`,
			`{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}`, false},
		{"empty tool_calls dropped", `[{"role":"assistant","content":"","tool_calls":[]}]`, `{"role": "assistant", "content": ""}`, false},
		{"tool message", `[{"role":"tool","tool_call_id":"c1","content":"ok","extra":1}]`, `{"role": "tool", "content": "ok", "tool_call_id": "c1"}`, false},
		{"image part rejected", `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]`, "", true},
		{"role missing", `[{"content":"x"}]`, "", true},
		{"content number", `[{"role":"user","content":5}]`, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := render(t, src, tc.messages, false)
			if tc.wantErr {
				var re *RequestError
				if !errors.As(err, &re) {
					t.Fatalf("want *RequestError, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSuffix(got, "\n") != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestContinueFinalMessage(t *testing.T) {
	src := `{% for m in messages %}<{{ m.role }}>{{ m.content }}</end>{% endfor %}`
	tmpl, err := NewTemplate(src, TemplateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := tmpl.Render(&Request{Messages: []byte(`[{"role":"user","content":"q"},{"role":"assistant","content":"The answer is "}]`), ContinueFinalMessage: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := "<user>q</end><assistant>The answer is "; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestParseChatBodyDefaults(t *testing.T) {
	cb, err := ParseChatBody([]byte(`{"messages":[],"cache_salt":"abc","reasoning_effort":"low"}`))
	if err != nil {
		t.Fatal(err)
	}
	if !cb.Request.AddGenerationPrompt || cb.Request.ContinueFinalMessage || cb.AddSpecialTokens || cb.CacheSalt != "abc" || cb.Request.ReasoningEffort != "low" {
		t.Errorf("defaults wrong: %+v", cb)
	}
	for _, body := range []string{
		`{"messages":{}}`,
		`{"messages":[],"cache_salt":5}`,
		`{"messages":[],"cache_salt":""}`,
		`{"messages":[],"add_generation_prompt":true,"continue_final_message":true}`,
	} {
		var re *RequestError
		if _, err := ParseChatBody([]byte(body)); !errors.As(err, &re) {
			t.Errorf("%s: want *RequestError, got %v", body, err)
		}
	}
	// vLLM accepts any non-empty string as a salt (vllm/entrypoints/openai/protocol.py,
	// check_cache_salt_support), so the template path does too.
	for _, tc := range []struct{ json, want string }{
		{`"a/b"`, "a/b"},
		{`"t@n\\ant"`, `t@n\ant`},
		{`"x\u0000y"`, "x\x00y"},
		{`"` + strings.Repeat("s", 300) + `"`, strings.Repeat("s", 300)},
	} {
		cb, err := ParseChatBody([]byte(`{"messages":[],"cache_salt":` + tc.json + `}`))
		if err != nil || cb.CacheSalt != tc.want {
			t.Errorf("salt %s: got %+v, %v; want %q", tc.json, cb, err, tc.want)
		}
	}
}

func TestPanicsBecomeTemplateErrors(t *testing.T) {
	// Whatever the engine does with odd input, Render must return, never panic.
	for _, src := range []string{`{{ '%s' % 1 }}`, `{{ messages[0].content[99] }}`, `{{ (1/0) }}`, `{% for x in 5 %}{% endfor %}`} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: panic escaped: %v", src, r)
				}
			}()
			_, _ = render(t, src, `[{"role":"user","content":"a"}]`, true)
		}()
	}
}

func TestMayMutate(t *testing.T) {
	tests := []struct {
		src  string
		want bool
	}{
		{`{% set ns = namespace(a=1) %}{% set ns.a = 2 %}{{ messages|length }}`, false},
		{`{% set x = {} %}{% set _ = x.update({'a': 1}) %}`, true},
		{`{% set l = [] %}{{ l.append(1) }}`, true},
		{`{% for m in messages %}{% set m.content = 'x' %}{% endfor %}`, true},
		{`{{ messages[0].content.split('x') }}`, false},
	}
	for _, tc := range tests {
		if got := mayMutate(tc.src); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.src, got, tc.want)
		}
	}
}

func TestMessageCacheBounded(t *testing.T) {
	c := newMessageCache(8 << 10)
	for i := range 200 {
		raw := []byte(`{"role":"user","content":"` + strings.Repeat("x", i) + `"}`)
		if _, err := c.conversationFromRaw([][]byte{raw}, ContentString, false); err != nil {
			t.Fatal(err)
		}
	}
	if c.size > c.maxBytes || c.lru.Len() != len(c.byKey) {
		t.Fatalf("size %d over budget %d (entries %d/%d)", c.size, c.maxBytes, c.lru.Len(), len(c.byKey))
	}
	// Same bytes hit; one changed byte misses and decodes its own content.
	a := []byte(`{"role":"user","content":"abc"}`)
	b := []byte(`{"role":"user","content":"abd"}`)
	ca, _ := c.conversationFromRaw([][]byte{a}, ContentString, false)
	cb, _ := c.conversationFromRaw([][]byte{b}, ContentString, false)
	va, _ := ca[0].AsDict().Get("content")
	vb, _ := cb[0].AsDict().Get("content")
	if va.AsString() != "abc" || vb.AsString() != "abd" {
		t.Fatalf("cache mixed up messages: %q %q", va.AsString(), vb.AsString())
	}
}
