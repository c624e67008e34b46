package apireq

import (
	"errors"
	"fmt"

	"github.com/ardanlabs/jinja"

	"github.com/kvgate/kvgate/tokenize/chat"
)

// Responses is OpenAI's Responses API (vLLM's vllm/entrypoints/openai/responses/).
const Responses Endpoint = "/v1/responses"

// ErrStatefulPrompt is TemplateInput's error for a Responses request that continues a stored
// response (previous_response_id): its prompt starts with turns only the worker that produced
// that response holds, so the gateway cannot render it. Such a request is routed by its pin.
var ErrStatefulPrompt = errors.New("the prompt continues a response stored on its worker (previous_response_id)")

// responsesSchema are the Responses body fields whose types the gateway checks (vLLM's
// ResponsesRequest, vllm/entrypoints/openai/responses/protocol.py).
var responsesSchema = newSchema(map[string]rule{
	"input":                {kind: kAny},
	"instructions":         str,
	"previous_response_id": str,
	"max_output_tokens":    integer,
	"tools":                {kind: kArray, goType: "[]openai.Tool"},
	"tool_choice":          {kind: kAny},
	"reasoning":            {kind: kObject, goType: "openai.Reasoning"},
	"chat_template_kwargs": object,
	"request_id":           str,
	"background":           boolean,
	"parallel_tool_calls":  boolean,
})

// fillResponses reads the Responses fields: input is required (a string or a list of items);
// store defaults to true, as ResponsesRequest.store does.
func (r *Request) fillResponses() *Error {
	d := r.doc
	v, ok := d.Get("input")
	switch {
	case !ok || v.IsNone():
		return badRequest("input", "input: Field required")
	case v.IsString(), v.IsList():
	default:
		return badRequest("input", "input: must be a string or an array of input items")
	}
	if p, ok := d.Get("previous_response_id"); ok && p.IsString() {
		r.PreviousResponseID = p.AsString()
	}
	r.Store = true
	if s, ok := d.Get("store"); ok && s.IsBool() {
		r.Store = s.AsBool()
	}
	// Responses tokenizes with TokenizeParams' default add_special_tokens=True
	// (responses/protocol.py, ResponsesRequest.build_tok_params): a template that emits BOS
	// gets a second one from the tokenizer, as on the worker.
	r.AddSpecialTokens = true
	return nil
}

// responsesTemplate maps a Responses body into the chat template input vLLM's Responses
// entrypoint renders (non-Harmony models): responses/serving.py, _make_request, which calls
// responses/utils.py construct_input_messages and construct_tool_dicts, and
// ResponsesRequest.build_chat_params for the generation flags.
func responsesTemplate(d *chat.Document) (*chat.Request, error) {
	if p, ok := d.Get("previous_response_id"); ok && p.IsString() && p.AsString() != "" {
		return nil, ErrStatefulPrompt
	}
	msgs, err := responsesMessages(d)
	if err != nil {
		return nil, err
	}
	tools, err := responsesTools(d)
	if err != nil {
		return nil, err
	}
	in, _ := d.Get("input")
	cont := continueFinal(in)
	vr := chat.ValueRequest{Messages: jinja.NewList(msgs), Tools: tools, ToolsAsIs: true,
		AddGenerationPrompt: !cont, ContinueFinalMessage: cont}
	if kw, ok := d.Get("chat_template_kwargs"); ok && !kw.IsNone() {
		vr.Kwargs = kw
	}
	if e, ok := d.Path("reasoning.effort"); ok && e.IsString() {
		vr.ReasoningEffort = e.AsString()
	}
	return chat.NewValueRequest(vr), nil
}

func reqErr(param, format string, args ...any) error {
	return &chat.RequestError{Message: fmt.Sprintf(format, args...), Param: param}
}

func str1(d *jinja.Dict, key string) (jinja.Value, bool) {
	v, ok := d.Get(key)
	if !ok || v.IsNone() {
		return jinja.None(), false
	}
	return v, true
}

func dict(kv ...any) jinja.Value {
	v := jinja.NewDict()
	for i := 0; i+1 < len(kv); i += 2 {
		v.AsDict().Set(kv[i].(string), kv[i+1].(jinja.Value))
	}
	return v
}

// copyDict is a shallow copy (a merge never modifies the client's parsed item).
func copyDict(v jinja.Value) jinja.Value {
	out := jinja.NewDict()
	src := v.AsDict()
	for _, k := range src.Keys {
		out.AsDict().Set(k, src.Data[k])
	}
	return out
}

func isRole(v jinja.Value, role string) bool {
	if !v.IsDict() {
		return false
	}
	r, ok := v.AsDict().Get("role")
	return ok && r.IsString() && r.AsString() == role
}

// responsesMessages is construct_input_messages (responses/utils.py) without a previous
// response: instructions, then the input.
func responsesMessages(d *chat.Document) ([]jinja.Value, error) {
	var msgs []jinja.Value
	// 1. Truthy instructions become the leading system message.
	if ins, ok := d.Get("instructions"); ok && ins.IsString() && ins.AsString() != "" {
		msgs = append(msgs, dict("role", jinja.NewString("system"), "content", ins))
	}
	in, _ := d.Get("input")
	// 2. A string input is one user message.
	if in.IsString() {
		return append(msgs, dict("role", jinja.NewString("user"), "content", in)), nil
	}
	// 3. A list goes item by item (construct_chat_messages_with_tool_call).
	lastAssistant := func() (int, bool) {
		if n := len(msgs); n > 0 && isRole(msgs[n-1], "assistant") {
			return n - 1, true
		}
		return 0, false
	}
	for i, it := range in.AsList().Items {
		param := fmt.Sprintf("input[%d]", i)
		if !it.IsDict() {
			return nil, reqErr(param, "each input item must be an object")
		}
		item := it.AsDict()
		typ := ""
		if t, ok := item.Get("type"); ok && t.IsString() {
			typ = t.AsString()
		}
		role, _ := item.Get("role")
		switch {
		case typ == "function_call":
			// ResponseFunctionToolCall → a tool call with call_id as its id and the arguments
			// string verbatim, merged into a previous assistant message.
			callID, _ := str1(item, "call_id")
			name, _ := str1(item, "name")
			args, _ := str1(item, "arguments")
			tc := dict("id", callID, "function", dict("name", name, "arguments", args), "type", jinja.NewString("function"))
			if j, ok := lastAssistant(); ok {
				m := copyDict(msgs[j])
				calls := []jinja.Value{}
				if old, ok := str1(m.AsDict(), "tool_calls"); ok && old.IsList() {
					calls = append(calls, old.AsList().Items...)
				}
				m.AsDict().Set("tool_calls", jinja.NewList(append(calls, tc)))
				msgs[j] = m
				continue
			}
			msgs = append(msgs, dict("role", jinja.NewString("assistant"), "tool_calls", jinja.NewList([]jinja.Value{tc})))
		case typ == "function_call_output":
			out, _ := item.Get("output")
			callID, _ := item.Get("call_id")
			msgs = append(msgs, dict("role", jinja.NewString("tool"), "content", out, "tool_call_id", callID))
		case typ == "reasoning":
			// ResponseReasoningItem: content[0].text, else summary[0].text; encrypted content
			// is refused ("Encrypted content is not supported.").
			if _, ok := str1(item, "encrypted_content"); ok {
				return nil, reqErr(param+".encrypted_content", "Encrypted content is not supported.")
			}
			text := firstText(item, "content")
			if text.IsNone() {
				text = firstText(item, "summary")
			}
			if text.IsNone() {
				text = jinja.NewString("")
			}
			if j, ok := lastAssistant(); ok {
				if _, has := str1(msgs[j].AsDict(), "reasoning"); !has {
					m := copyDict(msgs[j])
					m.AsDict().Set("reasoning", text)
					msgs[j] = m
					continue
				}
			}
			msgs = append(msgs, dict("role", jinja.NewString("assistant"), "reasoning", text))
		case typ == "message" && isRole(it, "assistant") && isList(item, "content"):
			// ResponseOutputMessage: only content[0].text, merged into a previous assistant
			// message that has no content.
			text := firstText(item, "content")
			if text.IsNone() {
				text = jinja.NewString("")
			}
			if j, ok := lastAssistant(); ok {
				if _, has := str1(msgs[j].AsDict(), "content"); !has {
					m := copyDict(msgs[j])
					m.AsDict().Set("content", text)
					msgs[j] = m
					continue
				}
			}
			msgs = append(msgs, dict("role", jinja.NewString("assistant"), "content", text))
		default:
			// Any other dict (user, system, developer messages, string-content assistant
			// messages) is a chat message as it stands.
			if !role.IsString() {
				return nil, reqErr(param, "input item of type %q is not supported by the gateway's mapping", typ)
			}
			msgs = append(msgs, it)
		}
	}
	return msgs, nil
}

func isList(d *jinja.Dict, key string) bool {
	v, ok := d.Get(key)
	return ok && v.IsList()
}

// firstText is item[key][0].text (None when there is none).
func firstText(d *jinja.Dict, key string) jinja.Value {
	v, ok := d.Get(key)
	if !ok || !v.IsList() || len(v.AsList().Items) == 0 {
		return jinja.None()
	}
	p := v.AsList().Items[0]
	if !p.IsDict() {
		return jinja.None()
	}
	t, ok := p.AsDict().Get("text")
	if !ok || !t.IsString() {
		return jinja.None()
	}
	return t
}

// continueFinal is should_continue_final_message (responses/utils.py): the last input item is
// an assistant message or a reasoning item whose status is in_progress or incomplete.
func continueFinal(in jinja.Value) bool {
	if !in.IsList() || len(in.AsList().Items) == 0 {
		return false
	}
	last := in.AsList().Items[len(in.AsList().Items)-1]
	if !last.IsDict() {
		return false
	}
	d := last.AsDict()
	t, _ := d.Get("type")
	isReasoning := t.IsString() && t.AsString() == "reasoning"
	if !isReasoning && !isRole(last, "assistant") {
		return false
	}
	s, ok := d.Get("status")
	return ok && s.IsString() && (s.AsString() == "in_progress" || s.AsString() == "incomplete")
}

// responsesTools is construct_tool_dicts (responses/utils.py) with check_tool_usage's
// refusals: no tools, or tool_choice "none", renders no tools at all; each tool is
// {"type": "function", "function": tool.model_dump()}, a function tool dumped in the OpenAI
// SDK's FunctionTool field order (name, parameters, strict, type, description) with None kept.
func responsesTools(d *chat.Document) (jinja.Value, error) {
	tv, _ := d.Get("tools")
	choice, _ := d.Get("tool_choice")
	hasTools := tv.IsList() && len(tv.AsList().Items) > 0
	if !hasTools {
		named := choice.IsDict()
		if named || (choice.IsString() && choice.AsString() == "required") {
			return jinja.None(), reqErr("tool_choice", "tool_choice requires tools to be provided")
		}
		return jinja.None(), nil
	}
	if choice.IsString() && choice.AsString() == "none" {
		return jinja.None(), nil
	}
	items := tv.AsList().Items
	out := make([]jinja.Value, 0, len(items))
	names := map[string]bool{}
	for i, t := range items {
		if !t.IsDict() {
			return jinja.None(), reqErr(fmt.Sprintf("tools[%d]", i), "each tool must be an object")
		}
		td := t.AsDict()
		fn := t
		if typ, ok := td.Get("type"); ok && typ.IsString() && typ.AsString() == "function" {
			name, _ := str1(td, "name")
			if !name.IsString() {
				return jinja.None(), reqErr(fmt.Sprintf("tools[%d].name", i), "function tool 'name' must be a string")
			}
			names[name.AsString()] = true
			params, _ := str1(td, "parameters")
			strict, _ := str1(td, "strict")
			desc, _ := str1(td, "description")
			fn = dict("name", name, "parameters", params, "strict", strict, "type", jinja.NewString("function"), "description", desc)
		}
		out = append(out, dict("type", jinja.NewString("function"), "function", fn))
	}
	if choice.IsDict() {
		if n, ok := choice.AsDict().Get("name"); ok && n.IsString() && !names[n.AsString()] {
			return jinja.None(), reqErr("tool_choice", "tool_choice names %q, which is not in tools", n.AsString())
		}
	}
	return jinja.NewList(out), nil
}
