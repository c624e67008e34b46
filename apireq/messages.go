package apireq

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"

	"github.com/kvgate/kvgate/tokenize/chat"
)

// The Anthropic Messages endpoints. A Messages body is mapped into the chat messages vLLM's
// Anthropic entrypoint builds (vllm/entrypoints/anthropic/serving.py,
// AnthropicServingMessages.to_chat_completion_request) and rendered by the chat template like
// a chat request; the body itself is forwarded unchanged.
const (
	Messages            Endpoint = "/v1/messages"
	MessagesCountTokens Endpoint = "/v1/messages/count_tokens"
)

// IsMessages reports whether e is one of the Anthropic Messages endpoints.
func (e Endpoint) IsMessages() bool { return e == Messages || e == MessagesCountTokens }

// billingHeader starts the per-request attribution text Claude Code puts in its system
// prompt; vLLM skips such text blocks (serving.py, _convert_system_message and
// _extract_system_text) so that prefix caching survives.
const billingHeader = "x-anthropic-billing-header"

// anthropicBlockTypes are the content block types vLLM's schema accepts
// (vllm/entrypoints/anthropic/protocol.py, AnthropicContentBlock.type); any other is a 400.
var anthropicBlockTypes = map[string]bool{
	"text": true, "image": true, "tool_use": true, "tool_result": true,
	"tool_reference": true, "thinking": true, "redacted_thinking": true,
}

// anthropicRequest is a decoded Messages body: the chat conversion of what the template sees.
type anthropicRequest struct {
	messages []jinja.Value // the converted OpenAI chat messages
	tools    jinja.Value   // the converted function tools (None: no tools)
	kwargs   jinja.Value   // chat_template_kwargs (None: absent)
	effort   string        // output_config.effort → reasoning_effort ("" when absent)
}

// The inline system modes of SetInlineSystem.
const (
	InlineSystemMerge    = "merge"
	InlineSystemPreserve = "preserve"
)

// SetInlineSystem chooses what becomes of role "system" messages inside a Messages body's
// messages: InlineSystemMerge (the default) appends their text to the leading system message,
// as vLLM does when it runs without --chat-template or its template rejects a system message
// after the first turn; InlineSystemPreserve keeps each in place, as vLLM does with a
// --chat-template that renders it (AnthropicServingMessages._detect_merge_inline_system). Call
// it before the Parser is shared.
func (p *Parser) SetInlineSystem(mode string) error {
	switch mode {
	case "", InlineSystemMerge:
		p.preserveInline = false
	case InlineSystemPreserve:
		p.preserveInline = true
	default:
		return fmt.Errorf("inline system mode %q is not merge or preserve", mode)
	}
	return nil
}

// parseAnthropic validates a Messages body and converts it. The checks are those of vLLM's
// pydantic models (protocol.py), whose failures it answers with 400.
func (r *Request) parseAnthropic(preserveInline bool) *Error {
	d := r.doc
	n, isList := d.Messages()
	if v, ok := d.Get("messages"); !ok || v.IsNone() {
		return badRequest("messages", "messages: Field required")
	}
	if !isList {
		return badRequest("messages", "messages: Input should be a valid list")
	}
	if n == 0 {
		// vLLM would render an empty conversation; Anthropic refuses it, and so do Anthropic
		// clients' expectations (https://docs.claude.com/en/api/messages: at least one message).
		return badRequest("messages", "messages: at least one message is required")
	}
	if r.Endpoint == Messages {
		v, ok := d.Get("max_tokens")
		switch {
		case !ok || v.IsNone():
			return badRequest("max_tokens", "max_tokens: Field required")
		case !v.IsInt():
			return badRequest("max_tokens", "max_tokens: Input should be a valid integer")
		case v.AsInt() <= 0:
			return badRequest("max_tokens", "max_tokens: Value error, max_tokens must be positive")
		}
	}
	if v, ok := d.Get("model"); !ok || !v.IsString() {
		return badRequest("model", "model: Field required (a string)")
	}
	msgs := make([]jinja.Value, 0, n)
	for i := range n {
		m, err := decodeRaw(d.RawMessage(i))
		if err != nil || !m.IsDict() {
			return badRequest("messages", fmt.Sprintf("messages[%d]: Input should be a valid dictionary", i))
		}
		if e := checkAnthropicMessage(m.AsDict(), i, i == n-1); e != nil {
			return e
		}
		msgs = append(msgs, m)
	}
	sys, _ := d.Get("system")
	if !sys.IsNone() && !sys.IsString() && !sys.IsList() {
		return badRequest("system", "system: Input should be a valid string or a list of blocks")
	}
	ar := &anthropicRequest{}
	ar.messages = convertAnthropic(sys, msgs, preserveInline)
	tools, e := convertAnthropicTools(d)
	if e != nil {
		return e
	}
	ar.tools = tools
	if v, ok := d.Get("chat_template_kwargs"); ok && !v.IsNone() {
		if !v.IsDict() {
			return badRequest("chat_template_kwargs", "chat_template_kwargs: Input should be a valid dictionary")
		}
		ar.kwargs = v
	} else {
		ar.kwargs = jinja.None()
	}
	if r.Endpoint == Messages { // count_tokens ignores output_config (_handle_output_config)
		if v, ok := d.Path("output_config.effort"); ok && v.IsString() {
			ar.effort = v.AsString()
		}
	}
	if tc, ok := d.Get("tool_choice"); ok && !tc.IsNone() {
		if !tc.IsDict() {
			return badRequest("tool_choice", "tool_choice: Input should be a valid dictionary")
		}
		t, _ := tc.AsDict().Get("type")
		switch {
		case !t.IsString():
			return badRequest("tool_choice", "tool_choice.type: Field required")
		case t.AsString() == "tool":
			if name, _ := tc.AsDict().Get("name"); !name.IsString() {
				return badRequest("tool_choice", "tool_choice.name: a tool_choice of type 'tool' needs a name")
			}
		case t.AsString() != "auto" && t.AsString() != "any" && t.AsString() != "none":
			return badRequest("tool_choice", "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'")
		}
	}
	r.anthropic = ar
	return nil
}

// pyDumps is chat.PyJSONDumps of a value decoded from the client's JSON or built from such
// values, which always serialises ("null" otherwise, never reached).
func pyDumps(v jinja.Value) string {
	s, err := chat.PyJSONDumps(v)
	if err != nil {
		return "null"
	}
	return s
}

// decodeRaw decodes one JSON value with the template's order-preserving parser.
func decodeRaw(raw []byte) (jinja.Value, error) {
	doc, err := chat.ParseDocument(append(append([]byte(`{"v":`), raw...), '}'))
	if err != nil {
		return jinja.Undefined(), fmt.Errorf("decode: %w", err)
	}
	v, _ := doc.Get("v")
	return v, nil
}

// checkAnthropicMessage validates message i as vLLM's schema does, plus Anthropic's refusal of
// an empty block list except on a final assistant message (a prefill).
func checkAnthropicMessage(m *jinja.Dict, i int, last bool) *Error {
	role, _ := m.Get("role")
	if !role.IsString() {
		return badRequest("messages", fmt.Sprintf("messages[%d].role: Field required", i))
	}
	switch role.AsString() {
	case "user", "assistant", "system":
	default:
		return badRequest("messages", fmt.Sprintf("messages[%d].role: Input should be 'user', 'assistant' or 'system'", i))
	}
	c, ok := m.Get("content")
	switch {
	case !ok:
		return badRequest("messages", fmt.Sprintf("messages[%d].content: Field required", i))
	case !c.IsString() && !c.IsList():
		return badRequest("messages", fmt.Sprintf("messages[%d].content: Input should be a valid string or a list of content blocks", i))
	}
	if c.IsList() && len(c.AsList().Items) == 0 && !(last && role.AsString() == "assistant") {
		return badRequest("messages", fmt.Sprintf("messages.%d: all messages must have non-empty content except for the optional final assistant message", i))
	}
	if c.IsString() {
		return nil
	}
	for k, b := range c.AsList().Items {
		if !b.IsDict() {
			return badRequest("messages", fmt.Sprintf("messages[%d].content[%d]: Input should be a valid dictionary", i, k))
		}
		t, _ := b.AsDict().Get("type")
		if !t.IsString() || !anthropicBlockTypes[t.AsString()] {
			return badRequest("messages", fmt.Sprintf("messages[%d].content[%d].type: Input should be 'text', 'image', 'tool_use', 'tool_result', 'tool_reference', 'thinking' or 'redacted_thinking'", i, k))
		}
	}
	return nil
}

// Helpers over decoded values.

func get(d *jinja.Dict, key string) jinja.Value {
	v, ok := d.Get(key)
	if !ok {
		return jinja.None()
	}
	return v
}

func strField(d *jinja.Dict, key string) string {
	if v := get(d, key); v.IsString() {
		return v.AsString()
	}
	return ""
}

// truthy is Python's truth value of a JSON value.
func truthy(v jinja.Value) bool {
	switch {
	case v.IsNone(), v.IsUndefined():
		return false
	case v.IsBool():
		return v.AsBool()
	case v.IsInt():
		return v.AsInt() != 0
	case v.IsFloat():
		return v.AsFloat() != 0
	case v.IsString():
		return v.AsString() != ""
	case v.IsList():
		return len(v.AsList().Items) > 0
	case v.IsDict():
		return len(v.AsDict().Keys) > 0
	}
	return true
}

// obj builds an ordered dict from key, value pairs.
func obj(kv ...any) jinja.Value {
	o := jinja.NewDict()
	d := o.AsDict()
	for i := 0; i+1 < len(kv); i += 2 {
		switch v := kv[i+1].(type) {
		case string:
			d.Set(kv[i].(string), jinja.NewString(v))
		case jinja.Value:
			d.Set(kv[i].(string), v)
		}
	}
	return o
}

// convertAnthropic builds the OpenAI chat messages of vLLM's to_chat_completion_request:
// _convert_system_message then _convert_messages. Inline system messages are merged into the
// leading system message unless preserveInline (merge_inline_system=False) keeps them in
// place.
func convertAnthropic(system jinja.Value, msgs []jinja.Value, preserveInline bool) []jinja.Value {
	var out []jinja.Value
	// _convert_system_message: a string is used as is; text blocks with text are joined with
	// "" (billing header blocks skipped); then every inline system message's text.
	var parts []string
	if truthy(system) {
		if system.IsString() {
			parts = append(parts, system.AsString())
		} else {
			for _, b := range system.AsList().Items {
				if !b.IsDict() {
					continue
				}
				bd := b.AsDict()
				if t := strField(bd, "text"); strField(bd, "type") == "text" && t != "" && !strings.HasPrefix(t, billingHeader) {
					parts = append(parts, t)
				}
			}
		}
	}
	for _, m := range msgs {
		if md := m.AsDict(); !preserveInline && strField(md, "role") == "system" {
			if t := systemText(md); t != "" {
				parts = append(parts, t)
			}
		}
	}
	if len(parts) > 0 {
		out = append(out, obj("role", "system", "content", strings.Join(parts, "")))
	}
	// _convert_messages.
	for _, m := range msgs {
		md := m.AsDict()
		role := strField(md, "role")
		if role == "system" {
			if t := systemText(md); preserveInline && t != "" {
				out = append(out, obj("role", "system", "content", t))
			}
			continue // merged above, or kept in place
		}
		om := obj("role", role)
		c := get(md, "content")
		if c.IsString() {
			om.AsDict().Set("content", c)
		} else {
			out = convertContent(role, c.AsList().Items, om.AsDict(), out)
		}
		if role == "user" && !om.AsDict().Has("content") {
			continue // a user turn of tool_results only: its tool messages were emitted
		}
		out = append(out, om)
	}
	return out
}

// systemText is _extract_system_text: the text of an inline system message, billing header
// stripped ("" for none).
func systemText(md *jinja.Dict) string {
	c := get(md, "content")
	if c.IsString() {
		if strings.HasPrefix(c.AsString(), billingHeader) {
			return ""
		}
		return c.AsString()
	}
	var parts []string
	for _, b := range c.AsList().Items {
		bd := b.AsDict()
		if t := strField(bd, "text"); strField(bd, "type") == "text" && t != "" && !strings.HasPrefix(t, billingHeader) {
			parts = append(parts, t)
		}
	}
	return strings.Join(parts, "")
}

// convertContent is _convert_message_content and _convert_block: it fills om and returns out
// with the tool messages a user turn's tool_result blocks emit (before the turn itself).
func convertContent(role string, blocks []jinja.Value, om *jinja.Dict, out []jinja.Value) []jinja.Value {
	var parts, calls []jinja.Value
	var reasoning []string
	sawReasoning := false
	for _, b := range blocks {
		bd := b.AsDict()
		switch strField(bd, "type") {
		case "text":
			if t := strField(bd, "text"); t != "" {
				parts = append(parts, obj("type", "text", "text", t))
			}
		case "image":
			if src := get(bd, "source"); truthy(src) && src.IsDict() {
				parts = append(parts, obj("type", "image_url", "image_url", obj("url", imageURL(src.AsDict()))))
			}
		case "thinking":
			if t := get(bd, "thinking"); t.IsString() {
				reasoning = append(reasoning, t.AsString())
				sawReasoning = true
			}
		case "tool_use":
			id := strField(bd, "id")
			if id == "" {
				// vLLM's own fallback: the id depends on the second the worker converts the
				// request, so a gateway can only guess it.
				id = fmt.Sprintf("call_%d", time.Now().Unix())
			}
			input := get(bd, "input")
			if !truthy(input) {
				input = jinja.NewDict()
			}
			calls = append(calls, obj("id", id, "type", "function",
				"function", obj("name", strField(bd, "name"), "arguments", pyDumps(input))))
		case "tool_result":
			if role == "user" {
				out = append(out, toolResultMessages(bd)...)
				continue
			}
			text := ""
			if c := get(bd, "content"); truthy(c) {
				if c.IsString() {
					text = c.AsString()
				} else {
					text = chat.PyRepr(c) // str(block.content): Python's repr of the raw items
				}
			}
			parts = append(parts, obj("type", "text", "text", "Tool result: "+text))
		}
	}
	if sawReasoning {
		om.Set("reasoning", jinja.NewString(strings.Join(reasoning, "")))
	}
	if len(calls) > 0 {
		om.Set("tool_calls", jinja.NewList(calls))
	}
	if len(parts) == 1 && strField(parts[0].AsDict(), "type") == "text" {
		om.Set("content", get(parts[0].AsDict(), "text"))
	} else if len(parts) > 0 {
		om.Set("content", jinja.NewList(parts))
	}
	return out
}

// imageURL is _convert_image_source_to_url: a URL source as is, anything else a data URI
// (media type defaulting to image/jpeg).
func imageURL(src *jinja.Dict) string {
	if strField(src, "type") == "url" {
		return strField(src, "url")
	}
	mt := "image/jpeg"
	if v, ok := src.Get("media_type"); ok {
		mt = pyStr(v)
	}
	data := ""
	if v, ok := src.Get("data"); ok {
		data = pyStr(v)
	}
	return "data:" + mt + ";base64," + data
}

// pyStr is Python's str() of a JSON value (an f-string field).
func pyStr(v jinja.Value) string {
	if v.IsString() {
		return v.AsString()
	}
	return chat.PyRepr(v)
}

// toolResultMessages is _convert_user_tool_result: a tool message with the joined text, then a
// user message with the result's images, then a tool message with its tool references.
func toolResultMessages(bd *jinja.Dict) []jinja.Value {
	text := ""
	var images, refs []jinja.Value
	c := get(bd, "content")
	if c.IsString() {
		text = c.AsString()
	} else if c.IsList() {
		var texts []string
		for _, it := range c.AsList().Items {
			if !it.IsDict() {
				continue
			}
			id := it.AsDict()
			switch strField(id, "type") {
			case "text":
				texts = append(texts, strField(id, "text"))
			case "image":
				src := jinja.NewDict()
				if s := get(id, "source"); s.IsDict() {
					src = s
				}
				if u := imageURL(src.AsDict()); u != "" {
					images = append(images, obj("type", "image_url", "image_url", obj("url", u)))
				}
			case "tool_reference":
				name := strField(id, "tool_name")
				if name == "" {
					name = strField(id, "name")
				}
				if name != "" {
					refs = append(refs, obj("type", "tool_reference", "name", name))
				}
			}
		}
		text = strings.Join(texts, "\n")
	}
	callID := strField(bd, "tool_use_id")
	out := []jinja.Value{obj("role", "tool", "tool_call_id", callID, "content", text)}
	if len(images) > 0 {
		out = append(out, obj("role", "user", "content", jinja.NewList(images)))
	}
	if len(refs) > 0 {
		out = append(out, obj("role", "tool", "tool_call_id", callID, "content", jinja.NewList(refs)))
	}
	return out
}

// convertAnthropicTools is _convert_tools: each tool becomes the model_dump of a function
// tool, {"type": "function", "function": {"name", "description" (null kept), "parameters"}},
// with strict and defer_loading only when set; an input_schema without "type" gets
// "type": "object" appended as its last key (protocol.py, AnthropicTool.validate_input_schema).
func convertAnthropicTools(d *chat.Document) (jinja.Value, *Error) {
	v, ok := d.Get("tools")
	if !ok || v.IsNone() {
		return jinja.None(), nil
	}
	if !v.IsList() {
		return jinja.None(), badRequest("tools", "tools: Input should be a valid list")
	}
	var tools []jinja.Value
	for i, t := range v.AsList().Items {
		if !t.IsDict() {
			return jinja.None(), badRequest("tools", fmt.Sprintf("tools[%d]: Input should be a valid dictionary", i))
		}
		td := t.AsDict()
		name := get(td, "name")
		if !name.IsString() {
			return jinja.None(), badRequest("tools", fmt.Sprintf("tools[%d].name: Field required", i))
		}
		schema := get(td, "input_schema")
		if !schema.IsDict() {
			return jinja.None(), badRequest("tools", fmt.Sprintf("tools[%d].input_schema: Field required (an object)", i))
		}
		if !schema.AsDict().Has("type") {
			c := deepCopyValue(schema)
			c.AsDict().Set("type", jinja.NewString("object"))
			schema = c
		}
		fn := obj("name", name, "description", get(td, "description"), "parameters", schema)
		if s := get(td, "strict"); !s.IsNone() {
			fn.AsDict().Set("strict", s)
		}
		if s := get(td, "defer_loading"); !s.IsNone() {
			fn.AsDict().Set("defer_loading", s)
		}
		tools = append(tools, obj("type", "function", "function", fn))
	}
	if tools == nil {
		tools = []jinja.Value{}
	}
	return jinja.NewList(tools), nil
}

func deepCopyValue(v jinja.Value) jinja.Value {
	switch {
	case v.IsList():
		items := v.AsList().Items
		out := make([]jinja.Value, len(items))
		for i, it := range items {
			out[i] = deepCopyValue(it)
		}
		return jinja.NewList(out)
	case v.IsDict():
		src := v.AsDict()
		o := jinja.NewDict()
		for _, k := range src.Keys {
			o.AsDict().Set(k, deepCopyValue(src.Data[k]))
		}
		return o
	}
	return v
}

// ChatMessages returns the OpenAI chat messages a Messages request converts to, as JSON (nil
// for other endpoints): what the worker renders, for tests and `kvgate tokenize`.
func (r *Request) ChatMessages() json.RawMessage {
	if r.anthropic == nil {
		return nil
	}
	return json.RawMessage(pyDumps(jinja.NewList(r.anthropic.messages)))
}

// anthropicTemplateInput is TemplateInput for a Messages request: vLLM's chat defaults
// (add_generation_prompt true, continue_final_message false: a trailing assistant message is
// not continued).
func (r *Request) anthropicTemplateInput() *chat.Request {
	a := r.anthropic
	in := &chat.Request{
		Messages:            json.RawMessage(pyDumps(jinja.NewList(a.messages))),
		AddGenerationPrompt: true,
		ReasoningEffort:     a.effort,
	}
	if !a.tools.IsNone() {
		in.Tools = json.RawMessage(pyDumps(a.tools))
	}
	if !a.kwargs.IsNone() {
		in.ChatTemplateKwargs = json.RawMessage(pyDumps(a.kwargs))
	}
	return in
}

// messagesSchema lists the Messages body fields whose JSON types are checked before routing
// (vllm/entrypoints/anthropic/protocol.py, AnthropicMessagesRequest); unknown fields are
// dropped by vLLM's schema and forwarded here unchecked.
var messagesSchema = &schema{fields: map[string]rule{
	"model":                str,
	"max_tokens":           integer,
	"stream":               boolean,
	"temperature":          float,
	"top_p":                float,
	"top_k":                integer,
	"metadata":             object,
	"stop_sequences":       {kind: kStop},
	"tools":                {kind: kArray, goType: "[]AnthropicTool"},
	"tool_choice":          {kind: kObject, goType: "AnthropicToolChoice"},
	"thinking":             {kind: kObject, goType: "AnthropicThinking"},
	"output_config":        {kind: kObject, goType: "AnthropicOutputConfig"},
	"chat_template_kwargs": object,
	"session_id":           str,
	"nvext": {kind: kObject, goType: "NVExt", fields: map[string]rule{
		"session_control": {kind: kObject, goType: "SessionControl", fields: map[string]rule{
			"session_id":        str,
			"parent_session_id": str,
			"action":            str,
		}},
	}},
}}

// anthropicOnly are block types only Anthropic content has (OpenAI parts are text,
// image_url, input_audio, file, ...).
var anthropicOnly = map[string]bool{
	"tool_use": true, "tool_result": true, "thinking": true, "redacted_thinking": true,
	"image": true, "tool_reference": true,
}

// LooksLikeMessages reports whether a body is an Anthropic Messages body rather than a chat
// completions one: it has a top-level system or stop_sequences, a tool with input_schema, or
// a content block only Anthropic has. For tools that take either (`kvgate tokenize`,
// /debug/route) when the caller does not say.
func LooksLikeMessages(body []byte) bool {
	var top struct {
		System        json.RawMessage `json:"system"`
		StopSequences json.RawMessage `json:"stop_sequences"`
		Tools         []struct {
			InputSchema json.RawMessage `json:"input_schema"`
		} `json:"tools"`
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &top) != nil {
		return false
	}
	if top.System != nil || top.StopSequences != nil {
		return true
	}
	for _, t := range top.Tools {
		if t.InputSchema != nil {
			return true
		}
	}
	for _, m := range top.Messages {
		var blocks []struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(m.Content, &blocks) != nil {
			continue
		}
		for _, b := range blocks {
			if anthropicOnly[b.Type] {
				return true
			}
		}
	}
	return false
}
