package chat

import (
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
)

// This file reproduces the message preprocessing vLLM applies before it renders a chat template
// (vllm/entrypoints/chat_utils.py: _parse_chat_message_content and _postprocess_messages, as of
// late 2026), so that the template sees the same conversation:
//   - content null → no parts; a string → one text part; text-like parts ("text", "input_text",
//     "output_text", "refusal", "thinking") contribute their text; a text/refusal part with a
//     null value is skipped; media parts are rejected (text-only models);
//   - "string" content format joins the texts with "\n"; "openai" keeps them as
//     [{"type": "text", "text": ...}];
//   - each message is rebuilt as role, content, then: assistant tool_calls (when not null) and
//     reasoning + reasoning_content (from "reasoning", else the deprecated "reasoning_content");
//     tool tool_call_id, with list content joined to a string; name and task when strings;
//     developer tools;
//   - assistant tool_calls: an empty list is dropped; string arguments are parsed as JSON
//     (invalid JSON becomes {}), arguments that are neither objects nor arrays become {}.

var textPartField = map[string]string{
	"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking",
}

// buildConversation turns the decoded "messages" array into the conversation a template sees.
func buildConversation(messages jinja.Value, format ContentFormat) ([]jinja.Value, error) {
	if !messages.IsList() {
		return nil, &RequestError{Message: "'messages' must be an array of message objects", Param: "messages"}
	}
	items := messages.AsList().Items
	conv := make([]jinja.Value, 0, len(items))
	for i, m := range items {
		msg, err := buildMessage(m, i, format)
		if err != nil {
			return nil, err
		}
		conv = append(conv, msg)
	}
	for _, m := range conv {
		if err := normalizeToolCalls(m.AsDict()); err != nil {
			return nil, err
		}
	}
	return conv, nil
}

func buildMessage(m jinja.Value, i int, format ContentFormat) (jinja.Value, error) {
	param := fmt.Sprintf("messages[%d]", i)
	if !m.IsDict() {
		return jinja.Undefined(), &RequestError{Message: "each message must be an object", Param: param}
	}
	in := m.AsDict()
	roleV, ok := in.Get("role")
	if !ok || !roleV.IsString() {
		return jinja.Undefined(), &RequestError{Message: "message 'role' must be a string", Param: param + ".role"}
	}
	role := roleV.AsString()
	texts, err := contentTexts(in, param)
	if err != nil {
		return jinja.Undefined(), err
	}
	out := jinja.NewDict()
	d := out.AsDict()
	d.Set("role", roleV)
	if format == ContentOpenAI {
		parts := make([]jinja.Value, len(texts))
		for k, t := range texts {
			p := jinja.NewDict()
			p.AsDict().Set("type", jinja.NewString("text"))
			p.AsDict().Set("text", jinja.NewString(t))
			parts[k] = p
		}
		d.Set("content", jinja.NewList(parts))
	} else {
		d.Set("content", jinja.NewString(strings.Join(texts, "\n")))
	}
	switch role {
	case "assistant":
		if tc, ok := in.Get("tool_calls"); ok && !tc.IsNone() {
			if !tc.IsList() {
				return jinja.Undefined(), &RequestError{Message: "'tool_calls' must be an array", Param: param + ".tool_calls"}
			}
			d.Set("tool_calls", deepCopy(tc))
		}
		reasoning, ok := in.Get("reasoning")
		if !ok || reasoning.IsNone() {
			reasoning, ok = in.Get("reasoning_content")
		}
		if ok && !reasoning.IsNone() {
			d.Set("reasoning", reasoning)
			d.Set("reasoning_content", reasoning)
		}
	case "tool":
		if id, ok := in.Get("tool_call_id"); ok {
			d.Set("tool_call_id", id)
		}
		if format == ContentOpenAI { // tool results are handed over as one string
			d.Set("content", jinja.NewString(strings.Join(texts, "\n")))
		}
	}
	if v, ok := in.Get("name"); ok && v.IsString() {
		d.Set("name", v)
	}
	if v, ok := in.Get("task"); ok && v.IsString() {
		d.Set("task", v)
	}
	if role == "developer" {
		v, ok := in.Get("tools")
		if !ok {
			v = jinja.None()
		}
		d.Set("tools", v)
	}
	return out, nil
}

// contentTexts returns the text of each content part of a message.
func contentTexts(in *jinja.Dict, param string) ([]string, error) {
	c, ok := in.Get("content")
	switch {
	case !ok || c.IsNone():
		return nil, nil
	case c.IsString():
		return []string{c.AsString()}, nil
	case !c.IsList():
		return nil, &RequestError{Message: "message 'content' must be a string or an array of content parts", Param: param + ".content"}
	}
	var texts []string
	for k, p := range c.AsList().Items {
		if p.IsString() {
			texts = append(texts, p.AsString())
			continue
		}
		pparam := fmt.Sprintf("%s.content[%d]", param, k)
		if !p.IsDict() {
			return nil, &RequestError{Message: "content parts must be objects or strings", Param: pparam}
		}
		pd := p.AsDict()
		tv, _ := pd.Get("type")
		if !tv.IsString() {
			return nil, &RequestError{Message: "Missing 'type' field in multimodal part.", Param: pparam}
		}
		field, ok := textPartField[tv.AsString()]
		if !ok {
			return nil, &RequestError{Message: fmt.Sprintf("Unsupported chat content part type: '%s'. This gateway tokenizes text-only models.", tv.AsString()), Param: pparam + ".type"}
		}
		v, ok := pd.Get(field)
		if !ok || v.IsNone() {
			if field == "text" || field == "refusal" {
				continue // vLLM skips text/refusal parts without content
			}
			return nil, &RequestError{Message: fmt.Sprintf("content part of type '%s' needs a '%s' string", tv.AsString(), field), Param: pparam}
		}
		if !v.IsString() {
			return nil, &RequestError{Message: fmt.Sprintf("'%s' must be a string", field), Param: pparam + "." + field}
		}
		texts = append(texts, v.AsString())
	}
	return texts, nil
}

// normalizeToolCalls parses assistant tool-call arguments into objects, as vLLM does before
// rendering (templates expect dicts; invalid JSON becomes {}).
func normalizeToolCalls(m *jinja.Dict) error {
	role, _ := m.Get("role")
	tcv, ok := m.Get("tool_calls")
	if role.AsString() != "assistant" || !ok || !tcv.IsList() {
		return nil
	}
	calls := tcv.AsList()
	if calls.Len() == 0 {
		removeKey(m, "tool_calls")
		return nil
	}
	for i, c := range calls.Items {
		if !c.IsDict() {
			return &RequestError{Message: "each tool call must be an object", Param: fmt.Sprintf("tool_calls[%d]", i)}
		}
		fn, ok := c.AsDict().Get("function")
		if !ok || !fn.IsDict() {
			return &RequestError{Message: "each tool call needs a 'function' object", Param: fmt.Sprintf("tool_calls[%d].function", i)}
		}
		fd := fn.AsDict()
		args, _ := fd.Get("arguments")
		switch {
		case args.IsString():
			parsed, err := decodeValue([]byte(args.AsString()))
			if err != nil {
				parsed = jinja.NewDict()
			}
			fd.Set("arguments", parsed)
		case args.IsDict(), args.IsList():
		default:
			fd.Set("arguments", jinja.NewDict())
		}
	}
	return nil
}

func removeKey(d *jinja.Dict, key string) {
	if !d.Has(key) {
		return
	}
	delete(d.Data, key)
	for i, k := range d.Keys {
		if k == key {
			d.Keys = append(d.Keys[:i:i], d.Keys[i+1:]...)
			break
		}
	}
}

// deepCopy copies lists and dicts so preprocessing never mutates the caller's decoded request.
func deepCopy(v jinja.Value) jinja.Value {
	switch {
	case v.IsList():
		items := v.AsList().Items
		out := make([]jinja.Value, len(items))
		for i, it := range items {
			out[i] = deepCopy(it)
		}
		return jinja.NewList(out)
	case v.IsDict():
		src := v.AsDict()
		out := jinja.NewDict()
		for _, k := range src.Keys {
			out.AsDict().Set(k, deepCopy(src.Data[k]))
		}
		return out
	}
	return v
}
