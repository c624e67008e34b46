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
	doc, err := ParseDocument(body)
	if err != nil {
		return nil, err
	}
	salt, saltErr := doc.CacheSalt()
	if v, ok := doc.top.Get("messages"); ok && !v.IsNone() {
		cb, err := doc.ChatBody()
		if err == nil {
			cb.CacheSalt, err = salt, saltErr
		}
		return &Body{Kind: KindChat, Chat: cb}, err
	}
	if v, ok := doc.top.Get("prompt"); ok && !v.IsNone() {
		cb, err := doc.CompletionBody()
		if err == nil {
			cb.CacheSalt, err = salt, saltErr
		}
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

// Document is a request body parsed once by the order-preserving parser: its top-level object
// (keys in the client's order, numbers as ints or floats) with the elements of a top-level
// "messages" array kept as raw spans of the body, decoded later through the template's message
// cache. Every view of the request (the gateway's request model, the chat template input, the
// completions prompts) is read from it, so a body is decoded once. The raw spans alias the body,
// which must not be modified while the Document is in use.
type Document struct {
	top         *jinja.Dict
	rawMessages [][]byte
}

// ParseDocument parses a body that must be one JSON object. A malformed body or one that is not
// an object is a *RequestError.
func ParseDocument(body []byte) (*Document, error) {
	top, raw, err := parseTopRaw(body)
	if err != nil {
		return nil, err
	}
	return &Document{top: top, rawMessages: raw}, nil
}

// Get returns a top-level field; JSON null counts as absent.
func (d *Document) Get(key string) (jinja.Value, bool) { return field(d.top, key) }

// Has reports whether the body has the key at all (null included).
func (d *Document) Has(key string) bool {
	_, ok := d.top.Get(key)
	return ok
}

// Keys returns the top-level keys in the order the client sent them.
func (d *Document) Keys() []string { return d.top.Keys }

// Messages returns the number of elements of the top-level "messages" array and whether it is
// an array at all.
func (d *Document) Messages() (int, bool) {
	v, ok := d.top.Get("messages")
	if !ok || !v.IsList() {
		return 0, false
	}
	if d.rawMessages != nil {
		return len(d.rawMessages), true
	}
	return len(v.AsList().Items), true
}

// RawMessage returns the raw JSON of messages[i] ("" past the end or when "messages" was not
// kept raw).
func (d *Document) RawMessage(i int) []byte {
	if i < 0 || i >= len(d.rawMessages) {
		return nil
	}
	return d.rawMessages[i]
}

// Path follows a dotted path through nested objects ("nvext.session_control.session_id");
// JSON null at the end counts as present.
func (d *Document) Path(path string) (jinja.Value, bool) {
	cur := d.top
	for {
		key, rest, more := strings.Cut(path, ".")
		v, ok := cur.Get(key)
		if !ok {
			return jinja.None(), false
		}
		if !more {
			return v, true
		}
		if !v.IsDict() {
			return jinja.None(), false
		}
		cur, path = v.AsDict(), rest
	}
}

// CacheSalt applies vLLM's cache_salt rule: absent or null is no salt; otherwise it must be a
// non-empty string (vllm/entrypoints/openai/protocol.py, check_cache_salt_support). Any
// non-empty string is accepted, as vLLM does: the salt enters block 0's hash in full.
func (d *Document) CacheSalt() (string, error) { return cacheSalt(d.top) }

// ChatBody builds the chat template input of a chat completions body with vLLM's defaults (see
// ParseChatBody). The cache salt is not read here (the caller validates it once, CacheSalt).
func (d *Document) ChatBody() (*ChatBody, error) { return chatFromDict(d.top, d.rawMessages) }

// CompletionBody builds the prompts of a completions body (see ParseCompletionBody). The cache
// salt is not read here (the caller validates it once, CacheSalt).
func (d *Document) CompletionBody() (*CompletionBody, error) { return completionFromDict(d.top) }

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
	doc, err := ParseDocument(body)
	if err != nil {
		return nil, err
	}
	return doc.salted(doc.ChatBody())
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
	doc, err := ParseDocument(body)
	if err != nil {
		return nil, err
	}
	cb, err := doc.CompletionBody()
	if err != nil {
		return nil, err
	}
	if cb.CacheSalt, err = doc.CacheSalt(); err != nil {
		return nil, err
	}
	return cb, nil
}

// salted fills a chat body's cache salt (ParseChatBody and ParseBody read it with the body).
func (d *Document) salted(cb *ChatBody, err error) (*ChatBody, error) {
	if err != nil {
		return nil, err
	}
	if cb.CacheSalt, err = d.CacheSalt(); err != nil {
		return nil, err
	}
	return cb, nil
}

func completionFromDict(top *jinja.Dict) (*CompletionBody, error) {
	cb := &CompletionBody{}
	var err error
	if cb.AddSpecialTokens, err = boolField(top, "add_special_tokens", true); err != nil {
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

// cacheSalt is Document.CacheSalt.
func cacheSalt(top *jinja.Dict) (string, error) {
	v, ok := field(top, "cache_salt")
	if !ok {
		return "", nil
	}
	if !v.IsString() || v.AsString() == "" {
		return "", &RequestError{Message: "Parameter 'cache_salt' must be a non-empty string if provided.", Param: "cache_salt"}
	}
	return v.AsString(), nil
}
