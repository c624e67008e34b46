package bench

import (
	"encoding/json"
	"fmt"
)

// API is the request format a replay sends the trace's conversations in.
type API string

// Replay APIs.
const (
	// APIChat posts OpenAI chat completions to /v1/chat/completions (the default).
	APIChat API = "chat"
	// APIMessages posts Anthropic Messages to /v1/messages: leading system messages become
	// the top-level system blocks, every message a list of one text block.
	APIMessages API = "messages"
	// APIResponses posts stateless OpenAI Responses to /v1/responses: a leading system message
	// becomes instructions, the whole conversation is the input of every turn, store false.
	APIResponses API = "responses"
)

// ParseAPI checks an --api value ("" is APIChat).
func ParseAPI(s string) (API, error) {
	switch API(s) {
	case "", APIChat:
		return APIChat, nil
	case APIMessages, APIResponses:
		return API(s), nil
	}
	return "", fmt.Errorf("unknown api %q (want chat, messages or responses)", s)
}

// path is the endpoint the API posts to.
func (a API) path() string {
	switch a {
	case APIMessages:
		return "/v1/messages"
	case APIResponses:
		return "/v1/responses"
	}
	return "/v1/chat/completions"
}

// defaultMaxTokens is max_tokens of a Messages request whose turn records no output length
// (the field is required there).
const defaultMaxTokens = 1024

// leadingSystem splits off the leading system messages' texts.
func leadingSystem(msgs []Message) ([]string, []Message) {
	var sys []string
	for len(msgs) > 0 && msgs[0].Role == "system" {
		sys = append(sys, msgs[0].Content)
		msgs = msgs[1:]
	}
	return sys, msgs
}

// body builds the request body of one turn; out is the output cap (0: none recorded).
func (a API) body(model string, msgs []Message, out int) map[string]any {
	switch a {
	case APIMessages:
		sys, rest := leadingSystem(msgs)
		body := map[string]any{"model": model, "stream": true}
		if len(sys) > 0 {
			blocks := make([]map[string]any, len(sys))
			for i, s := range sys {
				blocks[i] = map[string]any{"type": "text", "text": s}
			}
			body["system"] = blocks
		}
		ms := make([]map[string]any, len(rest))
		for i, m := range rest {
			ms[i] = map[string]any{"role": m.Role, "content": []map[string]any{{"type": "text", "text": m.Content}}}
		}
		body["messages"] = ms
		body["max_tokens"] = out
		return body
	case APIResponses:
		rest := msgs
		body := map[string]any{"model": model, "stream": true, "store": false}
		if len(rest) > 0 && rest[0].Role == "system" {
			body["instructions"] = rest[0].Content
			rest = rest[1:]
		}
		items := make([]map[string]any, len(rest))
		for i, m := range rest {
			items[i] = map[string]any{"type": "message", "role": m.Role, "content": m.Content}
		}
		body["input"] = items
		if out > 0 {
			body["max_output_tokens"] = out
		}
		return body
	}
	body := map[string]any{"model": model, "messages": msgs, "stream": true,
		"stream_options": map[string]any{"include_usage": true}}
	if out > 0 {
		body["max_completion_tokens"] = out
	}
	return body
}

// anthropicUsage is the usage object of Anthropic's message_start (message.usage) and
// message_delta events: input_tokens excludes what was read from or written to the cache.
type anthropicUsage struct {
	InputTokens              *int `json:"input_tokens"`
	OutputTokens             int  `json:"output_tokens"`
	CacheReadInputTokens     int  `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int  `json:"cache_creation_input_tokens"`
}

// anthropicEvent is the subset of a Messages stream event kvbench reads.
type anthropicEvent struct {
	Type  string `json:"type"`
	Delta struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		Thinking string `json:"thinking"`
		Partial  string `json:"partial_json"`
	} `json:"delta"`
	Usage   *anthropicUsage `json:"usage"`
	Message *struct {
		Usage *anthropicUsage `json:"usage"`
	} `json:"message"`
	Error json.RawMessage `json:"error"`
}

// handleAnthropic reads one Messages stream event; it returns true at message_stop or on an
// error. The usage of the latest event that carries input_tokens wins (message_delta's final
// counts over message_start's).
func (s *sender) handleAnthropic(data []byte, text func(content, other string), rec *Record) bool {
	var ev anthropicEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		rec.fail(ErrBadResponse, fmt.Sprintf("invalid event JSON: %v", err))
		return true
	}
	u := ev.Usage
	if u == nil && ev.Message != nil {
		u = ev.Message.Usage
	}
	if u != nil && u.InputTokens != nil {
		rec.HasUsage = true
		rec.PromptTokens = *u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens
		rec.CachedTokens = u.CacheReadInputTokens
		rec.OutputTokens = u.OutputTokens
	}
	switch ev.Type {
	case "error":
		rec.fail(ErrStream, string(data))
		return true
	case "message_stop":
		return true
	case "content_block_delta":
		text(ev.Delta.Text, ev.Delta.Thinking+ev.Delta.Partial)
	}
	return false
}

// responsesEvent is the subset of a Responses stream event kvbench reads.
type responsesEvent struct {
	Type     string `json:"type"`
	Delta    string `json:"delta"`
	Response *struct {
		Usage *struct {
			InputTokens        int `json:"input_tokens"`
			OutputTokens       int `json:"output_tokens"`
			InputTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
		} `json:"usage"`
	} `json:"response"`
}

// handleResponses reads one Responses stream event; it returns true at response.completed
// (or response.incomplete / response.failed) or on an error.
func (s *sender) handleResponses(data []byte, text func(content, other string), rec *Record) bool {
	var ev responsesEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		rec.fail(ErrBadResponse, fmt.Sprintf("invalid event JSON: %v", err))
		return true
	}
	if r := ev.Response; r != nil && r.Usage != nil {
		rec.HasUsage = true
		rec.PromptTokens = r.Usage.InputTokens
		rec.OutputTokens = r.Usage.OutputTokens
		if d := r.Usage.InputTokensDetails; d != nil {
			rec.CachedTokens = d.CachedTokens
		}
	}
	switch ev.Type {
	case "error", "response.failed":
		rec.fail(ErrStream, string(data))
		return true
	case "response.completed", "response.incomplete":
		return true
	case "response.output_text.delta":
		text(ev.Delta, "")
	case "response.reasoning_text.delta", "response.function_call_arguments.delta":
		text("", ev.Delta)
	}
	return false
}
