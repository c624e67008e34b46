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
	"text":                 {kind: kObject, goType: "ResponseTextConfig"},
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

// ResponsesHistory is a stored response a follow-up continues (previous_response_id), as the
// worker that produced it keeps it (responses/serving.py: msg_store and response_store): the
// chat messages its prompt was built from, and its output items.
type ResponsesHistory struct {
	Messages []jinja.Value
	Output   []jinja.Value
}

// ResponsesConversation is what vLLM's Responses entrypoint hands the chat template for one
// body (non-Harmony models): responses/serving.py _make_request, which calls
// responses/utils.py construct_input_messages and construct_tool_dicts, and
// ResponsesRequest.build_chat_params for the generation flags.
type ResponsesConversation struct {
	// Messages are the chat messages, before vLLM's message preprocessing (rendering applies it).
	Messages []jinja.Value
	// Tools are the tool dicts (None: no tools; an empty list when no tool is a function).
	Tools jinja.Value
	// ContinueFinal is should_continue_final_message; add_generation_prompt is its negation.
	ContinueFinal bool
	// ReasoningEffort is reasoning.effort ("" when absent); Kwargs is chat_template_kwargs.
	ReasoningEffort string
	Kwargs          jinja.Value
}

// Template returns the chat template input that renders c.
func (c *ResponsesConversation) Template() *chat.Request {
	return chat.NewValueRequest(chat.ValueRequest{Messages: jinja.NewList(c.Messages), Tools: c.Tools, ToolsAsIs: true,
		AddGenerationPrompt: !c.ContinueFinal, ContinueFinalMessage: c.ContinueFinal,
		ReasoningEffort: c.ReasoningEffort, Kwargs: c.Kwargs})
}

// ResponsesConversation maps a Responses request into the conversation its worker renders.
// prev is the stored response a previous_response_id follow-up continues; without it such a
// follow-up is ErrStatefulPrompt (only that worker holds the history). The gateway (its
// routing and `kvgate tokenize`) and the simulator both call this, so they cannot drift.
func (r *Request) ResponsesConversation(prev *ResponsesHistory) (*ResponsesConversation, error) {
	if r.Endpoint != Responses {
		return nil, fmt.Errorf("%s is not a Responses request", r.Endpoint)
	}
	if prev == nil && r.PreviousResponseID != "" {
		return nil, ErrStatefulPrompt
	}
	return responsesConversation(r.doc, prev)
}

func responsesConversation(d *chat.Document, prev *ResponsesHistory) (*ResponsesConversation, error) {
	msgs, err := responsesMessages(d, prev)
	if err != nil {
		return nil, err
	}
	tools, err := responsesTools(d)
	if err != nil {
		return nil, err
	}
	in, _ := d.Get("input")
	c := &ResponsesConversation{Messages: msgs, Tools: tools, ContinueFinal: continueFinal(in), Kwargs: jinja.None()}
	if kw, ok := d.Get("chat_template_kwargs"); ok && !kw.IsNone() {
		c.Kwargs = kw
	}
	if e, ok := d.Path("reasoning.effort"); ok && e.IsString() {
		c.ReasoningEffort = e.AsString()
	}
	return c, nil
}

// responsesTemplate is the gateway's template input for a Responses body.
func responsesTemplate(r *Request) (*chat.Request, error) {
	c, err := r.ResponsesConversation(nil)
	if err != nil {
		return nil, err
	}
	return c.Template(), nil
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
