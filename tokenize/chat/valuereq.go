package chat

import (
	"strings"

	"github.com/ardanlabs/jinja"
)

// ValueRequest is a template input built by a request mapping (an API whose body is not a chat
// body, such as OpenAI Responses) as template values rather than raw JSON.
type ValueRequest struct {
	// Messages is the list of chat messages the mapping built (before vLLM's message
	// preprocessing, which rendering applies).
	Messages jinja.Value
	// Tools is the tool list handed to the template (None: no tools). With ToolsAsIs the dicts
	// reach the template exactly as given; otherwise they are dumped as chat tools are.
	Tools     jinja.Value
	ToolsAsIs bool
	// Kwargs is chat_template_kwargs (None: absent).
	Kwargs jinja.Value
	// AddGenerationPrompt, ContinueFinalMessage and ReasoningEffort are as in Request.
	AddGenerationPrompt  bool
	ContinueFinalMessage bool
	ReasoningEffort      string
}

// NewValueRequest returns the Request that renders v.
func NewValueRequest(v ValueRequest) *Request {
	none := func(x jinja.Value) jinja.Value {
		if x.IsUndefined() {
			return jinja.None()
		}
		return x
	}
	return &Request{
		AddGenerationPrompt:  v.AddGenerationPrompt,
		ContinueFinalMessage: v.ContinueFinalMessage,
		ReasoningEffort:      v.ReasoningEffort,
		pre: &decodedFields{messages: none(v.Messages), tools: none(v.Tools), documents: jinja.None(),
			kwargs: none(v.Kwargs), toolsAsIs: v.ToolsAsIs},
	}
}

// ValueJSON encodes a template value as compact JSON in insertion order (for tests and debug
// output of mapped requests).
func ValueJSON(v jinja.Value) (string, error) {
	var b strings.Builder
	err := pyJSON(&b, v, &jsonOptions{itemSep: ",", keySep: ":"}, 0)
	return b.String(), err
}
