package apireq

import (
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/kvgate/kvgate/tokenize/chat"
)

// responsesToolTypes are the tool types of the OpenAI SDK's Responses Tool union, which
// vLLM's ResponsesRequest.tools validates against (openai/types/responses/tool.py); any other
// type is refused before the request is rendered.
var responsesToolTypes = []string{"function", "file_search", "computer", "computer_use_preview", "web_search",
	"web_search_2025_08_26", "mcp", "code_interpreter", "image_generation", "local_shell", "shell", "custom",
	"namespace", "tool_search", "web_search_preview", "web_search_preview_2025_03_11", "apply_patch"}

// namespaceSeparator joins a namespace and a member tool's name into the one function name
// the template sees (vllm/tool_parsers/utils.py, flat_namespace_tool_name).
const namespaceSeparator = "__"

func flatToolName(namespace, name string) string { return namespace + namespaceSeparator + name }

// responsesTools is construct_tool_dicts (responses/utils.py) over
// iter_response_function_tool_dicts (vllm/tool_parsers/utils.py): only function tools reach
// the template, each namespace's function members flattened to "namespace__name"; the other
// tool types (web_search, mcp, file_search, code_interpreter, custom, ...) are accepted and
// not rendered. No tools renders none; tool_choice "none" still renders them (vLLM's
// --exclude-tools-when-tool-choice-none is off by default, as on the chat path). Each tool is
// ChatCompletionToolsParam(function=FunctionDefinition(...)).model_dump(): {"type":"function",
// "function":{name, description, parameters, then the tool's other fields (strict, ...)}}.
// check_tool_usage's refusals apply: tool_choice required or a named function needs tools,
// and a named function must be among them.
func responsesTools(d *chat.Document) (jinja.Value, error) {
	tv, _ := d.Get("tools")
	choice, _ := d.Get("tool_choice")
	hasTools := tv.IsList() && len(tv.AsList().Items) > 0
	if !hasTools {
		if choice.IsDict() || (choice.IsString() && choice.AsString() == "required") {
			return jinja.None(), reqErr("tool_choice", "tool_choice requires tools to be provided")
		}
		return jinja.None(), nil
	}
	out := []jinja.Value{}
	names := map[string]bool{}
	add := func(fn *jinja.Dict, name string) {
		names[name] = true
		out = append(out, dict("type", jinja.NewString("function"), "function", functionDefinition(fn, name)))
	}
	for i, t := range tv.AsList().Items {
		param := fmt.Sprintf("tools[%d]", i)
		if !t.IsDict() {
			return jinja.None(), reqErr(param, "%s: Input should be a valid dictionary or object", param)
		}
		td := t.AsDict()
		typ, ok := str1(td, "type")
		if !ok || !typ.IsString() {
			return jinja.None(), reqErr(param+".type", "%s.type: Field required", param)
		}
		switch typ.AsString() {
		case "function":
			name, err := toolName(td, param)
			if err != nil {
				return jinja.None(), err
			}
			add(td, name)
		case "namespace":
			ns, err := toolName(td, param)
			if err != nil {
				return jinja.None(), err
			}
			members, _ := td.Get("tools")
			if !members.IsList() {
				return jinja.None(), reqErr(param+".tools", "%s.tools: Input should be a valid list", param)
			}
			for j, m := range members.AsList().Items {
				mp := fmt.Sprintf("%s.tools[%d]", param, j)
				if !m.IsDict() {
					return jinja.None(), reqErr(mp, "%s: Input should be a valid dictionary or object", mp)
				}
				if !isType(m.AsDict(), "function") {
					continue
				}
				name, err := toolName(m.AsDict(), mp)
				if err != nil {
					return jinja.None(), err
				}
				add(m.AsDict(), flatToolName(ns, name))
				// A named tool_choice may name a member by its own name too
				// (tool_parsers/utils.py, get_json_schema_from_tools).
				names[name] = true
			}
		default:
			if !knownToolType(typ.AsString()) {
				return jinja.None(), reqErr(param+".type", "%s.type: Input should be %s (got '%s')", param, quotedTypes(), typ.AsString())
			}
		}
	}
	if choice.IsDict() && isType(choice.AsDict(), "function") {
		if n, ok := choice.AsDict().Get("name"); ok && n.IsString() && !names[n.AsString()] {
			return jinja.None(), reqErr("tool_choice", "tool_choice names %q, which is not in tools", n.AsString())
		}
	}
	return jinja.NewList(out), nil
}

// toolName is a tool's name, which must be a string.
func toolName(td *jinja.Dict, param string) (string, error) {
	n, _ := str1(td, "name")
	if !n.IsString() {
		return "", reqErr(param+".name", "%s.name: Input should be a valid string", param)
	}
	return n.AsString(), nil
}

// functionDefinition is FunctionDefinition.model_validate of a function tool's dump without
// its type, dumped again: the declared fields first (name, description, parameters; None
// kept), then the tool's other fields in its own dump order (strict, then any extra field the
// client sent).
func functionDefinition(td *jinja.Dict, name string) jinja.Value {
	desc, _ := str1(td, "description")
	params, _ := str1(td, "parameters")
	strict, _ := str1(td, "strict")
	fn := dict("name", jinja.NewString(name), "description", desc, "parameters", params, "strict", strict)
	for _, k := range td.Keys {
		switch k {
		case "type", "name", "description", "parameters", "strict":
			continue
		}
		fn.AsDict().Set(k, td.Data[k])
	}
	return fn
}

func knownToolType(t string) bool {
	for _, k := range responsesToolTypes {
		if k == t {
			return true
		}
	}
	return false
}

// quotedTypes lists the accepted tool types as pydantic's literal error does:
// 'a', 'b' or 'c'.
func quotedTypes() string {
	q := make([]string, len(responsesToolTypes))
	for i, t := range responsesToolTypes {
		q[i] = "'" + t + "'"
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}
