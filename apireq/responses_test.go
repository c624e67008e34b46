package apireq

import (
	"errors"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"

	"github.com/kvgate/kvgate/tokenize/chat"
)

// responsesMapped parses a Responses body and returns the mapped messages and tools as JSON.
func responsesMapped(t *testing.T, body string) (msgs, tools string, err error) {
	t.Helper()
	r, e := NewParser(IdentityConfig{}).Parse(Responses, []byte(body))
	if e != nil {
		return "", "", e
	}
	m, err := responsesMessages(r.doc)
	if err != nil {
		return "", "", err
	}
	tv, err := responsesTools(r.doc)
	if err != nil {
		return "", "", err
	}
	msgs, _ = chat.ValueJSON(jinja.NewList(m))
	tools, _ = chat.ValueJSON(tv)
	return msgs, tools, nil
}

// TestResponsesMessages checks each rule of vLLM's construct_input_messages and
// construct_chat_messages_with_tool_call (vllm/entrypoints/openai/responses/utils.py) and
// construct_tool_dicts for tools.
func TestResponsesMessages(t *testing.T) {
	cases := []struct {
		name, body, msgs, tools, err string
	}{
		{name: "string input is one user message",
			body: `{"input":"hi"}`,
			msgs: `[{"role":"user","content":"hi"}]`, tools: `null`},
		{name: "truthy instructions lead as system",
			body: `{"instructions":"Be brief.","input":"hi"}`,
			msgs: `[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}]`, tools: `null`},
		{name: "empty instructions are dropped",
			body: `{"instructions":"","input":"hi"}`,
			msgs: `[{"role":"user","content":"hi"}]`, tools: `null`},
		{name: "message dicts pass through unchanged, type key included",
			body: `{"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"Q"}]},{"role":"developer","content":"D"}]}`,
			msgs: `[{"type":"message","role":"user","content":[{"type":"input_text","text":"Q"}]},{"role":"developer","content":"D"}]`, tools: `null`},
		{name: "reasoning then function_call merge into one assistant message (call_id as id)",
			body: `{"instructions":"You are a weather bot.","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"Weather in Paris?"}]},{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"Need the tool."}]},{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},{"type":"function_call_output","call_id":"call_1","output":"{\"temp_c\":18}"}]}`,
			msgs: `[{"role":"system","content":"You are a weather bot."},{"type":"message","role":"user","content":[{"type":"input_text","text":"Weather in Paris?"}]},{"role":"assistant","reasoning":"Need the tool.","tool_calls":[{"id":"call_1","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"},"type":"function"}]},{"role":"tool","content":"{\"temp_c\":18}","tool_call_id":"call_1"}]`, tools: `null`},
		{name: "parallel function calls append to the same assistant message",
			body: `{"input":[{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},{"type":"function_call","call_id":"b","name":"g","arguments":"{}"}]}`,
			msgs: `[{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"},"type":"function"},{"id":"b","function":{"name":"g","arguments":"{}"},"type":"function"}]}]`, tools: `null`},
		{name: "reasoning falls back to summary[0].text",
			body: `{"input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"S"}]}]}`,
			msgs: `[{"role":"assistant","reasoning":"S"}]`, tools: `null`},
		{name: "output message takes content[0].text and merges into an assistant without content",
			body: `{"input":[{"type":"reasoning","content":[{"type":"reasoning_text","text":"R"}]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"A1"},{"type":"output_text","text":"A2"}]}]}`,
			msgs: `[{"role":"assistant","reasoning":"R","content":"A1"}]`, tools: `null`},
		{name: "output message after an assistant with content is its own message",
			body: `{"input":[{"role":"assistant","content":"x"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"y"}]}]}`,
			msgs: `[{"role":"assistant","content":"x"},{"role":"assistant","content":"y"}]`, tools: `null`},
		{name: "encrypted reasoning is refused",
			body: `{"input":[{"type":"reasoning","summary":[],"encrypted_content":"zz"}]}`,
			err:  "Encrypted content is not supported."},
		{name: "function tools in FunctionTool dump order, None kept",
			body:  `{"input":"q","tools":[{"type":"function","name":"get_weather","description":"Get weather","parameters":{"type":"object"}}]}`,
			msgs:  `[{"role":"user","content":"q"}]`,
			tools: `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"},"strict":null,"type":"function","description":"Get weather"}}]`},
		{name: "tool_choice none renders no tools",
			body: `{"input":"q","tool_choice":"none","tools":[{"type":"function","name":"f"}]}`,
			msgs: `[{"role":"user","content":"q"}]`, tools: `null`},
		{name: "tool_choice required without tools is refused",
			body: `{"input":"q","tool_choice":"required"}`, err: "requires tools"},
		{name: "named tool_choice not in tools is refused",
			body: `{"input":"q","tool_choice":{"type":"function","name":"g"},"tools":[{"type":"function","name":"f"}]}`, err: "not in tools"},
		{name: "missing input is refused",
			body: `{"model":"m"}`, err: "input"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			msgs, tools, err := responsesMapped(t, tc.body)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if msgs != tc.msgs {
				t.Errorf("messages:\n got %s\nwant %s", msgs, tc.msgs)
			}
			if tools != tc.tools {
				t.Errorf("tools:\n got %s\nwant %s", tools, tc.tools)
			}
		})
	}
}

// TestResponsesRequestFlags checks the request-level rules: should_continue_final_message
// (responses/utils.py), store's default (ResponsesRequest.store = True), add_special_tokens
// (TokenizeParams' default True, ResponsesRequest.build_tok_params) and that a follow-up with
// previous_response_id has no gateway-renderable prompt.
func TestResponsesRequestFlags(t *testing.T) {
	cases := []struct {
		name                string
		body                string
		cont, store         bool
		prev                string
		stateful            bool
		effort, kwargsInput string
	}{
		{name: "defaults", body: `{"input":"q"}`, store: true},
		{name: "store false", body: `{"input":"q","store":false}`},
		{name: "in_progress assistant continues", body: `{"input":[{"role":"user","content":"q"},{"type":"message","role":"assistant","status":"in_progress","content":[{"type":"output_text","text":"par"}]}]}`, cont: true, store: true},
		{name: "completed assistant does not continue", body: `{"input":[{"type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"x"}]}]}`, store: true},
		{name: "incomplete reasoning continues", body: `{"input":[{"type":"reasoning","status":"incomplete","summary":[]}]}`, cont: true, store: true},
		{name: "reasoning effort", body: `{"input":"q","reasoning":{"effort":"low"}}`, store: true, effort: "low"},
		{name: "previous_response_id", body: `{"input":"q","previous_response_id":"resp_1"}`, store: true, prev: "resp_1", stateful: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, e := NewParser(IdentityConfig{}).Parse(Responses, []byte(tc.body))
			if e != nil {
				t.Fatal(e)
			}
			if !r.AddSpecialTokens {
				t.Error("AddSpecialTokens = false, want true")
			}
			if r.Store != tc.store || r.PreviousResponseID != tc.prev {
				t.Errorf("store %v prev %q, want %v %q", r.Store, r.PreviousResponseID, tc.store, tc.prev)
			}
			ti, err := r.TemplateInput()
			if tc.stateful {
				if !errors.Is(err, ErrStatefulPrompt) {
					t.Fatalf("err = %v, want ErrStatefulPrompt", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ti.ContinueFinalMessage != tc.cont || ti.AddGenerationPrompt == tc.cont {
				t.Errorf("continue %v add_generation_prompt %v, want continue %v", ti.ContinueFinalMessage, ti.AddGenerationPrompt, tc.cont)
			}
			if ti.ReasoningEffort != tc.effort {
				t.Errorf("effort %q, want %q", ti.ReasoningEffort, tc.effort)
			}
		})
	}
}
