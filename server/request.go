package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"

	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/sessions"
)

// StringList is a JSON string or array of strings (OpenAI's "stop").
type StringList []string

// UnmarshalJSON accepts "x", ["x", "y"] and null.
func (s *StringList) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		*s = nil
		return nil
	}
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = StringList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("stop: expected a string or an array of strings")
	}
	*s = many
	return nil
}

// StreamOptions is vLLM's stream_options (OpenAI's plus continuous_usage_stats).
type StreamOptions struct {
	IncludeUsage         *bool `json:"include_usage,omitempty"`
	ContinuousUsageStats *bool `json:"continuous_usage_stats,omitempty"`
}

// NVExt is the Dynamo-style extension object; the gateway reads session control from it.
type NVExt struct {
	SessionControl *SessionControl `json:"session_control,omitempty"`
}

// SessionControl names the session a request belongs to and whether it closes it.
type SessionControl struct {
	SessionID       string `json:"session_id,omitempty"`
	ParentSessionID string `json:"parent_session_id,omitempty"`
	Action          string `json:"action,omitempty"`
}

// vllmExtras are the vLLM request fields the gateway must see (tokenization and hashing
// depend on them); everything else is forwarded untouched without being modelled.
type vllmExtras struct {
	CacheSalt        json.RawMessage `json:"cache_salt,omitempty"`
	NVExt            *NVExt          `json:"nvext,omitempty"`
	SessionID        string          `json:"session_id,omitempty"`
	AddSpecialTokens *bool           `json:"add_special_tokens,omitempty"`
	IgnoreEOS        bool            `json:"ignore_eos,omitempty"`
	VLLMXArgs        map[string]any  `json:"vllm_xargs,omitempty"`
}

// ChatRequest is a /v1/chat/completions body: go-openai's type plus vLLM's extras. Its own
// fields shadow go-openai fields of the same JSON name (encoding/json prefers the shallower).
type ChatRequest struct {
	openai.ChatCompletionRequest
	vllmExtras
	// Fields below shadow go-openai fields whose types are narrower than what clients send.
	Stop                 StringList         `json:"stop,omitempty"`
	Metadata             map[string]any     `json:"metadata,omitempty"`
	LogitBias            map[string]float64 `json:"logit_bias,omitempty"`
	StreamOptions        *StreamOptions     `json:"stream_options,omitempty"`
	AddGenerationPrompt  *bool              `json:"add_generation_prompt,omitempty"`
	ContinueFinalMessage bool               `json:"continue_final_message,omitempty"`
	ChatTemplate         string             `json:"chat_template,omitempty"`
}

// CompletionRequest is a /v1/completions body: go-openai's type plus vLLM's extras.
type CompletionRequest struct {
	openai.CompletionRequest
	vllmExtras
	// Fields below shadow go-openai fields whose types are narrower than what clients send.
	Stop          StringList         `json:"stop,omitempty"`
	Metadata      map[string]any     `json:"metadata,omitempty"`
	LogitBias     map[string]float64 `json:"logit_bias,omitempty"`
	StreamOptions *StreamOptions     `json:"stream_options,omitempty"`
	// LogProbs is an int in OpenAI's completions API but clients also send null.
	LogProbs *int `json:"logprobs,omitempty"`
}

// Inbound is one parsed client request as the server and an enricher see it.
type Inbound struct {
	Endpoint   string // "/v1/chat/completions" or "/v1/completions"
	Body       []byte // exactly as the client sent it; forwarded as is
	Chat       *ChatRequest
	Completion *CompletionRequest
	// Session is who the request says it is (session, parent, end of session).
	Session sessions.Identity
	// MaxModelLen is the model's context length (0: unknown). An enricher that tokenizes
	// refuses a prompt of MaxModelLen or more tokens with ContextLengthError, and stops
	// tokenizing as soon as that is certain (vLLM requires room for one output token).
	MaxModelLen int
}

// Model is the requested model name ("" when the client sent none).
func (in *Inbound) Model() string {
	if in.Chat != nil {
		return in.Chat.Model
	}
	return in.Completion.Model
}

// Stream reports whether the client asked for a stream.
func (in *Inbound) Stream() bool {
	if in.Chat != nil {
		return in.Chat.Stream
	}
	return in.Completion.Stream
}

func (in *Inbound) extras() *vllmExtras {
	if in.Chat != nil {
		return &in.Chat.vllmExtras
	}
	return &in.Completion.vllmExtras
}

// streamOptions returns the request's stream_options, or nil.
func (in *Inbound) streamOptions() *StreamOptions {
	if in.Chat != nil {
		return in.Chat.StreamOptions
	}
	return in.Completion.StreamOptions
}

// CacheSalt returns the cache_salt string ("" when absent).
func (in *Inbound) CacheSalt() string {
	var s string
	_ = json.Unmarshal(in.extras().CacheSalt, &s)
	return s
}

// SessionControl returns nvext.session_control, or nil.
func (in *Inbound) SessionControl() *SessionControl {
	if nv := in.extras().NVExt; nv != nil {
		return nv.SessionControl
	}
	return nil
}

const (
	pathChat        = "/v1/chat/completions"
	pathCompletions = "/v1/completions"
)

// parseRequest decodes and validates a body for endpoint. Model existence is checked by the
// caller. It never panics on any input (see FuzzParseRequest).
func parseRequest(endpoint string, body []byte) (*Inbound, *apiError) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil, badRequest("", "request body is empty; expected a JSON object")
	}
	in := &Inbound{Endpoint: endpoint, Body: body}
	var target any
	switch endpoint {
	case pathChat:
		in.Chat = &ChatRequest{}
		target = in.Chat
	case pathCompletions:
		in.Completion = &CompletionRequest{}
		target = in.Completion
	default:
		return nil, &apiError{Status: 404, Message: "unknown endpoint " + endpoint}
	}
	if trimmed[0] != '{' {
		if !json.Valid(trimmed) {
			return nil, malformed(json.Unmarshal(trimmed, new(any)))
		}
		return nil, badRequest("", "request body must be a JSON object")
	}
	if err := json.Unmarshal(body, target); err != nil {
		return nil, decodeError(err)
	}
	if e := validate(in); e != nil {
		return nil, e
	}
	return in, nil
}

func malformed(err error) *apiError {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return badRequest("", fmt.Sprintf("malformed JSON at byte %d: %s", se.Offset, se.Error()))
	}
	return badRequest("", "malformed JSON: "+err.Error())
}

func decodeError(err error) *apiError {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		return malformed(err)
	case errors.As(err, &te):
		field := jsonPath(te.Field)
		if field == "" {
			field = "body"
		}
		return badRequest(field, fmt.Sprintf("invalid type for %s: expected %s, got JSON %s", field, te.Type, te.Value))
	}
	return badRequest("", "invalid request: "+err.Error())
}

// jsonPath drops the Go names of embedded structs from a decode error's field path
// ("ChatCompletionRequest.max_tokens" → "max_tokens"); OpenAI keys are lower case.
func jsonPath(field string) string {
	parts := strings.Split(field, ".")
	out := parts[:0]
	for _, p := range parts {
		if p != "" && !unicode.IsUpper(rune(p[0])) {
			out = append(out, p)
		}
	}
	return strings.Join(out, ".")
}

func validate(in *Inbound) *apiError {
	if in.Chat != nil {
		if len(in.Chat.Messages) == 0 {
			return badRequest("messages", "messages: must be a non-empty array of messages")
		}
	} else {
		switch p := in.Completion.Prompt.(type) {
		case nil:
			return badRequest("prompt", "prompt: is required")
		case string:
		case []any:
			if len(p) == 0 {
				return badRequest("prompt", "prompt: must not be an empty array")
			}
		default:
			return badRequest("prompt", "prompt: must be a string, an array of strings, or an array of token ids")
		}
	}
	if in.streamOptions() != nil && !in.Stream() {
		// vLLM rejects this the same way (vllm/entrypoints/openai/protocol.py,
		// validate_stream_options).
		return badRequest("stream_options", "Stream options can only be defined when `stream=True`.")
	}
	x := in.extras()
	if len(x.CacheSalt) > 0 && !bytes.Equal(x.CacheSalt, []byte("null")) {
		var s string
		if err := json.Unmarshal(x.CacheSalt, &s); err != nil || s == "" {
			return badRequest("cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided.")
		}
	}
	return nil
}
