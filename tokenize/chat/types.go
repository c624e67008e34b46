package chat

import (
	"encoding/json"
	"fmt"

	"github.com/ardanlabs/jinja"
)

// Request is what a chat template is rendered from. JSON-valued fields are kept raw so that the
// key order of the client's objects survives into the template (tojson prints dicts in insertion
// order, as Python does); the renderer builds ordered values from them. A Request returned by
// ParseChatBody carries its fields already decoded instead (the raw fields stay empty and are
// ignored): build a new Request to render different content.
type Request struct {
	// Messages is the OpenAI "messages" array, as sent.
	Messages json.RawMessage
	// Tools is the OpenAI "tools" array (nil or JSON null: no tools).
	Tools json.RawMessage
	// Documents is the vLLM "documents" array for RAG templates (nil: none).
	Documents json.RawMessage
	// ChatTemplateKwargs is the "chat_template_kwargs" object (e.g. {"enable_thinking": false}).
	ChatTemplateKwargs json.RawMessage
	// AddGenerationPrompt appends the assistant header. vLLM's request default is true; the Go
	// zero value is false, so callers building a Request by hand must set it.
	AddGenerationPrompt bool
	// ContinueFinalMessage leaves the final (assistant) message open so generation continues it.
	ContinueFinalMessage bool
	// ReasoningEffort is the request's reasoning_effort ("" when absent). vLLM hands it to the
	// template as reasoning_effort and, unless chat_template_kwargs sets enable_thinking, sets
	// enable_thinking = (effort != "none").
	ReasoningEffort string

	// pre holds the JSON fields already decoded by ParseChatBody, so a body is parsed once.
	pre *decodedFields
}

// decodedFields are Request's JSON fields as template values (None when absent).
type decodedFields struct {
	messages, tools, documents, kwargs jinja.Value
	// rawMessages, when set, replaces messages: each element's raw JSON, decoded through the
	// template's message cache.
	rawMessages [][]byte
	// toolsAsIs hands tools to the template unchanged (NewValueRequest).
	toolsAsIs bool
}

// TemplateError is a failure inside the chat template (raise_exception, an undefined method, a
// type error). The server maps it to HTTP 400 with Message, as vLLM does.
type TemplateError struct {
	// Message is the template's own message (for raise_exception, its argument).
	Message string
	// Err is the underlying engine error, if any.
	Err error
}

// Error implements error.
func (e *TemplateError) Error() string { return "chat template error: " + e.Message }

// Unwrap returns the engine error.
func (e *TemplateError) Unwrap() error { return e.Err }

// RequestError is a malformed request body or field (wrong JSON shape, invalid combination of
// options). The server maps it to HTTP 400 with Message; Param names the offending field.
type RequestError struct {
	// Message is the client-facing message.
	Message string
	// Param names the field at fault ("" when not one field).
	Param string
	// Err is the underlying cause, if any.
	Err error
}

// Error implements error.
func (e *RequestError) Error() string {
	if e.Param != "" {
		return fmt.Sprintf("invalid request (%s): %s", e.Param, e.Message)
	}
	return "invalid request: " + e.Message
}

// Unwrap returns the underlying cause.
func (e *RequestError) Unwrap() error { return e.Err }
