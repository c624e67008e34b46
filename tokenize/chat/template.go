package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/ardanlabs/jinja"
)

// TemplateOptions configures a compiled chat template.
type TemplateOptions struct {
	// Config supplies the special tokens templates see and any named templates.
	Config Config
	// Now is the clock of strftime_now. Nil: time.Now.
	Now func() time.Time
	// DefaultKwargs is a JSON object of chat_template_kwargs applied under every request's own
	// (vLLM's --default-chat-template-kwargs).
	DefaultKwargs json.RawMessage
	// ContentFormat forces "string" or "openai" content (vLLM's --chat-template-content-format);
	// empty auto-detects as vLLM does.
	ContentFormat ContentFormat
	// MessageCacheBytes bounds the cache of preprocessed messages reused across turns of a
	// conversation. 0 takes DefaultMessageCacheBytes; negative disables it.
	MessageCacheBytes int64
}

// DefaultMessageCacheBytes is the default budget of the preprocessed-message cache.
const DefaultMessageCacheBytes = 64 << 20

// compiled is one chat template ready to render.
type compiled struct {
	tmpl   *jinja.Template
	format ContentFormat
	mutate bool // the template may mutate lists/dicts in place
}

// Template renders a model's chat template the way HF transformers does inside vLLM. It is safe
// for concurrent use.
type Template struct {
	main    compiled
	toolUse *compiled // the "tool_use" named template, used for requests with tools
	special map[string]jinja.Value
	deflt   *jinja.Dict // default kwargs, nil when none
	now     func() time.Time
	msgs    *messageCache // nil when disabled
}

// NewTemplate compiles src (and any named tool_use template of the config).
func NewTemplate(src string, o TemplateOptions) (*Template, error) {
	t := &Template{now: o.Now, special: map[string]jinja.Value{}}
	switch {
	case o.MessageCacheBytes == 0:
		t.msgs = newMessageCache(DefaultMessageCacheBytes)
	case o.MessageCacheBytes > 0:
		t.msgs = newMessageCache(o.MessageCacheBytes)
	}
	if t.now == nil {
		t.now = time.Now
	}
	var err error
	if t.main, err = compile(src, o.ContentFormat); err != nil {
		return nil, err
	}
	if tu, ok := o.Config.Named["tool_use"]; ok && tu != src {
		c, err := compile(tu, o.ContentFormat)
		if err != nil {
			return nil, fmt.Errorf("tool_use template: %w", err)
		}
		t.toolUse = &c
	}
	for k, v := range o.Config.Special {
		t.special[k] = jinja.NewString(v)
	}
	if len(o.Config.AdditionalSpecial) > 0 {
		items := make([]jinja.Value, len(o.Config.AdditionalSpecial))
		for i, s := range o.Config.AdditionalSpecial {
			items[i] = jinja.NewString(s)
		}
		t.special["additional_special_tokens"] = jinja.NewList(items)
	}
	if len(o.DefaultKwargs) > 0 {
		v, err := decodeValue(o.DefaultKwargs)
		if err != nil || !v.IsDict() {
			return nil, fmt.Errorf("default chat template kwargs must be a JSON object")
		}
		t.deflt = v.AsDict()
	}
	return t, nil
}

func compile(src string, format ContentFormat) (compiled, error) {
	rewritten, err := rewriteTemplate(src)
	if err == nil {
		rewritten, err = rewriteOps(rewritten)
	}
	if err != nil {
		return compiled{}, fmt.Errorf("prepare chat template: %w", err)
	}
	tmpl, err := jinja.Compile(rewritten)
	if err != nil {
		return compiled{}, fmt.Errorf("compile chat template: %w", err)
	}
	if format == "" {
		format = DetectContentFormat(src)
	}
	return compiled{tmpl: tmpl, format: format, mutate: mayMutate(src)}, nil
}

// ContentFormat reports the content format the main template is rendered with.
func (t *Template) ContentFormat() ContentFormat { return t.main.format }

// renderState collects what a render's callbacks observed.
type renderState struct {
	raised *string // the message of raise_exception, if it was called
}

// Render renders req. Template failures (raise_exception, engine errors, panics inside the
// engine) are *TemplateError; malformed requests are *RequestError.
func (t *Template) Render(req *Request) (out string, err error) {
	if req.AddGenerationPrompt && req.ContinueFinalMessage {
		return "", &RequestError{Message: "Cannot set both `continue_final_message` and `add_generation_prompt` to True."}
	}
	f, err := req.fields()
	if err != nil {
		return "", err
	}
	messages, tools := f.messages, f.tools
	c := t.main
	if !tools.IsNone() && t.toolUse != nil {
		c = *t.toolUse
	}
	var conv []jinja.Value
	if f.rawMessages != nil {
		conv, err = t.msgs.conversationFromRaw(f.rawMessages, c.format, c.mutate)
	} else {
		conv, err = buildConversation(messages, c.format)
	}
	if err != nil {
		return "", err
	}
	data, state, err := t.variables(req, f, conv)
	if err != nil {
		return "", err
	}
	defer func() {
		if r := recover(); r != nil {
			out, err = "", &TemplateError{Message: fmt.Sprintf("chat template failed: %v", r)}
		}
	}()
	text, rerr := c.tmpl.RenderValues(data)
	if rerr != nil {
		if state.raised != nil {
			return "", &TemplateError{Message: *state.raised, Err: rerr}
		}
		return "", &TemplateError{Message: rerr.Error(), Err: rerr}
	}
	if req.ContinueFinalMessage {
		return continueFinal(text, conv)
	}
	return text, nil
}

// fields returns the request's JSON fields decoded, parsing the raw ones when ParseChatBody
// did not already.
func (req *Request) fields() (*decodedFields, error) {
	if req.pre != nil {
		return req.pre, nil
	}
	var f decodedFields
	var err error
	if f.messages, err = decodeField(req.Messages, "messages"); err != nil {
		return nil, err
	}
	if f.tools, err = decodeField(req.Tools, "tools"); err != nil {
		return nil, err
	}
	if f.documents, err = decodeField(req.Documents, "documents"); err != nil {
		return nil, err
	}
	if f.kwargs, err = decodeField(req.ChatTemplateKwargs, "chat_template_kwargs"); err != nil {
		return nil, err
	}
	return &f, nil
}

func decodeField(raw json.RawMessage, name string) (jinja.Value, error) {
	if len(raw) == 0 {
		return jinja.None(), nil
	}
	v, err := decodeValue(raw)
	if err != nil {
		return jinja.Undefined(), &RequestError{Message: fmt.Sprintf("'%s' is not valid JSON", name), Param: name, Err: err}
	}
	return v, nil
}

// variables builds the template's global scope as HF's apply_chat_template does inside vLLM:
// special tokens, then chat_template_kwargs (defaults, then the request's), then messages,
// tools, documents and add_generation_prompt, plus raise_exception, strftime_now and the tojson
// replacement.
func (t *Template) variables(req *Request, f *decodedFields, conv []jinja.Value) (map[string]jinja.Value, *renderState, error) {
	tools := f.tools
	data := make(map[string]jinja.Value, len(t.special)+12)
	for k, v := range t.special {
		data[k] = v
	}
	if t.deflt != nil {
		for _, k := range t.deflt.Keys {
			data[k] = t.deflt.Data[k]
		}
	}
	kw := f.kwargs
	switch {
	case kw.IsDict():
		d := kw.AsDict()
		for _, k := range d.Keys {
			if k == "chat_template" || k == "tokenize" {
				return nil, nil, &RequestError{Message: fmt.Sprintf("Found unexpected chat template kwargs from request: {'%s'}", k), Param: "chat_template_kwargs"}
			}
			v := d.Data[k]
			if t.deflt != nil && (v.IsNone() || (v.IsString() && v.AsString() == "auto")) {
				continue // vLLM's merge keeps the server default for unset request values
			}
			data[k] = v
		}
	case !kw.IsNone():
		return nil, nil, &RequestError{Message: "'chat_template_kwargs' must be an object", Param: "chat_template_kwargs"}
	}
	if req.ReasoningEffort != "" {
		data["reasoning_effort"] = jinja.NewString(req.ReasoningEffort)
		if !kw.IsDict() || !kw.AsDict().Has("enable_thinking") {
			data["enable_thinking"] = jinja.NewBool(req.ReasoningEffort != "none")
		}
	}
	docs := f.documents
	data["messages"] = jinja.NewList(conv)
	switch {
	case tools.IsNone():
		data["tools"] = jinja.None()
	case f.toolsAsIs:
		data["tools"] = tools
	default:
		dumped, err := dumpTools(tools)
		if err != nil {
			return nil, nil, err
		}
		data["tools"] = dumped
	}
	data["documents"] = docs
	data["add_generation_prompt"] = jinja.NewBool(req.AddGenerationPrompt)
	st := &renderState{}
	data["raise_exception"] = jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		msg := ""
		if len(args) > 0 {
			msg = pyStr(args[0])
		}
		st.raised = &msg
		return jinja.Undefined(), errors.New(msg)
	})
	now := t.now()
	data["strftime_now"] = jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 || !args[0].IsString() {
			return jinja.Undefined(), errors.New("strftime_now() needs a format string")
		}
		return jinja.NewString(strftime(now, args[0].AsString())), nil
	})
	data[tojsonFunc] = jinja.NewCallable("tojson", hfTojson)
	data[addFunc] = jinja.NewCallable("add", pyAdd)
	data[concatFunc] = jinja.NewCallable("concat", pyConcat)
	data[strFunc] = jinja.NewCallable("str", pyStrCall)
	return data, st, nil
}

// dumpTools reproduces pydantic's ChatCompletionToolsParam.model_dump() in vLLM: each tool
// becomes {"type", "function": {"name", "description", "parameters"[, "strict"][,
// "defer_loading"]}[, "defer_loading"]}, description and parameters null when absent, other
// keys dropped.
func dumpTools(tools jinja.Value) (jinja.Value, error) {
	if !tools.IsList() {
		return jinja.Undefined(), &RequestError{Message: "'tools' must be an array", Param: "tools"}
	}
	// An empty list reaches the template as an empty list, not None, as on vLLM's Anthropic
	// path (serving.py, _convert_tools assigns req.tools = []); the chat endpoint's own refusal
	// of "tools": [] is a request check (apireq), not a template one.
	items := tools.AsList().Items
	out := make([]jinja.Value, len(items))
	for i, tv := range items {
		param := fmt.Sprintf("tools[%d]", i)
		if !tv.IsDict() {
			return jinja.Undefined(), &RequestError{Message: "each tool must be an object", Param: param}
		}
		td := tv.AsDict()
		fv, ok := td.Get("function")
		if !ok || !fv.IsDict() {
			return jinja.Undefined(), &RequestError{Message: "each tool needs a 'function' object", Param: param + ".function"}
		}
		fd := fv.AsDict()
		name, ok := fd.Get("name")
		if !ok || !name.IsString() {
			return jinja.Undefined(), &RequestError{Message: "tool function 'name' must be a string", Param: param + ".function.name"}
		}
		typ, ok := td.Get("type")
		if !ok {
			typ = jinja.NewString("function")
		}
		if !typ.IsString() || typ.AsString() != "function" {
			return jinja.Undefined(), &RequestError{Message: "tool 'type' must be \"function\"", Param: param + ".type"}
		}
		fn := jinja.NewDict()
		f := fn.AsDict()
		f.Set("name", name)
		for _, k := range []string{"description", "parameters"} {
			v, ok := fd.Get(k)
			if !ok {
				v = jinja.None()
			}
			f.Set(k, v)
		}
		for _, k := range []string{"strict", "defer_loading"} {
			if v, ok := fd.Get(k); ok && !v.IsNone() {
				f.Set(k, v)
			}
		}
		dumped := jinja.NewDict()
		dumped.AsDict().Set("type", typ)
		dumped.AsDict().Set("function", fn)
		if v, ok := td.Get("defer_loading"); ok && !v.IsNone() {
			dumped.AsDict().Set("defer_loading", v)
		}
		out[i] = dumped
	}
	return jinja.NewList(out), nil
}

// hfTojson is HF's tojson filter: json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False), arguments positional or by keyword.
func hfTojson(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("tojson() missing its value")
	}
	names := []string{"ensure_ascii", "indent", "separators", "sort_keys"}
	opt := map[string]jinja.Value{}
	for i, a := range args[1:] {
		if i < len(names) {
			opt[names[i]] = a
		}
	}
	for k, v := range kwargs {
		opt[k] = v
	}
	o := jsonOptions{itemSep: ", ", keySep: ": "}
	if v, ok := opt["ensure_ascii"]; ok {
		o.ensureASCII = v.IsTruthy()
	}
	if v, ok := opt["indent"]; ok && !v.IsNone() && !v.IsUndefined() {
		o.hasIndent = true
		o.itemSep = ","
		switch {
		case v.IsInt():
			o.indent = strings.Repeat(" ", max(0, int(v.AsInt())))
		case v.IsString():
			o.indent = v.AsString()
		default:
			return jinja.Undefined(), errors.New("tojson: indent must be an integer or a string")
		}
	}
	if v, ok := opt["separators"]; ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Items[0].IsString() || !v.AsList().Items[1].IsString() {
			return jinja.Undefined(), errors.New("tojson: separators must be a pair of strings")
		}
		o.itemSep, o.keySep = v.AsList().Items[0].AsString(), v.AsList().Items[1].AsString()
	}
	if v, ok := opt["sort_keys"]; ok {
		o.sortKeys = v.IsTruthy()
	}
	var b strings.Builder
	if err := pyJSON(&b, args[0], &o, 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(b.String()), nil
}

// pyStr is Python's str() of a template value, for messages.
func pyStr(v jinja.Value) string {
	if v.IsString() {
		return v.AsString()
	}
	return v.String()
}

// continueFinal cuts the rendered prompt right after the final message's text, as HF
// transformers does for continue_final_message, so generation continues that message.
func continueFinal(text string, conv []jinja.Value) (string, error) {
	if len(conv) == 0 {
		return "", &RequestError{Message: "continue_final_message is set but there is no message to continue"}
	}
	c, _ := conv[len(conv)-1].AsDict().Get("content")
	final := ""
	switch {
	case c.IsString():
		final = c.AsString()
	case c.IsList():
		found := false
		items := c.AsList().Items
		for i := len(items) - 1; i >= 0; i-- {
			if items[i].IsDict() {
				if tv, ok := items[i].AsDict().Get("text"); ok && tv.IsString() {
					final, found = tv.AsString(), true
					break
				}
			}
		}
		if !found {
			return "", &RequestError{Message: "continue_final_message is set but we could not find any text to continue in the final message!"}
		}
	}
	stripped := strings.TrimFunc(final, isPySpace)
	if !strings.Contains(text, stripped) {
		return "", &RequestError{Message: "continue_final_message is set but the final message does not appear in the chat after applying the chat template! This can happen if the chat template deletes portions of the final message. Please verify the chat template and final message in your chat to ensure they are compatible."}
	}
	loc := strings.LastIndex(text, stripped)
	lstripped := strings.TrimLeftFunc(final, isPySpace)
	if end := loc + len(lstripped); end <= len(text) && text[loc:end] == final {
		return text[:end], nil // the template kept the message's spacing
	}
	return text[:loc+len(stripped)], nil
}

// isPySpace reports whether Python's str.isspace() holds for r.
func isPySpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
}
