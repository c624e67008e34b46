package apireq

import (
	"encoding/json"
	"fmt"

	"github.com/ardanlabs/jinja"

	"github.com/kvgate/kvgate/tokenize/chat"
)

// ItemReference is the input item type OpenAI clients send for an item of a stored response
// (the AI SDK does on every turn after the first with its default store: true). vLLM has no
// mapping for it; the gateway resolves it first (server/itemrefs.go).
const ItemReference = "item_reference"

// UnresolvedReferenceError is the mapping's error for an item_reference input item left
// unresolved: the client is told which item, and that store: false makes it send the items
// themselves.
type UnresolvedReferenceError struct {
	Index  int
	ID     string
	Reason string
}

// Error implements error.
func (e *UnresolvedReferenceError) Error() string {
	return fmt.Sprintf("input[%d]: item_reference %q cannot be resolved (%s); "+
		"send the item itself, or set \"store\": false on the requests so the client sends whole items instead of references",
		e.Index, e.ID, e.Reason)
}

// responsesMessages is construct_input_messages (responses/utils.py): instructions, the stored
// conversation a previous_response_id continues, then the input.
func responsesMessages(d *chat.Document, prev *ResponsesHistory) ([]jinja.Value, error) {
	var msgs []jinja.Value
	// 1. Truthy instructions become the leading system message.
	if ins, ok := d.Get("instructions"); ok && ins.IsString() && ins.AsString() != "" {
		msgs = append(msgs, dict("role", jinja.NewString("system"), "content", ins))
	}
	// 2. The stored conversation without its system messages (instructions do not carry
	// over), then one assistant message per text part of each output message; reasoning and
	// function_call outputs are skipped.
	if prev != nil {
		for _, m := range prev.Messages {
			if !isRole(m, "system") {
				msgs = append(msgs, m)
			}
		}
		for _, o := range prev.Output {
			if !o.IsDict() || !isType(o.AsDict(), "message") {
				continue
			}
			parts, _ := o.AsDict().Get("content")
			if !parts.IsList() {
				continue
			}
			for _, p := range parts.AsList().Items {
				text := jinja.NewString("")
				if p.IsDict() {
					if t, ok := p.AsDict().Get("text"); ok && t.IsString() {
						text = t
					}
				}
				msgs = append(msgs, dict("role", jinja.NewString("assistant"), "content", text))
			}
		}
	}
	in, _ := d.Get("input")
	// 3. A string input is one user message; a list goes item by item
	// (construct_chat_messages_with_tool_call), merging only within the new input.
	if in.IsString() {
		return append(msgs, dict("role", jinja.NewString("user"), "content", in)), nil
	}
	items, err := inputMessages(in.AsList().Items)
	if err != nil {
		return nil, err
	}
	return append(msgs, items...), nil
}

func isType(d *jinja.Dict, typ string) bool {
	t, ok := d.Get("type")
	return ok && t.IsString() && t.AsString() == typ
}

// inputMessages is construct_chat_messages_with_tool_call with
// _construct_message_from_response_item's rules (responses/utils.py): tool calls, reasoning
// and assistant text merge into the previous assistant message where it has room.
func inputMessages(items []jinja.Value) ([]jinja.Value, error) {
	var msgs []jinja.Value
	lastAssistant := func() (int, bool) {
		if n := len(msgs); n > 0 && isRole(msgs[n-1], "assistant") {
			return n - 1, true
		}
		return 0, false
	}
	// mergeInto sets key on the previous assistant message when it has none (a copy: the
	// client's parsed item is never modified); false when there is no room.
	mergeInto := func(key string, v jinja.Value) bool {
		j, ok := lastAssistant()
		if !ok {
			return false
		}
		if _, has := str1(msgs[j].AsDict(), key); has {
			return false
		}
		m := copyDict(msgs[j])
		m.AsDict().Set(key, v)
		msgs[j] = m
		return true
	}
	for i, it := range items {
		param := fmt.Sprintf("input[%d]", i)
		if !it.IsDict() {
			return nil, reqErr(param, "each input item must be an object")
		}
		item := it.AsDict()
		typ := ""
		if t, ok := item.Get("type"); ok && t.IsString() {
			typ = t.AsString()
		}
		switch typ {
		case "function_call", "custom_tool_call":
			tc, err := toolCall(item, typ, param)
			if err != nil {
				return nil, err
			}
			if j, ok := lastAssistant(); ok {
				m := copyDict(msgs[j])
				calls := []jinja.Value{}
				if old, ok := str1(m.AsDict(), "tool_calls"); ok && old.IsList() {
					calls = append(calls, old.AsList().Items...)
				}
				m.AsDict().Set("tool_calls", jinja.NewList(append(calls, tc)))
				msgs[j] = m
				continue
			}
			msgs = append(msgs, dict("role", jinja.NewString("assistant"), "tool_calls", jinja.NewList([]jinja.Value{tc})))
			continue
		case "function_call_output", "custom_tool_call_output":
			out, _ := item.Get("output")
			callID, _ := item.Get("call_id")
			msgs = append(msgs, dict("role", jinja.NewString("tool"), "content", none(out), "tool_call_id", none(callID)))
			continue
		case "reasoning":
			// ResponseReasoningItem: encrypted content is refused; else content[0].text, else
			// summary[0].text, else "".
			if e, ok := str1(item, "encrypted_content"); ok && truthy(e) {
				return nil, reqErr("input", "Encrypted content is not supported.")
			}
			text := firstText(item, "content")
			if text.IsNone() {
				text = firstText(item, "summary")
			}
			if text.IsNone() {
				text = jinja.NewString("")
			}
			if !mergeInto("reasoning", text) {
				msgs = append(msgs, dict("role", jinja.NewString("assistant"), "reasoning", text))
			}
			continue
		case ItemReference:
			id, _ := str1(item, "id")
			ref := ""
			if id.IsString() {
				ref = id.AsString()
			}
			return nil, &UnresolvedReferenceError{Index: i, ID: ref, Reason: "no stored response holds it"}
		}
		role, hasRole := item.Get("role")
		if hasRole && role.IsString() && role.AsString() == "assistant" {
			// An assistant message (an output message item or a plain dict): its text is the
			// string content or content[0].text, merged into a previous assistant message
			// without content.
			if text, ok := assistantText(item); ok {
				if !mergeInto("content", text) {
					msgs = append(msgs, dict("role", jinja.NewString("assistant"), "content", text))
				}
				continue
			}
		}
		if hasRole {
			// Any other message (user, system, developer) is a chat message as it stands.
			msgs = append(msgs, it)
			continue
		}
		return nil, reqErr("input", "Unsupported input item type: %s", typeName(typ))
	}
	return msgs, nil
}

// toolCall is a function_call (its call_id as the id, the arguments string verbatim, a
// namespaced name flattened) or a custom_tool_call (its freeform input wrapped as
// {"input": ...}) as a chat tool call.
func toolCall(item *jinja.Dict, typ, param string) (jinja.Value, error) {
	callID, _ := str1(item, "call_id")
	name, _ := str1(item, "name")
	if !name.IsString() {
		return jinja.None(), reqErr(param+".name", "%s: name must be a string", typ)
	}
	fname := name.AsString()
	if ns, ok := str1(item, "namespace"); ok && ns.IsString() && ns.AsString() != "" {
		fname = flatToolName(ns.AsString(), fname)
	}
	var args jinja.Value
	if typ == "custom_tool_call" {
		input, _ := str1(item, "input")
		s := ""
		if input.IsString() {
			s = input.AsString()
		}
		b, _ := json.Marshal(s)
		args = jinja.NewString(`{"input": ` + string(b) + `}`)
	} else {
		args, _ = str1(item, "arguments")
	}
	return dict("id", callID, "function", dict("name", jinja.NewString(fname), "arguments", args), "type", jinja.NewString("function")), nil
}

// assistantText is an assistant message item's text: a string content, or the text of its
// first content part; ok is false when there is none.
func assistantText(item *jinja.Dict) (jinja.Value, bool) {
	c, _ := item.Get("content")
	if c.IsString() {
		return c, true
	}
	if !c.IsList() || len(c.AsList().Items) == 0 || !c.AsList().Items[0].IsDict() {
		return jinja.None(), false
	}
	t, ok := c.AsList().Items[0].AsDict().Get("text")
	if !ok || t.IsNone() {
		return jinja.None(), false
	}
	return t, true
}

func none(v jinja.Value) jinja.Value {
	if v.IsUndefined() {
		return jinja.None()
	}
	return v
}

// typeName is how Python prints a missing type: None.
func typeName(typ string) string {
	if typ == "" {
		return "None"
	}
	return typ
}

// firstText is item[key][0].text (None when there is none).
func firstText(d *jinja.Dict, key string) jinja.Value {
	v, ok := d.Get(key)
	if !ok || !v.IsList() || len(v.AsList().Items) == 0 {
		return jinja.None()
	}
	p := v.AsList().Items[0]
	if !p.IsDict() {
		return jinja.None()
	}
	t, ok := p.AsDict().Get("text")
	if !ok || !t.IsString() {
		return jinja.None()
	}
	return t
}

// continueFinal is should_continue_final_message (responses/utils.py): the last input item is
// an assistant message or a reasoning item whose status is in_progress or incomplete.
func continueFinal(in jinja.Value) bool {
	if !in.IsList() || len(in.AsList().Items) == 0 {
		return false
	}
	last := in.AsList().Items[len(in.AsList().Items)-1]
	if !last.IsDict() {
		return false
	}
	d := last.AsDict()
	t, _ := d.Get("type")
	isReasoning := t.IsString() && t.AsString() == "reasoning"
	if !isReasoning && !isRole(last, "assistant") {
		return false
	}
	s, ok := d.Get("status")
	return ok && s.IsString() && (s.AsString() == "in_progress" || s.AsString() == "incomplete")
}
