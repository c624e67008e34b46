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
	m, err := responsesMessages(r.doc, nil)
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
		{name: "empty encrypted content is not",
			body: `{"input":[{"type":"reasoning","summary":[],"encrypted_content":""}]}`,
			msgs: `[{"role":"assistant","reasoning":""}]`, tools: `null`},
		{name: "function tools as ChatCompletionToolsParam dumps: name, description, parameters, then strict; None kept",
			body:  `{"input":"q","tools":[{"type":"function","name":"get_weather","description":"Get weather","parameters":{"type":"object"}}]}`,
			msgs:  `[{"role":"user","content":"q"}]`,
			tools: `[{"type":"function","function":{"name":"get_weather","description":"Get weather","parameters":{"type":"object"},"strict":null}}]`},
		{name: "a function tool's extra fields follow strict in the client's order",
			body:  `{"input":"q","tools":[{"strict":true,"defer_loading":false,"name":"f","type":"function"}]}`,
			msgs:  `[{"role":"user","content":"q"}]`,
			tools: `[{"type":"function","function":{"name":"f","description":null,"parameters":null,"strict":true,"defer_loading":false}}]`},
		{name: "tool_choice none still renders the tools (exclude_tools_when_tool_choice_none is off)",
			body:  `{"input":"q","tool_choice":"none","tools":[{"type":"function","name":"f"}]}`,
			msgs:  `[{"role":"user","content":"q"}]`,
			tools: `[{"type":"function","function":{"name":"f","description":null,"parameters":null,"strict":null}}]`},
		{name: "namespace members are flattened to namespace__name; its non-function members are not rendered",
			body:  `{"input":"q","tools":[{"type":"namespace","name":"mcp_fs","description":"Files","tools":[{"type":"function","name":"read","parameters":{"type":"object"}},{"type":"custom","name":"patch"}]},{"type":"function","name":"shell"}]}`,
			msgs:  `[{"role":"user","content":"q"}]`,
			tools: `[{"type":"function","function":{"name":"mcp_fs__read","description":null,"parameters":{"type":"object"},"strict":null}},{"type":"function","function":{"name":"shell","description":null,"parameters":null,"strict":null}}]`},
		{name: "built-in tools (web_search, mcp, file_search, code_interpreter, custom, local_shell) are accepted and not rendered",
			body:  `{"input":"q","tools":[{"type":"web_search"},{"type":"mcp","server_label":"x","server_url":"http://x"},{"type":"file_search","vector_store_ids":[]},{"type":"code_interpreter","container":"auto"},{"type":"custom","name":"apply_patch"},{"type":"local_shell"}]}`,
			msgs:  `[{"role":"user","content":"q"}]`,
			tools: `[]`},
		{name: "an unknown tool type is refused as the SDK's Tool union does",
			body: `{"input":"q","tools":[{"type":"browser"}]}`, err: "tools[0].type: Input should be 'function'"},
		{name: "a function tool without a name is refused",
			body: `{"input":"q","tools":[{"type":"function"}]}`, err: "tools[0].name"},
		{name: "a named tool_choice may name a namespace member by its flat or its own name",
			body:  `{"input":"q","tool_choice":{"type":"function","name":"read"},"tools":[{"type":"namespace","name":"fs","description":"","tools":[{"type":"function","name":"read"}]}]}`,
			msgs:  `[{"role":"user","content":"q"}]`,
			tools: `[{"type":"function","function":{"name":"fs__read","description":null,"parameters":null,"strict":null}}]`},
		{name: "a namespaced function_call is flattened; a custom_tool_call wraps its input; outputs become tool messages",
			body: `{"input":[{"type":"function_call","call_id":"c1","namespace":"fs","name":"read","arguments":"{}"},{"type":"custom_tool_call","call_id":"c2","name":"apply_patch","input":"*** Begin"},{"type":"function_call_output","call_id":"c1","output":"x"},{"type":"custom_tool_call_output","call_id":"c2","output":"done"}]}`,
			msgs: `[{"role":"assistant","tool_calls":[{"id":"c1","function":{"name":"fs__read","arguments":"{}"},"type":"function"},{"id":"c2","function":{"name":"apply_patch","arguments":"{\"input\": \"*** Begin\"}"},"type":"function"}]},{"role":"tool","content":"x","tool_call_id":"c1"},{"role":"tool","content":"done","tool_call_id":"c2"}]`, tools: `null`},
		{name: "a string-content assistant message merges into a previous assistant without content",
			body: `{"input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"R"}]},{"role":"assistant","content":"A","id":"msg_1"}]}`,
			msgs: `[{"role":"assistant","reasoning":"R","content":"A"}]`, tools: `null`},
		{name: "an item_reference left unresolved names the item and the store:false workaround",
			body: `{"input":[{"role":"user","content":"q"},{"type":"item_reference","id":"msg_9"}]}`, err: `input[1]: item_reference "msg_9" cannot be resolved`},
		{name: "an item of another type is refused with vLLM's message",
			body: `{"input":[{"type":"web_search_call","id":"ws_1"}]}`, err: "Unsupported input item type: web_search_call"},
		{name: "text.format is read (it constrains decoding; the prompt does not change)",
			body: `{"input":"q","text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"}}}}`,
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

// TestResponsesConversationHistory: a previous_response_id follow-up rendered with the stored
// response (as its worker does, construct_input_messages with prev_msg and
// prev_response_output): the old system message is dropped, each text part of each output
// message is one assistant message, reasoning and function_call outputs are skipped; without
// the stored response the prompt is ErrStatefulPrompt.
func TestResponsesConversationHistory(t *testing.T) {
	r, e := NewParser(IdentityConfig{}).Parse(Responses, []byte(`{"instructions":"New.","previous_response_id":"resp_1","input":"And tomorrow?"}`))
	if e != nil {
		t.Fatal(e)
	}
	if _, err := r.ResponsesConversation(nil); !errors.Is(err, ErrStatefulPrompt) {
		t.Fatalf("without history: %v, want ErrStatefulPrompt", err)
	}
	stored, err := chat.ParseDocument([]byte(`{"history":[{"role":"system","content":"Old."},{"role":"user","content":"Weather?"}],
		"output":[{"type":"reasoning","id":"rs_1","summary":[]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},
		{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"It is 18C."},{"type":"output_text","text":"Sunny."}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := stored.Get("history")
	o, _ := stored.Get("output")
	c, err := r.ResponsesConversation(&ResponsesHistory{Messages: m.AsList().Items, Output: o.AsList().Items})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := chat.ValueJSON(jinja.NewList(c.Messages))
	want := `[{"role":"system","content":"New."},{"role":"user","content":"Weather?"},{"role":"assistant","content":"It is 18C."},{"role":"assistant","content":"Sunny."},{"role":"user","content":"And tomorrow?"}]`
	if got != want {
		t.Errorf("messages\n got %s\nwant %s", got, want)
	}
}
