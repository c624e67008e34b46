package apireq

import (
	"fmt"
	"strconv"

	"github.com/ardanlabs/jinja"

	"github.com/kvgate/kvgate/tokenize/chat"
)

// kind is the JSON shape a field must have. JSON null is accepted for every field (it means
// absent), as it is for OpenAI clients.
type kind int

const (
	kAny kind = iota
	kString
	kInt
	kFloat
	kBool
	kObject   // any object; fields, when set, are checked inside it
	kArray    // any array
	kStop     // a string or an array of strings
	kMessages // an array of message objects
	kNumbers  // an object whose values are numbers (logit_bias)
)

// rule is one field's expected shape; goType is the type named in the error message (the
// message the gateway has always answered with: "expected int, got JSON string").
type rule struct {
	kind   kind
	goType string
	fields map[string]rule
}

// schema lists the fields of one endpoint's body whose types the gateway checks before
// routing; other fields are forwarded unchecked (the worker validates them).
type schema struct {
	fields map[string]rule
}

var (
	str     = rule{kind: kString, goType: "string"}
	integer = rule{kind: kInt, goType: "int"}
	float   = rule{kind: kFloat, goType: "float32"}
	boolean = rule{kind: kBool, goType: "bool"}
	object  = rule{kind: kObject, goType: "map[string]interface {}"}
)

// common are the fields both OpenAI endpoints share, plus vLLM's extras the gateway reads.
func common() map[string]rule {
	return map[string]rule{
		"model":             str,
		"max_tokens":        integer,
		"temperature":       float,
		"top_p":             float,
		"n":                 integer,
		"stream":            boolean,
		"stop":              {kind: kStop},
		"presence_penalty":  float,
		"frequency_penalty": float,
		"seed":              integer,
		"logit_bias":        {kind: kNumbers, goType: "map[string]float64"},
		"user":              str,
		"store":             boolean,
		"metadata":          object,
		"stream_options": {kind: kObject, goType: "StreamOptions", fields: map[string]rule{
			"include_usage":          boolean,
			"continuous_usage_stats": boolean,
		}},
		"nvext": {kind: kObject, goType: "NVExt", fields: map[string]rule{
			"session_control": {kind: kObject, goType: "SessionControl", fields: map[string]rule{
				"session_id":        str,
				"parent_session_id": str,
				"action":            str,
			}},
		}},
		"session_id":         str,
		"add_special_tokens": boolean,
		"ignore_eos":         boolean,
		"vllm_xargs":         object,
	}
}

func newSchema(extra map[string]rule) *schema {
	f := common()
	for k, r := range extra {
		f[k] = r
	}
	return &schema{fields: f}
}

// Read-only after init: the fields of each endpoint's body.
var (
	chatSchema = newSchema(map[string]rule{
		"messages":               {kind: kMessages, goType: "[]openai.ChatCompletionMessage"},
		"max_completion_tokens":  integer,
		"response_format":        {kind: kObject, goType: "openai.ChatCompletionResponseFormat"},
		"logprobs":               boolean,
		"top_logprobs":           integer,
		"functions":              {kind: kArray, goType: "[]openai.FunctionDefinition"},
		"tools":                  {kind: kArray, goType: "[]openai.Tool"},
		"reasoning_effort":       str,
		"prediction":             {kind: kObject, goType: "openai.Prediction"},
		"chat_template_kwargs":   object,
		"service_tier":           {kind: kString, goType: "openai.ServiceTier"},
		"verbosity":              str,
		"safety_identifier":      str,
		"add_generation_prompt":  boolean,
		"continue_final_message": boolean,
		"chat_template":          str,
	})
	completionSchema = newSchema(map[string]rule{
		"prompt":   {kind: kAny},
		"best_of":  integer,
		"echo":     boolean,
		"logprobs": integer,
		"suffix":   str,
	})
)

// check verifies the type of every known top-level field, in the client's key order, and
// reports the first mismatch.
func (s *schema) check(d *chat.Document) *Error {
	for _, k := range d.Keys() {
		r, ok := s.fields[k]
		if !ok {
			continue
		}
		if r.kind == kMessages {
			if e := checkMessages(d, k); e != nil {
				return e
			}
			continue
		}
		v, _ := d.Path(k)
		if e := r.check(k, v); e != nil {
			return e
		}
	}
	return nil
}

func (r rule) check(path string, v jinja.Value) *Error {
	if v.IsNone() {
		return nil
	}
	ok := true
	switch r.kind {
	case kString:
		ok = v.IsString()
	case kInt:
		ok = v.IsInt()
	case kFloat:
		ok = v.IsNumber()
	case kBool:
		ok = v.IsBool()
	case kArray:
		ok = v.IsList()
	case kStop:
		if v.IsString() {
			return nil
		}
		if v.IsList() {
			for _, it := range v.AsList().Items {
				if !it.IsString() {
					return badRequest("", "invalid request: stop: expected a string or an array of strings")
				}
			}
			return nil
		}
		return badRequest("", "invalid request: stop: expected a string or an array of strings")
	case kNumbers:
		if !v.IsDict() {
			ok = false
			break
		}
		d := v.AsDict()
		for _, k := range d.Keys {
			if x := d.Data[k]; !x.IsNone() && !x.IsNumber() {
				return typeError(path+"."+k, "float64", x)
			}
		}
	case kObject:
		if !v.IsDict() {
			ok = false
			break
		}
		d := v.AsDict()
		for _, k := range d.Keys {
			if sub, known := r.fields[k]; known {
				if e := sub.check(path+"."+k, d.Data[k]); e != nil {
					return e
				}
			}
		}
	}
	if !ok {
		return typeError(path, r.goType, v)
	}
	return nil
}

// checkMessages requires an array of objects; the messages' own fields are checked where they
// are rendered (the chat template path) and by the worker.
func checkMessages(d *chat.Document, key string) *Error {
	v, _ := d.Path(key)
	if v.IsNone() {
		return nil
	}
	n, isList := d.Messages()
	if !isList {
		return typeError(key, "[]openai.ChatCompletionMessage", v)
	}
	for i := range n {
		raw := d.RawMessage(i)
		if len(raw) == 0 || raw[0] == 'n' {
			continue // null: an empty message, as encoding/json decodes it
		}
		if raw[0] != '{' {
			return badRequest(key, fmt.Sprintf("invalid type for %s[%d]: expected a message object, got JSON %s", key, i, rawKind(raw[0])))
		}
		var bad *Error
		err := chat.EachField(raw, func(k, v []byte) error {
			want, ok := messageFields[string(k)]
			if !ok || v[0] == 'n' {
				return nil
			}
			for _, c := range []byte(want.first) {
				if v[0] == c {
					return nil
				}
			}
			path := key + "." + string(k)
			bad = badRequest(path, fmt.Sprintf("invalid type for %s: expected %s, got JSON %s", path, want.goType, rawKind(v[0])))
			return bad
		})
		if bad != nil {
			return bad
		}
		if err != nil {
			return badRequest(key, fmt.Sprintf("invalid %s[%d]: %v", key, i, err))
		}
	}
	return nil
}

// messageFields are the message fields whose JSON kind is checked (by the first byte of the
// value), with the type named in the error: the fields of go-openai's ChatCompletionMessage the
// gateway used to decode messages into.
var messageFields = map[string]struct{ first, goType string }{
	"role":              {`"`, "string"},
	"name":              {`"`, "string"},
	"tool_call_id":      {`"`, "string"},
	"reasoning_content": {`"`, "string"},
	"refusal":           {`"`, "string"},
	"content":           {`"[`, "[]openai.ChatMessagePart"},
	"tool_calls":        {`[`, "[]openai.ToolCall"},
	"function_call":     {`{`, "openai.FunctionCall"},
}

func typeError(path, goType string, v jinja.Value) *Error {
	return badRequest(path, fmt.Sprintf("invalid type for %s: expected %s, got JSON %s", path, goType, jsonKind(v)))
}

// jsonKind names a value as encoding/json's UnmarshalTypeError does.
func jsonKind(v jinja.Value) string {
	switch {
	case v.IsString():
		return "string"
	case v.IsBool():
		return "bool"
	case v.IsList():
		return "array"
	case v.IsDict():
		return "object"
	case v.IsInt():
		return "number"
	case v.IsFloat():
		return "number " + strconv.FormatFloat(v.AsFloat(), 'g', -1, 64)
	}
	return "value"
}

func rawKind(c byte) string {
	switch c {
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	case '[':
		return "array"
	case '{':
		return "object"
	}
	return "number"
}
