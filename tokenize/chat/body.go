package chat

import (
	"fmt"
	"math"
	"strings"

	"github.com/ardanlabs/jinja"
)

// Kind is the OpenAI endpoint a body belongs to.
type Kind int

// The body kinds DetectKind tells apart.
const (
	KindChat       Kind = iota // has "messages": /v1/chat/completions
	KindCompletion             // has "prompt": /v1/completions
)

// Body is a parsed OpenAI request body of either kind.
type Body struct {
	// Kind says which of Chat and Completion is set.
	Kind Kind
	// Chat is set for chat bodies.
	Chat *ChatBody
	// Completion is set for completions bodies.
	Completion *CompletionBody
}

// ParseBody parses a chat body (has "messages") or a completions body (has "prompt") in one
// pass over the bytes.
func ParseBody(body []byte) (*Body, error) {
	top, raw, err := parseTopRaw(body)
	if err != nil {
		return nil, err
	}
	if v, ok := top.Get("messages"); ok && !v.IsNone() {
		cb, err := chatFromDict(top, raw)
		return &Body{Kind: KindChat, Chat: cb}, err
	}
	if v, ok := top.Get("prompt"); ok && !v.IsNone() {
		cb, err := completionFromDict(top)
		return &Body{Kind: KindCompletion, Completion: cb}, err
	}
	return nil, &RequestError{Message: "request body has neither 'messages' (chat) nor 'prompt' (completions)"}
}

// DetectKind tells a chat body ("messages") from a completions body ("prompt").
func DetectKind(body []byte) (Kind, error) {
	b, err := ParseBody(body)
	if err != nil {
		if b != nil {
			return b.Kind, nil
		}
		return 0, err
	}
	return b.Kind, nil
}

func parseTop(body []byte) (*jinja.Dict, error) {
	d, _, err := parseTopRaw(body)
	return d, err
}

// parseTopRaw parses the top-level object, keeping "messages" elements as raw spans.
func parseTopRaw(body []byte) (*jinja.Dict, [][]byte, error) {
	v, raw, err := parseTopLazy(body)
	if err != nil {
		return nil, nil, &RequestError{Message: "request body is not valid JSON: " + err.Error(), Err: err}
	}
	if !v.IsDict() {
		return nil, nil, &RequestError{Message: "request body must be a JSON object"}
	}
	return v.AsDict(), raw, nil
}

// field returns top[key], treating JSON null like an absent key.
func field(top *jinja.Dict, key string) (jinja.Value, bool) {
	v, ok := top.Get(key)
	if !ok || v.IsNone() {
		return jinja.None(), false
	}
	return v, true
}

// boolField reads an optional boolean field.
func boolField(top *jinja.Dict, key string, def bool) (bool, error) {
	v, ok := field(top, key)
	if !ok {
		return def, nil
	}
	if !v.IsBool() {
		return false, &RequestError{Message: fmt.Sprintf("'%s' must be a boolean", key), Param: key}
	}
	return v.AsBool(), nil
}

// ChatBody is a parsed /v1/chat/completions body, reduced to what tokenization needs.
type ChatBody struct {
	// Request is what the template renders.
	Request Request
	// AddSpecialTokens is the request's add_special_tokens (vLLM default false for chat: the
	// template already carries BOS).
	AddSpecialTokens bool
	// CacheSalt is the validated cache_salt ("" when absent).
	CacheSalt string
}

// ParseChatBody reads a chat completions body with vLLM's defaults: add_generation_prompt true,
// continue_final_message false (both true is an error), add_special_tokens false. A request
// chat_template is refused, as vLLM does without --trust-request-chat-template. The returned
// Request carries its fields decoded (its raw JSON fields are left empty).
func ParseChatBody(body []byte) (*ChatBody, error) {
	top, raw, err := parseTopRaw(body)
	if err != nil {
		return nil, err
	}
	return chatFromDict(top, raw)
}

// chatFromDict builds a ChatBody; raw holds the messages' raw JSON spans when the parser kept
// them (they alias the body, which callers must not modify while the request is in use).
func chatFromDict(top *jinja.Dict, raw [][]byte) (*ChatBody, error) {
	msgs, _ := field(top, "messages")
	if !msgs.IsList() {
		return nil, &RequestError{Message: "'messages' must be an array of message objects", Param: "messages"}
	}
	if _, ok := field(top, "chat_template"); ok {
		return nil, &RequestError{Message: "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.", Param: "chat_template"}
	}
	f := &decodedFields{messages: msgs, rawMessages: raw}
	f.tools, _ = field(top, "tools")
	f.documents, _ = field(top, "documents")
	f.kwargs, _ = field(top, "chat_template_kwargs")
	cb := &ChatBody{Request: Request{pre: f}}
	var err error
	if cb.Request.AddGenerationPrompt, err = boolField(top, "add_generation_prompt", true); err != nil {
		return nil, err
	}
	if cb.Request.ContinueFinalMessage, err = boolField(top, "continue_final_message", false); err != nil {
		return nil, err
	}
	if cb.Request.AddGenerationPrompt && cb.Request.ContinueFinalMessage {
		return nil, &RequestError{Message: "Cannot set both `continue_final_message` and `add_generation_prompt` to True."}
	}
	if cb.AddSpecialTokens, err = boolField(top, "add_special_tokens", false); err != nil {
		return nil, err
	}
	if v, ok := field(top, "reasoning_effort"); ok {
		if !v.IsString() {
			return nil, &RequestError{Message: "'reasoning_effort' must be a string", Param: "reasoning_effort"}
		}
		cb.Request.ReasoningEffort = v.AsString()
	}
	if cb.CacheSalt, err = cacheSalt(top); err != nil {
		return nil, err
	}
	return cb, nil
}

// CompletionPrompt is one prompt of a completions request: text to encode, or token ids.
type CompletionPrompt struct {
	// Text is the prompt string ("" when given as ids).
	Text string
	// TokenIDs are the given ids; nil when the prompt is text.
	TokenIDs []uint32
}

// CompletionBody is a parsed /v1/completions body, reduced to what tokenization needs.
type CompletionBody struct {
	// Prompts holds one entry per prompt ("prompt" may be a batch).
	Prompts []CompletionPrompt
	// AddSpecialTokens is the request's add_special_tokens (vLLM default true for completions).
	AddSpecialTokens bool
	// CacheSalt is the validated cache_salt ("" when absent).
	CacheSalt string
}

// ParseCompletionBody reads a completions body. "prompt" may be what vLLM's CompletionRequest
// takes: a string, an array of token ids, an array of strings, or an array of id arrays (the
// latter two a batch). Empty batches and negative or non-integer ids are *RequestError.
func ParseCompletionBody(body []byte) (*CompletionBody, error) {
	top, err := parseTop(body)
	if err != nil {
		return nil, err
	}
	return completionFromDict(top)
}

func completionFromDict(top *jinja.Dict) (*CompletionBody, error) {
	cb := &CompletionBody{}
	var err error
	if cb.AddSpecialTokens, err = boolField(top, "add_special_tokens", true); err != nil {
		return nil, err
	}
	if cb.CacheSalt, err = cacheSalt(top); err != nil {
		return nil, err
	}
	prompt, ok := field(top, "prompt")
	if !ok {
		return nil, &RequestError{Message: "'prompt' is required", Param: "prompt"}
	}
	if cb.Prompts, err = parsePrompt(prompt); err != nil {
		return nil, err
	}
	return cb, nil
}

func parsePrompt(v jinja.Value) ([]CompletionPrompt, error) {
	bad := &RequestError{Message: "'prompt' must be a string, an array of token ids, an array of strings or an array of token id arrays", Param: "prompt"}
	if v.IsString() {
		return []CompletionPrompt{{Text: v.AsString()}}, nil
	}
	if !v.IsList() {
		return nil, bad
	}
	items := v.AsList().Items
	if len(items) == 0 {
		return nil, &RequestError{Message: "'prompt' must not be empty", Param: "prompt"}
	}
	switch {
	case items[0].IsString():
		out := make([]CompletionPrompt, len(items))
		for i, it := range items {
			if !it.IsString() {
				return nil, bad
			}
			out[i].Text = it.AsString()
		}
		return out, nil
	case items[0].IsList():
		out := make([]CompletionPrompt, len(items))
		for i, it := range items {
			if !it.IsList() {
				return nil, bad
			}
			ids, err := tokenIDs(it.AsList().Items)
			if err != nil {
				return nil, err
			}
			if len(ids) == 0 {
				return nil, &RequestError{Message: "token id prompts must not be empty", Param: fmt.Sprintf("prompt[%d]", i)}
			}
			out[i].TokenIDs = ids
		}
		return out, nil
	}
	ids, err := tokenIDs(items)
	if err != nil {
		return nil, err
	}
	return []CompletionPrompt{{TokenIDs: ids}}, nil
}

func tokenIDs(items []jinja.Value) ([]uint32, error) {
	ids := make([]uint32, len(items))
	for i, it := range items {
		if !it.IsInt() || it.AsInt() < 0 || it.AsInt() > math.MaxUint32 {
			return nil, &RequestError{Message: fmt.Sprintf("invalid token id %s", pyRepr(it)), Param: "prompt"}
		}
		ids[i] = uint32(it.AsInt())
	}
	return ids, nil
}

// cacheSalt applies vLLM's cache_salt validation: absent or null is no salt; otherwise a
// non-empty string of at most 128 characters without '@', '/', '\' or NUL.
func cacheSalt(top *jinja.Dict) (string, error) {
	v, ok := field(top, "cache_salt")
	if !ok {
		return "", nil
	}
	if !v.IsString() || v.AsString() == "" {
		return "", &RequestError{Message: "Parameter 'cache_salt' must be a non-empty string if provided.", Param: "cache_salt"}
	}
	s := v.AsString()
	if len([]rune(s)) > 128 || strings.ContainsAny(s, "@/\\\x00") {
		return "", &RequestError{Message: "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL.", Param: "cache_salt"}
	}
	return s, nil
}
