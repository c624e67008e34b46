package apireq

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func compact(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("invalid JSON %s: %v", s, err)
	}
	return b.String()
}

// The conversion of vllm/entrypoints/anthropic/serving.py
// (AnthropicServingMessages.to_chat_completion_request, inline system messages merged as
// _detect_merge_inline_system decides without --chat-template), rule by rule. Expected
// messages keep vLLM's key insertion order.
func TestMessagesConversion(t *testing.T) {
	p := NewParser(DefaultIdentity())
	cases := []struct {
		name, body, messages, tools string
	}{
		{
			// _convert_system_message: billing-header blocks skipped, texts joined with "";
			// _convert_message_content: reasoning, tool_calls, then content; a tool_result of a
			// user turn is a tool message emitted before the turn's own text blocks.
			name: "tool loop",
			body: `{"model":"m","max_tokens":256,
 "system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.1; cch=ab12;"},
           {"type":"text","text":"You are a coding agent.","cache_control":{"type":"ephemeral"}},
           {"type":"text","text":"Be terse."}],
 "tools":[{"name":"read_file","description":"Read a file",
           "input_schema":{"properties":{"path":{"type":"string"}},"required":["path"]},
           "cache_control":{"type":"ephemeral"}}],
 "messages":[
  {"role":"user","content":"Show me /etc/hostname"},
  {"role":"assistant","content":[
     {"type":"thinking","thinking":"I should read it.","signature":"sig"},
     {"type":"text","text":"Reading."},
     {"type":"tool_use","id":"toolu_01","name":"read_file","input":{"path":"/etc/hostname","é":true}}]},
  {"role":"user","content":[
     {"type":"text","text":"(note first)"},
     {"type":"tool_result","tool_use_id":"toolu_01","content":[{"type":"text","text":"box-1"},{"type":"text","text":"ok"}]},
     {"type":"text","text":"Now summarize.","cache_control":{"type":"ephemeral"}}]}]}`,
			messages: `[
 {"role":"system","content":"You are a coding agent.Be terse."},
 {"role":"user","content":"Show me /etc/hostname"},
 {"role":"assistant","reasoning":"I should read it.",
  "tool_calls":[{"id":"toolu_01","type":"function",
                 "function":{"name":"read_file","arguments":"{\"path\": \"/etc/hostname\", \"\\u00e9\": true}"}}],
  "content":"Reading."},
 {"role":"tool","tool_call_id":"toolu_01","content":"box-1\nok"},
 {"role":"user","content":[{"type":"text","text":"(note first)"},{"type":"text","text":"Now summarize."}]}]`,
			// AnthropicTool.validate_input_schema appends "type":"object" last.
			tools: `[{"type":"function","function":{"name":"read_file","description":"Read a file","parameters":{"properties":{"path":{"type":"string"}},"required":["path"],"type":"object"}}}]`,
		},
		{
			// A system of billing headers only emits no system message; an assistant turn of
			// redacted_thinking only stays as {"role":"assistant"}; an assistant tool_result is
			// "Tool result: " + str(content) (Python repr); tool_result images become a user
			// message, tool references a second tool message; a user turn of tool_results
			// only adds no user message; "description": null is kept.
			name: "edge cases",
			body: `{"model":"m","max_tokens":64,"stream":true,"stop_sequences":["</done>"],
 "system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.1;"}],
 "tool_choice":{"type":"tool","name":"bash"},
 "tools":[{"name":"bash","input_schema":{"type":"object","properties":{}}}],
 "messages":[
  {"role":"user","content":"go"},
  {"role":"assistant","content":[{"type":"redacted_thinking","data":"xx"}]},
  {"role":"assistant","content":[
     {"type":"tool_use","id":"t1","name":"bash","input":{"cmd":"ls"}},
     {"type":"tool_use","id":"t2","name":"bash","input":{}},
     {"type":"tool_result","tool_use_id":"zz","content":[{"type":"text","text":"it's \"x\"","cache_control":{"type":"ephemeral"}}]}]},
  {"role":"user","content":[
     {"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"a"},
        {"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}},
        {"type":"tool_reference","tool_name":"Read"}]},
     {"type":"tool_result","tool_use_id":"t2","content":"plain","is_error":true}]}]}`,
			messages: `[
 {"role":"user","content":"go"},
 {"role":"assistant"},
 {"role":"assistant",
  "tool_calls":[{"id":"t1","type":"function","function":{"name":"bash","arguments":"{\"cmd\": \"ls\"}"}},
                {"id":"t2","type":"function","function":{"name":"bash","arguments":"{}"}}],
  "content":"Tool result: [{'type': 'text', 'text': 'it\\'s \"x\"', 'cache_control': {'type': 'ephemeral'}}]"},
 {"role":"tool","tool_call_id":"t1","content":"a"},
 {"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]},
 {"role":"tool","tool_call_id":"t1","content":[{"type":"tool_reference","name":"Read"}]},
 {"role":"tool","tool_call_id":"t2","content":"plain"}]`,
			tools: `[{"type":"function","function":{"name":"bash","description":null,"parameters":{"type":"object","properties":{}}}}]`,
		},
		{
			// Inline system messages are hoisted into the leading system message, joined with
			// "" (_convert_system_message with merge_inline_system), billing header stripped.
			name:     "inline system merged",
			body:     `{"model":"m","max_tokens":8,"system":"Top.","messages":[{"role":"user","content":"Q"},{"role":"assistant","content":"A"},{"role":"system","content":"S"},{"role":"system","content":[{"type":"text","text":"x-anthropic-billing-header: a"},{"type":"text","text":"T"}]},{"role":"user","content":"Q2"}]}`,
			messages: `[{"role":"system","content":"Top.ST"},{"role":"user","content":"Q"},{"role":"assistant","content":"A"},{"role":"user","content":"Q2"}]`,
		},
		{
			// A string system is not billing-stripped; "" content is kept; one text block
			// collapses to a string; empty text blocks are dropped; thinking of "" still sets
			// reasoning; a URL image source is used as is.
			name:     "strings and collapse",
			body:     `{"model":"m","max_tokens":8,"system":"x-anthropic-billing-header: s","messages":[{"role":"user","content":""},{"role":"assistant","content":[{"type":"thinking","thinking":""},{"type":"text","text":""},{"type":"text","text":"only"}]},{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://x/y.png"}},{"type":"text","text":"see"}]}]}`,
			messages: `[{"role":"system","content":"x-anthropic-billing-header: s"},{"role":"user","content":""},{"role":"assistant","reasoning":"","content":"only"},{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}},{"type":"text","text":"see"}]}]`,
		},
		{
			// json.dumps: key order as given, ", " / ": ", ensure_ascii (surrogate pairs),
			// Python float repr; tools: [] stays an empty list; strict kept when set.
			name:     "tool_use arguments",
			body:     `{"model":"m","max_tokens":8,"tools":[],"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":{"z":1.0,"a":[1e16,0.00001,2.5,null,false],"s":"😀\u007f\n\"\\"}}]}]}`,
			messages: `[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{\"z\": 1.0, \"a\": [1e+16, 1e-05, 2.5, null, false], \"s\": \"\\ud83d\\ude00\\u007f\\n\\\"\\\\\"}"}}]}]`,
			tools:    `[]`,
		},
		{
			name:     "strict and defer_loading",
			body:     `{"model":"m","max_tokens":8,"tools":[{"name":"f","description":"d","input_schema":{"type":"object"},"strict":true,"defer_loading":false}],"messages":[{"role":"user","content":"x"}]}`,
			messages: `[{"role":"user","content":"x"}]`,
			tools:    `[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"},"strict":true,"defer_loading":false}}]`,
		},
		{
			// An assistant tool_result with string content; str() of dicts with True/None
			// and non-ASCII printed raw.
			name:     "assistant tool_result repr",
			body:     `{"model":"m","max_tokens":8,"messages":[{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"x","content":"plain"},{"type":"tool_result","tool_use_id":"y","content":[{"type":"text","text":"é\n","ok":true,"n":null}]}]}]}`,
			messages: `[{"role":"assistant","content":[{"type":"text","text":"Tool result: plain"},{"type":"text","text":"Tool result: [{'type': 'text', 'text': '\u00e9\\n', 'ok': True, 'n': None}]"}]}]`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, e := p.Parse(Messages, []byte(tc.body))
			if e != nil {
				t.Fatal(e)
			}
			if got, want := compact(t, string(r.ChatMessages())), compact(t, tc.messages); got != want {
				t.Errorf("messages\n got %s\nwant %s", got, want)
			}
			ti, err := r.TemplateInput()
			if err != nil {
				t.Fatal(err)
			}
			if !ti.AddGenerationPrompt || ti.ContinueFinalMessage {
				t.Error("a Messages request renders with add_generation_prompt and no continuation")
			}
			gotTools := ""
			if ti.Tools != nil {
				gotTools = compact(t, string(ti.Tools))
			}
			wantTools := ""
			if tc.tools != "" {
				wantTools = compact(t, tc.tools)
			}
			if gotTools != wantTools {
				t.Errorf("tools\n got %s\nwant %s", gotTools, wantTools)
			}
		})
	}
}

// With InlineSystemPreserve an inline system message stays where it is, as
// {"role": "system", "content": text} (billing header stripped, empty ones dropped), and the
// leading system message holds the top-level system only (serving.py, _convert_messages with
// merge_inline_system=False).
func TestMessagesInlineSystemPreserve(t *testing.T) {
	p := NewParser(DefaultIdentity())
	if err := p.SetInlineSystem(InlineSystemPreserve); err != nil {
		t.Fatal(err)
	}
	if err := p.SetInlineSystem("hoist"); err == nil {
		t.Error("an unknown mode is accepted")
	}
	body := `{"model":"m","max_tokens":8,"system":"Top.","messages":[{"role":"user","content":"Q"},{"role":"assistant","content":"A"},{"role":"system","content":"S"},{"role":"system","content":"x-anthropic-billing-header: z"},{"role":"user","content":"Q2"}]}`
	r, e := p.Parse(Messages, []byte(body))
	if e != nil {
		t.Fatal(e)
	}
	want := `[{"role":"system","content":"Top."},{"role":"user","content":"Q"},{"role":"assistant","content":"A"},{"role":"system","content":"S"},{"role":"user","content":"Q2"}]`
	if got := compact(t, string(r.ChatMessages())); got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
}

// output_config.effort becomes reasoning_effort on /v1/messages only (serving.py,
// _handle_output_config returns early for count_tokens); add_special_tokens stays false.
func TestMessagesEffortAndDefaults(t *testing.T) {
	p := NewParser(DefaultIdentity())
	body := `{"model":"m","max_tokens":8,"output_config":{"effort":"high"},"add_special_tokens":true,"chat_template_kwargs":{"enable_thinking":false},"messages":[{"role":"user","content":"x"}]}`
	for _, tc := range []struct {
		ep   Endpoint
		want string
	}{{Messages, "high"}, {MessagesCountTokens, ""}} {
		r, e := p.Parse(tc.ep, []byte(body))
		if e != nil {
			t.Fatal(e)
		}
		ti, _ := r.TemplateInput()
		if ti.ReasoningEffort != tc.want || r.AddSpecialTokens {
			t.Errorf("%s: effort %q add_special_tokens %v", tc.ep, ti.ReasoningEffort, r.AddSpecialTokens)
		}
		if string(ti.ChatTemplateKwargs) != `{"enable_thinking": false}` {
			t.Errorf("%s: kwargs %s", tc.ep, ti.ChatTemplateKwargs)
		}
	}
}

// Bodies vLLM's pydantic models reject are 400s.
func TestMessagesValidation(t *testing.T) {
	p := NewParser(DefaultIdentity())
	cases := []struct {
		name, body, want string
		ep               Endpoint
	}{
		{"no max_tokens", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "max_tokens", Messages},
		{"zero max_tokens", `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, "max_tokens", Messages},
		{"no messages", `{"model":"m","max_tokens":1}`, "messages", Messages},
		{"bad role", `{"model":"m","max_tokens":1,"messages":[{"role":"tool","content":"x"}]}`, "role", Messages},
		{"unknown block", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`, "type", Messages},
		{"content number", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":5}]}`, "content", Messages},
		{"no model", `{"messages":[{"role":"user","content":"x"}]}`, "model", MessagesCountTokens},
		{"bad tool_choice", `{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"sometimes"}}`, "tool_choice", MessagesCountTokens},
		{"tool without schema", `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"name":"f"}]}`, "input_schema", MessagesCountTokens},
		{"wrong type", `{"model":"m","max_tokens":"8","messages":[{"role":"user","content":"x"}]}`, "max_tokens", Messages},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, e := p.Parse(tc.ep, []byte(tc.body))
			if e == nil || e.Status != http.StatusBadRequest || !strings.Contains(e.Message, tc.want) {
				t.Fatalf("got %v, want a 400 naming %s", e, tc.want)
			}
		})
	}
	// count_tokens needs no max_tokens.
	if _, e := p.Parse(MessagesCountTokens, []byte(`{"model":"m","messages":[{"role":"user","content":"x"}]}`)); e != nil {
		t.Fatal(e)
	}
}

// Parse and the Messages conversion never panic, and refuse only with a 400.
func FuzzParseMessages(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","max_tokens":4,"system":[{"type":"text","text":"a"},5,null],"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","max_tokens":4,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":{"k":[1.5,"é",null]}},{"type":"tool_result","content":[{"type":"text","text":"it's"},3]}]}]}`,
		`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":5},{"type":"tool_reference","name":"R"}]},{"type":"image","source":{"type":"url"}}]}]}`,
		`{"model":"m","max_tokens":4,"tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"tool","name":"f"},"messages":[{"role":"system","content":[{"type":"text"}]},{"role":"user","content":""}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"thinking","thinking":5}]}]}`,
		`{`, `[]`, `{"messages":5}`,
	} {
		f.Add(s, true)
		f.Add(s, false)
	}
	p := NewParser(DefaultIdentity())
	f.Fuzz(func(t *testing.T, body string, messages bool) {
		ep := MessagesCountTokens
		if messages {
			ep = Messages
		}
		r, e := p.Parse(ep, []byte(body))
		if e != nil {
			if e.Status != http.StatusBadRequest || e.Message == "" {
				t.Fatalf("bad error %+v", e)
			}
			return
		}
		ti, err := r.TemplateInput()
		if err != nil {
			t.Fatal(err)
		}
		if !json.Valid(ti.Messages) || (ti.Tools != nil && !json.Valid(ti.Tools)) {
			t.Fatalf("invalid converted JSON %s %s", ti.Messages, ti.Tools)
		}
	})
}

// messages: [] and an empty block list are refused as Anthropic refuses them
// (https://docs.claude.com/en/api/errors, invalid_request_error), on /v1/messages and on
// count_tokens alike; only a final assistant message (a prefill) may have an empty list.
func TestMessagesEmptyRefused(t *testing.T) {
	p := NewParser(DefaultIdentity())
	cases := []struct {
		name, messages, want string // want "" = accepted
	}{
		{"no messages", `[]`, "messages: at least one message is required"},
		{"empty user content", `[{"role":"user","content":[]}]`, "messages.0: all messages must have non-empty content except for the optional final assistant message"},
		{"empty middle assistant", `[{"role":"user","content":"a"},{"role":"assistant","content":[]},{"role":"user","content":"b"}]`, "messages.1: all messages must have non-empty content"},
		{"empty last user", `[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":[]}]`, "messages.2: all messages must have non-empty content"},
		{"empty final assistant", `[{"role":"user","content":"a"},{"role":"assistant","content":[]}]`, ""},
	}
	for _, ep := range []Endpoint{Messages, MessagesCountTokens} {
		for _, tc := range cases {
			t.Run(string(ep)+"/"+tc.name, func(t *testing.T) {
				body := `{"model":"m","max_tokens":4,"messages":` + tc.messages + `}`
				if ep == MessagesCountTokens {
					body = `{"model":"m","messages":` + tc.messages + `}`
				}
				_, e := p.Parse(ep, []byte(body))
				if tc.want == "" {
					if e != nil {
						t.Fatalf("refused: %v", e)
					}
					return
				}
				if e == nil || e.Status != http.StatusBadRequest || !strings.HasPrefix(e.Message, tc.want) || e.Param != "messages" {
					t.Fatalf("got %+v, want a 400 %q", e, tc.want)
				}
			})
		}
	}
}
