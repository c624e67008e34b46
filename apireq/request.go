package apireq

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/tokenize/chat"
)

// Endpoint is the API path a body was posted to; it decides how the body maps into a Request.
// A new API (Anthropic Messages, OpenAI Responses) is a new Endpoint with its own mapping into
// the same Request.
type Endpoint string

// The endpoints Parse maps (Responses is in responses.go).
const (
	ChatCompletions Endpoint = "/v1/chat/completions"
	Completions     Endpoint = "/v1/completions"
)

// Error is a request the gateway refuses: HTTP Status with an OpenAI-style message and, when one
// field is at fault, its name.
type Error struct {
	Status  int
	Param   string
	Message string
}

// Error implements error.
func (e *Error) Error() string { return e.Message }

func badRequest(param, msg string) *Error {
	return &Error{Status: http.StatusBadRequest, Param: param, Message: msg}
}

// StreamOptions is vLLM's stream_options (OpenAI's plus continuous_usage_stats); nil fields are
// absent.
type StreamOptions struct {
	IncludeUsage         *bool
	ContinuousUsageStats *bool
}

// SessionControl is nvext.session_control: the session a request belongs to and whether it
// closes it.
type SessionControl struct {
	SessionID       string
	ParentSessionID string
	Action          string
}

// Request is one parsed, validated API request as the server, the session layer and the
// tokenizer see it. It is built by Parser.Parse from a single parse of the body.
type Request struct {
	// Endpoint is where the body was posted; Body is exactly what the client sent (forwarded
	// unchanged).
	Endpoint Endpoint
	Body     []byte
	// Model is the requested model ("" when the client sent none).
	Model string
	// Stream is the request's stream flag; StreamOptions its stream_options (nil when absent).
	Stream        bool
	StreamOptions *StreamOptions
	// CacheSalt is the validated cache_salt ("" when absent).
	CacheSalt string
	// AddSpecialTokens is add_special_tokens with the endpoint's vLLM default (false for chat:
	// the template carries BOS; true for completions).
	AddSpecialTokens bool
	// SessionControl is nvext.session_control (nil when absent).
	SessionControl *SessionControl
	// Session is who the request says it is (session, parent, end of session), filled by
	// Parser.Identify from the headers and the same parse of the body.
	Session Identity
	// PreviousResponseID is a Responses request's previous_response_id ("" when absent): the
	// request continues a response stored on the worker that produced it. Store is its store
	// flag (default true); other endpoints leave both zero.
	PreviousResponseID string
	Store              bool
	// MaxTokens is the output cap the request asks for (max_tokens, max_completion_tokens or
	// max_output_tokens; the smallest when several are set), 0 when none: the first-byte deadline
	// of a non-stream request is derived from it.
	MaxTokens int
	// MaxModelLen is the model's context length (0: unknown). An enricher that tokenizes refuses
	// a prompt of MaxModelLen or more tokens, and stops tokenizing as soon as that is certain
	// (vLLM requires room for one output token).
	MaxModelLen int

	doc *chat.Document
	// anthropic is the converted Messages body (nil for other endpoints).
	anthropic *anthropicRequest
	// preserveInline is the Parser's inline system mode for Messages bodies.
	preserveInline bool
}

// Messages is the number of chat messages (0 for other endpoints).
func (r *Request) Messages() int {
	if r.Endpoint != ChatCompletions {
		return 0
	}
	n, _ := r.doc.Messages()
	return n
}

// RawMessage returns the JSON of chat message i as sent (nil past the end).
func (r *Request) RawMessage(i int) []byte { return r.doc.RawMessage(i) }

// TemplateInput returns what the chat template renders: messages, tools, documents,
// chat_template_kwargs and the generation flags, from the one parse. For Responses it is the
// mapped conversation (responses.go), or ErrStatefulPrompt for a previous_response_id follow-up. It is built on demand (only
// the template path needs it); an error is a *chat.RequestError vLLM answers with 400 too
// (e.g. a request chat_template, or both add_generation_prompt and continue_final_message).
func (r *Request) TemplateInput() (*chat.Request, error) {
	if r.anthropic != nil {
		return r.anthropicTemplateInput(), nil
	}
	if r.Endpoint == Responses {
		return responsesTemplate(r)
	}
	if r.Endpoint != ChatCompletions {
		return nil, fmt.Errorf("%s has no chat template input", r.Endpoint)
	}
	cb, err := r.doc.ChatBody()
	if err != nil {
		return nil, err
	}
	return &cb.Request, nil
}

// Prompts returns a completions request's prompts (text or token ids, one per batch entry); an
// error is a *chat.RequestError (e.g. a negative token id).
func (r *Request) Prompts() ([]chat.CompletionPrompt, error) {
	if r.Endpoint != Completions {
		return nil, fmt.Errorf("%s has no completions prompts", r.Endpoint)
	}
	cb, err := r.doc.CompletionBody()
	if err != nil {
		return nil, err
	}
	return cb.Prompts, nil
}

// emptyToolsMessage is vLLM's refusal of "tools": [] on /v1/chat/completions.
const emptyToolsMessage = "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely."

// Parser maps request bodies into Requests; it carries the session identity configuration.
// It is safe for concurrent use.
type Parser struct {
	ids IdentityConfig
	// preserveInline keeps Anthropic inline system messages in place (see SetInlineSystem).
	preserveInline bool
}

// NewParser returns a parser reading session identity as ids says (nil lists take the defaults;
// an explicitly empty, non-nil list disables that source).
func NewParser(ids IdentityConfig) *Parser {
	return &Parser{ids: ids.withDefaults()}
}

// Parse decodes and validates a body posted to endpoint, once. Model existence and session
// identity are checked by the caller (Identify). It never panics on any input.
func (p *Parser) Parse(endpoint Endpoint, body []byte) (*Request, *Error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil, badRequest("", "request body is empty; expected a JSON object")
	}
	var sc *schema
	switch endpoint {
	case ChatCompletions:
		sc = chatSchema
	case Completions:
		sc = completionSchema
	case Messages, MessagesCountTokens:
		sc = messagesSchema
	case Responses:
		sc = responsesSchema
	default:
		return nil, &Error{Status: http.StatusNotFound, Message: "unknown endpoint " + string(endpoint)}
	}
	if trimmed[0] != '{' {
		if !json.Valid(trimmed) {
			return nil, malformed(json.Unmarshal(trimmed, new(any)))
		}
		return nil, badRequest("", "request body must be a JSON object")
	}
	// The one parse. It validates the whole body, the chat messages it keeps as raw spans
	// included; on failure encoding/json names the error (the gateway's message since before).
	doc, err := chat.ParseDocument(body)
	if err != nil {
		if jerr := json.Unmarshal(body, new(any)); jerr != nil {
			return nil, malformed(jerr)
		}
		return nil, badRequest("", "malformed JSON: "+err.Error())
	}
	r := &Request{Endpoint: endpoint, Body: body, doc: doc, preserveInline: p.preserveInline}
	if e := sc.check(doc); e != nil {
		return nil, e
	}
	if e := r.fill(); e != nil {
		return nil, e
	}
	return r, nil
}

// Identify fills r.Session from the headers and r's parsed body, the session and parent ids
// hashed (kvkey.HashSessionID): nothing downstream (tracker, logs, debug views, the worker's
// X-Session-ID) sees what the client sent. A session or parent id that is too long or carries
// control characters is a 400.
func (p *Parser) Identify(r *Request, h http.Header) *Error {
	id, err := p.ids.identity(h, r.doc)
	if err != nil {
		return badRequest("", err.Error())
	}
	id.SessionID, id.ParentID = kvkey.HashSessionID(id.SessionID), kvkey.HashSessionID(id.ParentID)
	r.Session = id
	return nil
}

// Forward sets the forwarded session header (IdentityConfig.ForwardHeader) on an upstream
// request's headers.
func (p *Parser) Forward(h http.Header, id Identity) {
	if id.SessionID != "" {
		h.Set(p.ids.ForwardHeader, id.SessionID)
	}
}

// fill reads the modelled fields (their types are already checked) and applies the rules that
// span fields.
func (r *Request) fill() *Error {
	d := r.doc
	if v, ok := d.Get("model"); ok {
		r.Model = v.AsString()
	}
	if v, ok := d.Get("stream"); ok {
		r.Stream = v.AsBool()
	}
	for _, k := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens"} {
		if v, ok := d.Get(k); ok && v.IsInt() && v.AsInt() > 0 && (r.MaxTokens == 0 || int(v.AsInt()) < r.MaxTokens) {
			r.MaxTokens = int(v.AsInt())
		}
	}
	if _, ok := d.Get("stream_options"); ok {
		so := &StreamOptions{}
		if b, ok := d.Path("stream_options.include_usage"); ok && b.IsBool() {
			x := b.AsBool()
			so.IncludeUsage = &x
		}
		if b, ok := d.Path("stream_options.continuous_usage_stats"); ok && b.IsBool() {
			x := b.AsBool()
			so.ContinuousUsageStats = &x
		}
		r.StreamOptions = so
	}
	if v, ok := d.Get("nvext"); ok && v.IsDict() {
		if c, ok := d.Path("nvext.session_control"); ok && c.IsDict() {
			sc := &SessionControl{}
			str := func(path string) string {
				if s, ok := d.Path(path); ok && s.IsString() {
					return s.AsString()
				}
				return ""
			}
			sc.SessionID = str("nvext.session_control.session_id")
			sc.ParentSessionID = str("nvext.session_control.parent_session_id")
			sc.Action = str("nvext.session_control.action")
			r.SessionControl = sc
		}
	}
	r.AddSpecialTokens = r.Endpoint == Completions
	if v, ok := d.Get("add_special_tokens"); ok && !r.Endpoint.IsMessages() {
		r.AddSpecialTokens = v.AsBool()
	}

	switch r.Endpoint {
	case Messages, MessagesCountTokens:
		if e := r.parseAnthropic(r.preserveInline); e != nil {
			return e
		}
	case ChatCompletions:
		if n, _ := d.Messages(); n == 0 {
			return badRequest("messages", "messages: must be a non-empty array of messages")
		}
		if v, ok := d.Get("tools"); ok && v.IsList() && len(v.AsList().Items) == 0 {
			// vLLM's chat endpoint refuses it as OpenAI does (chat_completion/protocol.py,
			// ChatCompletionRequest.check_tool_usage, since vLLM #39780); Messages and
			// Responses take an empty list as no tools.
			return badRequest("tools", emptyToolsMessage)
		}
	case Responses:
		if e := r.fillResponses(); e != nil {
			return e
		}
	case Completions:
		v, ok := d.Get("prompt")
		switch {
		case !ok:
			return badRequest("prompt", "prompt: is required")
		case v.IsString():
		case v.IsList():
			if len(v.AsList().Items) == 0 {
				return badRequest("prompt", "prompt: must not be an empty array")
			}
		default:
			return badRequest("prompt", "prompt: must be a string, an array of strings, or an array of token ids")
		}
	}
	if r.StreamOptions != nil && !r.Stream && !r.Endpoint.IsMessages() {
		// vLLM rejects this the same way (vllm/entrypoints/openai/protocol.py,
		// validate_stream_options).
		return badRequest("stream_options", "Stream options can only be defined when `stream=True`.")
	}
	// One cache_salt rule for every policy: vLLM's (tokenize/chat, Document.CacheSalt).
	salt, err := d.CacheSalt()
	if err != nil {
		var re *chat.RequestError
		if errors.As(err, &re) {
			return badRequest(re.Param, re.Message)
		}
		return badRequest("cache_salt", err.Error())
	}
	r.CacheSalt = salt
	return nil
}

func malformed(err error) *Error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return badRequest("", fmt.Sprintf("malformed JSON at byte %d: %s", se.Offset, se.Error()))
	}
	if err == nil {
		return badRequest("", "malformed JSON")
	}
	return badRequest("", "malformed JSON: "+err.Error())
}
