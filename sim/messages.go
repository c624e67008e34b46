package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/jsonobj"
)

// The Anthropic Messages endpoints, served as vLLM serves them
// (vllm/entrypoints/anthropic/serving.py, AnthropicServingMessages): the body is converted
// into a chat completions request (inline system messages merged into the leading system
// message, as vLLM decides without --chat-template), which runs the normal chat path; its
// response is converted back (messages_full_converter, message_stream_converter). The
// conversion here is the simulator's own, written apart from the gateway's, so that each
// checks the other.

const anthBilling = "x-anthropic-billing-header"

// kv is one key of an ordered JSON object.
type kv struct {
	k string
	v any
}

// omap is a JSON object that keeps its key order.
type omap []kv

// MarshalJSON writes the keys in order.
func (m omap) MarshalJSON() ([]byte, error) {
	var w jsonobj.Writer
	for _, e := range m {
		v, err := json.Marshal(e.v)
		if err != nil {
			return nil, fmt.Errorf("key %s: %w", e.k, err)
		}
		w.Raw(e.k, v)
	}
	return w.Bytes(), nil
}

type anthBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	Thinking  *string         `json:"thinking"`
	Source    json.RawMessage `json:"source"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
}

type anthMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anthTool struct {
	Name         string          `json:"name"`
	Description  *string         `json:"description"`
	InputSchema  json.RawMessage `json:"input_schema"`
	Strict       *bool           `json:"strict"`
	DeferLoading *bool           `json:"defer_loading"`
}

type anthBody struct {
	Model        string          `json:"model"`
	MaxTokens    *int            `json:"max_tokens"`
	Stream       bool            `json:"stream"`
	System       json.RawMessage `json:"system"`
	Messages     []anthMessage   `json:"messages"`
	Tools        []anthTool      `json:"tools"`
	Kwargs       json.RawMessage `json:"chat_template_kwargs"`
	CacheSalt    json.RawMessage `json:"cache_salt"`
	IgnoreEOS    bool            `json:"ignore_eos"`
	OutputConfig *struct {
		Effort *string `json:"effort"`
	} `json:"output_config"`
	SessionID string `json:"session_id"`
}

// blocksOf decodes content that is a list of blocks (ok false for a string or null).
func blocksOf(raw json.RawMessage) ([]anthBlock, bool) {
	var bs []anthBlock
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &bs) != nil {
		return nil, false
	}
	return bs, true
}

func stringOf(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// systemTexts are the usable text blocks' texts (billing headers skipped).
func systemTexts(bs []anthBlock) string {
	var out string
	for _, b := range bs {
		if b.Type == "text" && b.Text != nil && *b.Text != "" && !strings.HasPrefix(*b.Text, anthBilling) {
			out += *b.Text
		}
	}
	return out
}

// toChat converts a Messages body into a chat completions body.
func toChat(b *anthBody, countTokens, preserveInline bool) ([]byte, error) {
	var msgs []any
	system := ""
	if s, ok := stringOf(b.System); ok {
		system = s
	} else if bs, ok := blocksOf(b.System); ok {
		system = systemTexts(bs)
	}
	for _, m := range b.Messages {
		if m.Role != "system" || preserveInline {
			continue
		}
		if s, ok := stringOf(m.Content); ok {
			if !strings.HasPrefix(s, anthBilling) {
				system += s
			}
		} else if bs, ok := blocksOf(m.Content); ok {
			system += systemTexts(bs)
		}
	}
	if system != "" {
		msgs = append(msgs, omap{{"role", "system"}, {"content", system}})
	}
	for _, m := range b.Messages {
		switch m.Role {
		case "system":
			if preserveInline {
				text := ""
				if s, ok := stringOf(m.Content); ok && !strings.HasPrefix(s, anthBilling) {
					text = s
				} else if bs, ok := blocksOf(m.Content); ok {
					text = systemTexts(bs)
				}
				if text != "" {
					msgs = append(msgs, omap{{"role", "system"}, {"content", text}})
				}
			}
			continue
		case "user", "assistant":
		default:
			return nil, fmt.Errorf("messages: role %q: Input should be 'user', 'assistant' or 'system'", m.Role)
		}
		if s, ok := stringOf(m.Content); ok {
			msgs = append(msgs, omap{{"role", m.Role}, {"content", s}})
			continue
		}
		bs, ok := blocksOf(m.Content)
		if !ok {
			return nil, errors.New("messages: content must be a string or a list of blocks")
		}
		var parts, calls []any
		reasoning, hasReasoning := "", false
		for _, bl := range bs {
			switch bl.Type {
			case "text":
				if bl.Text != nil && *bl.Text != "" {
					parts = append(parts, omap{{"type", "text"}, {"text", *bl.Text}})
				}
			case "image":
				if u, ok := imageSourceURL(bl.Source); ok {
					parts = append(parts, omap{{"type", "image_url"}, {"image_url", omap{{"url", u}}}})
				}
			case "thinking":
				if bl.Thinking != nil {
					reasoning += *bl.Thinking
					hasReasoning = true
				}
			case "tool_use":
				args := "{}"
				if in := bytes.TrimSpace(bl.Input); len(in) > 0 && !bytes.Equal(in, []byte("null")) && !bytes.Equal(in, []byte("{}")) {
					args = string(in) // the template sees it parsed back, as vLLM parses it
				}
				id := bl.ID
				if id == "" {
					id = fmt.Sprintf("call_%d", time.Now().Unix()) // vLLM's fallback id
				}
				calls = append(calls, omap{{"id", id}, {"type", "function"}, {"function", omap{{"name", bl.Name}, {"arguments", args}}}})
			case "tool_result":
				if m.Role == "user" {
					msgs = append(msgs, toolResult(bl)...)
					continue
				}
				text := ""
				if s, ok := stringOf(bl.Content); ok {
					text = s
				} else if c := bytes.TrimSpace(bl.Content); len(c) > 2 && c[0] == '[' {
					r, err := reprJSON(c)
					if err != nil {
						return nil, err
					}
					text = r
				}
				parts = append(parts, omap{{"type", "text"}, {"text", "Tool result: " + text}})
			case "redacted_thinking", "tool_reference":
			default:
				return nil, fmt.Errorf("messages: block type %q is not accepted", bl.Type)
			}
		}
		om := omap{{"role", m.Role}}
		if hasReasoning {
			om = append(om, kv{"reasoning", reasoning})
		}
		if len(calls) > 0 {
			om = append(om, kv{"tool_calls", calls})
		}
		switch {
		case len(parts) == 1 && parts[0].(omap)[0].v == "text":
			om = append(om, kv{"content", parts[0].(omap)[1].v})
		case len(parts) > 0:
			om = append(om, kv{"content", parts})
		case m.Role == "user":
			continue // nothing but tool results: no user message
		}
		msgs = append(msgs, om)
	}
	chat := omap{{"model", b.Model}, {"messages", msgs}}
	if b.Tools != nil {
		tools := []any{}
		for _, t := range b.Tools {
			fn := omap{{"name", t.Name}, {"description", t.Description}, {"parameters", withObjectType(t.InputSchema)}}
			if t.Strict != nil {
				fn = append(fn, kv{"strict", *t.Strict})
			}
			if t.DeferLoading != nil {
				fn = append(fn, kv{"defer_loading", *t.DeferLoading})
			}
			tools = append(tools, omap{{"type", "function"}, {"function", fn}})
		}
		chat = append(chat, kv{"tools", tools})
	}
	if len(b.Kwargs) > 0 && string(b.Kwargs) != "null" {
		chat = append(chat, kv{"chat_template_kwargs", b.Kwargs})
	}
	if !countTokens {
		chat = append(chat, kv{"max_tokens", b.MaxTokens}, kv{"ignore_eos", b.IgnoreEOS})
		if b.OutputConfig != nil && b.OutputConfig.Effort != nil {
			chat = append(chat, kv{"reasoning_effort", *b.OutputConfig.Effort})
		}
		if b.Stream {
			chat = append(chat, kv{"stream", true}, kv{"stream_options", omap{{"include_usage", true}, {"continuous_usage_stats", true}}})
		}
	}
	if len(b.CacheSalt) > 0 {
		chat = append(chat, kv{"cache_salt", b.CacheSalt})
	}
	if b.SessionID != "" {
		chat = append(chat, kv{"session_id", b.SessionID})
	}
	return json.Marshal(chat)
}

// withObjectType appends "type": "object" to a schema object that has no "type".
func withObjectType(raw json.RawMessage) json.RawMessage {
	var keys map[string]json.RawMessage
	s := bytes.TrimSpace(raw)
	if json.Unmarshal(s, &keys) != nil {
		return raw
	}
	if _, ok := keys["type"]; ok {
		return raw
	}
	body := bytes.TrimSpace(s[1 : len(s)-1])
	if len(body) == 0 {
		return json.RawMessage(`{"type":"object"}`)
	}
	return json.RawMessage("{" + string(body) + `,"type":"object"}`)
}

func imageSourceURL(raw json.RawMessage) (string, bool) {
	var src map[string]any
	if json.Unmarshal(raw, &src) != nil || len(src) == 0 {
		return "", false
	}
	if src["type"] == "url" {
		u, _ := src["url"].(string)
		return u, true
	}
	mt, ok := src["media_type"].(string)
	if !ok {
		mt = "image/jpeg"
	}
	data, _ := src["data"].(string)
	return "data:" + mt + ";base64," + data, true
}

// toolResult is a user turn's tool_result: the tool message, then a user message with its
// images, then a tool message with its tool references.
func toolResult(bl anthBlock) []any {
	text := ""
	var images, refs []any
	if s, ok := stringOf(bl.Content); ok {
		text = s
	} else {
		var items []map[string]json.RawMessage
		_ = json.Unmarshal(bl.Content, &items)
		var texts []string
		for _, it := range items {
			typ, _ := stringOf(it["type"])
			switch typ {
			case "text":
				t, _ := stringOf(it["text"])
				texts = append(texts, t)
			case "image":
				src := it["source"]
				if len(src) == 0 {
					src = json.RawMessage(`{"x":0}`) // a missing source still makes a data URI
				}
				if u, ok := imageSourceURL(src); ok && u != "" {
					images = append(images, omap{{"type", "image_url"}, {"image_url", omap{{"url", u}}}})
				}
			case "tool_reference":
				n, _ := stringOf(it["tool_name"])
				if n == "" {
					n, _ = stringOf(it["name"])
				}
				if n != "" {
					refs = append(refs, omap{{"type", "tool_reference"}, {"name", n}})
				}
			}
		}
		text = strings.Join(texts, "\n")
	}
	out := []any{omap{{"role", "tool"}, {"tool_call_id", bl.ToolUseID}, {"content", text}}}
	if len(images) > 0 {
		out = append(out, omap{{"role", "user"}, {"content", images}})
	}
	if len(refs) > 0 {
		out = append(out, omap{{"role", "tool"}, {"tool_call_id", bl.ToolUseID}, {"content", refs}})
	}
	return out
}

// reprJSON prints a JSON value as Python's repr() of its json.loads, walking the tokens so
// that key order survives.
func reprJSON(raw []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	var walk func() error
	walk = func() error {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("repr: %w", err)
		}
		switch t := tok.(type) {
		case json.Delim:
			closer := "]"
			if t == '{' {
				closer = "}"
			}
			b.WriteString(string(t))
			for i := 0; dec.More(); i++ {
				if i > 0 {
					b.WriteString(", ")
				}
				if t == '{' {
					k, err := dec.Token()
					if err != nil {
						return fmt.Errorf("repr: %w", err)
					}
					b.WriteString(pyQuote(k.(string)))
					b.WriteString(": ")
				}
				if err := walk(); err != nil {
					return err
				}
			}
			if _, err := dec.Token(); err != nil {
				return fmt.Errorf("repr: %w", err)
			}
			b.WriteString(closer)
		case string:
			b.WriteString(pyQuote(t))
		case bool:
			b.WriteString(map[bool]string{true: "True", false: "False"}[t])
		case nil:
			b.WriteString("None")
		case json.Number:
			s := t.String()
			if strings.ContainsAny(s, ".eE") {
				f, _ := strconv.ParseFloat(s, 64)
				s = strconv.FormatFloat(f, 'g', -1, 64)
				if !strings.ContainsAny(s, ".e") {
					s += ".0"
				}
			}
			b.WriteString(s)
		}
		return nil
	}
	if err := walk(); err != nil {
		return "", err
	}
	return b.String(), nil
}

// pyQuote is Python's repr of a str, for the printable text tool results carry.
func pyQuote(s string) string {
	q := "'"
	if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
		q = `"`
	}
	r := strings.NewReplacer(`\`, `\\`, "\n", `\n`, "\r", `\r`, "\t", `\t`)
	s = r.Replace(s)
	if q == "'" {
		s = strings.ReplaceAll(s, "'", `\'`)
	}
	return q + s + q
}

// handleMessages serves POST /v1/messages and /v1/messages/count_tokens.
func (w *Worker) handleMessages(rw http.ResponseWriter, r *http.Request, countTokens bool) {
	raw, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
	if err != nil {
		writeError(rw, http.StatusBadRequest, "read body: "+err.Error())
		return
	}
	var b anthBody
	if err := json.Unmarshal(raw, &b); err != nil {
		writeError(rw, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	// Schema failures are answered by vLLM's app-wide validation handler, OpenAI-shaped.
	if len(b.Messages) == 0 {
		writeError(rw, http.StatusBadRequest, "Field required: messages")
		return
	}
	if !countTokens && b.MaxTokens == nil {
		writeError(rw, http.StatusBadRequest, "Field required: max_tokens")
		return
	}
	chatBody, err := toChat(&b, countTokens, w.opts.PreserveInlineSystem)
	if err != nil {
		writeError(rw, http.StatusBadRequest, err.Error())
		return
	}
	if countTokens {
		if b.Model != "" && b.Model != w.opts.ServedModelName {
			if _, ok := w.loras.id(b.Model); !ok {
				writeAnthropicError(rw, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", b.Model))
				return
			}
		}
		toks, err := w.tok.tokenizeRequest(r.Context(), chatBody)
		if err != nil {
			writeAnthropicError(rw, http.StatusBadRequest, "BadRequestError", err.Error())
			return
		}
		writeJSON(rw, http.StatusOK, omap{{"input_tokens", len(toks)}, {"context_management", omap{{"original_input_tokens", len(toks)}}}})
		return
	}
	r2 := r.Clone(context.WithValue(r.Context(), messagesKey{}, true))
	r2.Body = io.NopCloser(bytes.NewReader(chatBody))
	r2.ContentLength = int64(len(chatBody))
	cw := &anthWriter{rw: rw, stream: b.Stream}
	w.handleCompletion(cw, r2, true)
	cw.finish()
}

func writeAnthropicError(rw http.ResponseWriter, status int, typ, msg string) {
	writeJSON(rw, status, omap{{"type", "error"}, {"error", omap{{"type", typ}, {"message", msg}}}})
}
