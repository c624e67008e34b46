package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/tokenize"
)

// goldenModels are the tokenizer folders scripts/fetch-tokenizers.sh fetches into models/.
var goldenModels = []string{"deepseek_v3", "gemma3", "gptoss", "llama3_1", "qwen3"}

// goldenTemplates are the chat templates of folders whose tokenizer_config.json has none, as the
// chat goldens take them (scripts/goldens/gen-chat.py): from the jinja module's test data.
var goldenTemplates = map[string]string{"gptoss": "gpt-oss-20b-Q8_0.jinja"}

// loadGoldenModel loads models/<name>, skipping when it is absent.
func loadGoldenModel(t *testing.T, name string) *tokenize.Tokenizer {
	t.Helper()
	if testing.Short() {
		t.Skip("loads the real tokenizers")
	}
	dir := filepath.Join("..", "..", "models", name)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("model files missing (run scripts/fetch-tokenizers.sh): %v", err)
	}
	opts := tokenize.Options{}
	if file := goldenTemplates[name]; file != "" {
		cache, err := exec.Command("go", "env", "GOMODCACHE").Output()
		if err != nil {
			t.Skipf("go env GOMODCACHE: %v", err)
		}
		b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(cache)), "github.com/ardanlabs/jinja@v1.8.0/testdata/templates", file))
		if err != nil {
			t.Skipf("template %s not in the module cache: %v", file, err)
		}
		opts.ChatTemplate = string(b)
	}
	tk, err := testTokenizers.loadFolder(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// tokenizeAs runs one body through `kvgate tokenize`'s pipeline with --api api.
func tokenizeAs(t *testing.T, tk *tokenize.Tokenizer, api, body string) (tokenizeOutput, error) {
	t.Helper()
	var buf bytes.Buffer
	r := tokenizeRun{tk: tk, blockSize: 16, out: json.NewEncoder(&buf), api: api, parser: apireq.NewParser(apireq.DefaultIdentity())}
	if err := r.one(context.Background(), []byte(body)); err != nil {
		return tokenizeOutput{}, err
	}
	var out tokenizeOutput
	if err := json.Unmarshal(buf.Bytes(), &out); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	return out, nil
}

// A shared function tool, in each API's shape.
const (
	weatherSchema    = `{"type":"object","properties":{"city":{"type":"string","description":"City name"}},"required":["city"]}`
	anthropicWeather = `{"name":"get_weather","description":"Current weather for a city","input_schema":` + weatherSchema + `}`
	chatWeather      = `{"type":"function","function":{"name":"get_weather","description":"Current weather for a city","parameters":` + weatherSchema + `}}`
)

// messagesGoldens: each conversion rule of vLLM's Anthropic entrypoint
// (vllm/entrypoints/anthropic/serving.py, AnthropicServingMessages.to_chat_completion_request),
// as a Messages body and the chat completions body that conversion builds, written out by
// hand. vLLM then renders the chat body like any chat request (add_special_tokens false).
var messagesGoldens = []struct{ name, messages, chat string }{
	{"system blocks joined, billing header skipped",
		`{"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1"},{"type":"text","text":"You are a careful assistant."},{"type":"text","text":" Answer briefly."}],
		  "messages":[{"role":"user","content":"What is 2+2?"}]}`,
		`{"messages":[{"role":"system","content":"You are a careful assistant. Answer briefly."},{"role":"user","content":"What is 2+2?"}]}`},
	{"system string",
		`{"system":"You are terse.","messages":[{"role":"user","content":"Hi"}]}`,
		`{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi"}]}`},
	{"single text part becomes a string",
		`{"messages":[{"role":"user","content":[{"type":"text","text":"Hello there"}]},{"role":"assistant","content":[{"type":"text","text":"Hi!"}]},{"role":"user","content":[{"type":"text","text":"How are you?"}]}]}`,
		`{"messages":[{"role":"user","content":"Hello there"},{"role":"assistant","content":"Hi!"},{"role":"user","content":"How are you?"}]}`},
	{"several text parts stay a list",
		`{"messages":[{"role":"user","content":[{"type":"text","text":"First part."},{"type":"text","text":"Second part."}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"First part."},{"type":"text","text":"Second part."}]}]}`},
	{"tool_use becomes tool_calls with json.dumps arguments",
		`{"tools":[` + anthropicWeather + `],"messages":[{"role":"user","content":"Weather in Paris?"},
		  {"role":"assistant","content":[{"type":"text","text":"Let me check."},{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{"city":"Paris","days":3,"unit":"°C","ratio":0.5}}]},
		  {"role":"user","content":"Thanks"}]}`,
		`{"tools":[` + chatWeather + `],"messages":[{"role":"user","content":"Weather in Paris?"},
		  {"role":"assistant","content":"Let me check.","tool_calls":[{"id":"toolu_01","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\", \"days\": 3, \"unit\": \"\\u00b0C\", \"ratio\": 0.5}"}}]},
		  {"role":"user","content":"Thanks"}]}`},
	{"tool_result becomes a tool message before the turn's remaining content",
		`{"tools":[` + anthropicWeather + `],"messages":[{"role":"user","content":"Weather in Paris?"},
		  {"role":"assistant","content":[{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{"city":"Paris"}}]},
		  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_01","content":[{"type":"text","text":"Sunny"},{"type":"text","text":"22 C"}]},{"type":"text","text":"And tomorrow?"}]}]}`,
		`{"tools":[` + chatWeather + `],"messages":[{"role":"user","content":"Weather in Paris?"},
		  {"role":"assistant","tool_calls":[{"id":"toolu_01","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
		  {"role":"tool","tool_call_id":"toolu_01","content":"Sunny\n22 C"},
		  {"role":"user","content":"And tomorrow?"}]}`},
	{"tool_result alone: only the tool message",
		`{"tools":[` + anthropicWeather + `],"messages":[{"role":"user","content":"Weather in Paris?"},
		  {"role":"assistant","content":[{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{"city":"Paris"}}]},
		  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_01","content":"Sunny"}]}]}`,
		`{"tools":[` + chatWeather + `],"messages":[{"role":"user","content":"Weather in Paris?"},
		  {"role":"assistant","tool_calls":[{"id":"toolu_01","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
		  {"role":"tool","tool_call_id":"toolu_01","content":"Sunny"}]}`},
	{"thinking becomes reasoning",
		`{"tools":[` + anthropicWeather + `],"messages":[{"role":"user","content":"Weather in Paris?"},
		  {"role":"assistant","content":[{"type":"thinking","thinking":"The user wants the weather; call the tool.","signature":"c2ln"},{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{"city":"Paris"}}]},
		  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_01","content":"Sunny"}]}]}`,
		`{"tools":[` + chatWeather + `],"messages":[{"role":"user","content":"Weather in Paris?"},
		  {"role":"assistant","reasoning":"The user wants the weather; call the tool.","tool_calls":[{"id":"toolu_01","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
		  {"role":"tool","tool_call_id":"toolu_01","content":"Sunny"}]}`},
	{"tools: input_schema without type gets type object last",
		`{"tools":[{"name":"list_files","description":"List files","input_schema":{"properties":{"path":{"type":"string"}}}}],"messages":[{"role":"user","content":"ls"}]}`,
		`{"tools":[{"type":"function","function":{"name":"list_files","description":"List files","parameters":{"properties":{"path":{"type":"string"}},"type":"object"}}}],"messages":[{"role":"user","content":"ls"}]}`},
	{"tool_choice any",
		`{"tools":[` + anthropicWeather + `],"tool_choice":{"type":"any"},"messages":[{"role":"user","content":"Weather in Paris?"}]}`,
		`{"tools":[` + chatWeather + `],"tool_choice":"required","messages":[{"role":"user","content":"Weather in Paris?"}]}`},
	{"tool_choice named tool",
		`{"tools":[` + anthropicWeather + `],"tool_choice":{"type":"tool","name":"get_weather"},"messages":[{"role":"user","content":"Weather in Paris?"}]}`,
		`{"tools":[` + chatWeather + `],"tool_choice":{"type":"function","function":{"name":"get_weather"}},"messages":[{"role":"user","content":"Weather in Paris?"}]}`},
	{"tool_choice none keeps the tools in the prompt",
		`{"tools":[` + anthropicWeather + `],"tool_choice":{"type":"none"},"messages":[{"role":"user","content":"Weather in Paris?"}]}`,
		`{"tools":[` + chatWeather + `],"tool_choice":"none","messages":[{"role":"user","content":"Weather in Paris?"}]}`},
}

// sameFailure reports whether either body failed; then both must have failed alike (a template
// that refuses the conversation, e.g. gemma3's "roles must alternate" on a tool message,
// refuses the chat body vLLM builds just the same: a 400 either way).
func sameFailure(t *testing.T, got, want error) bool {
	t.Helper()
	if got == nil && want == nil {
		return false
	}
	if got == nil || want == nil || got.Error() != want.Error() {
		t.Errorf("errors differ: converted body %v, chat body %v", got, want)
	}
	return true
}

// withFields adds top-level fields to a JSON object body.
func withFields(t *testing.T, body, fields string) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("golden body is not JSON: %v\n%s", err, body)
	}
	var extra map[string]json.RawMessage
	if err := json.Unmarshal([]byte(fields), &extra); err != nil {
		t.Fatal(err)
	}
	for k, v := range extra {
		m[k] = v
	}
	// encoding/json sorts the keys: harmless, templates see fields by name, never the body's order.
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestConvertedBodiesMatchChat loads each of the five tokenizers once and checks the Messages
// conversions, the Responses mappings and (qwen3) the Responses tool dump against it.
func TestConvertedBodiesMatchChat(t *testing.T) {
	for _, model := range goldenModels {
		t.Run(model, func(t *testing.T) {
			tk := loadGoldenModel(t, model)
			t.Run("messages", func(t *testing.T) { checkMessagesGoldens(t, tk) })
			if model == "gptoss" {
				t.Run("responses", func(t *testing.T) { checkResponsesHarmony(t, tk) })
				return
			}
			t.Run("responses", func(t *testing.T) { checkResponsesGoldens(t, tk, model) })
			if model == "qwen3" {
				t.Run("responses tools", func(t *testing.T) { checkResponsesToolsDump(t, tk) })
			}
		})
	}
}

// checkMessagesGoldens: every Messages conversion rule gives the token ids of the chat body
// vLLM builds from it.
func checkMessagesGoldens(t *testing.T, tk *tokenize.Tokenizer) {
	rendered := 0
	for _, g := range messagesGoldens {
		t.Run(g.name, func(t *testing.T) {
			got, gerr := tokenizeAs(t, tk, "messages", withFields(t, g.messages, `{"model":"m","max_tokens":16}`))
			want, werr := tokenizeAs(t, tk, "chat", withFields(t, g.chat, `{"model":"m"}`))
			if sameFailure(t, gerr, werr) {
				return
			}
			rendered++
			if !slices.Equal(got.TokenIDs, want.TokenIDs) {
				t.Errorf("token ids differ (%d vs %d)\nmessages prompt: %q\nchat prompt:     %q", len(got.TokenIDs), len(want.TokenIDs), got.Prompt, want.Prompt)
			}
		})
	}
	if rendered < len(messagesGoldens)/2 {
		t.Errorf("only %d of %d cases rendered", rendered, len(messagesGoldens))
	}
}

// responsesGoldens: each mapping rule of vLLM's Responses entrypoint for non-Harmony models
// (vllm/entrypoints/openai/responses/utils.py, construct_input_messages), as a stateless
// Responses body and the chat messages that mapping builds, written out by hand.
var responsesGoldens = []struct{ name, responses, chat string }{
	{"string input with instructions",
		`{"instructions":"You are terse.","input":"What is 2+2?"}`,
		`{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"What is 2+2?"}]}`},
	{"string input without instructions",
		`{"input":"Hello"}`,
		`{"messages":[{"role":"user","content":"Hello"}]}`},
	{"message items: easy messages as they stand, output messages by their first text",
		`{"instructions":"Be kind.","input":[{"role":"user","content":"Hi"},{"type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Hello! How can I help?","annotations":[]}]},{"role":"user","content":"Tell me a joke."}]}`,
		`{"messages":[{"role":"system","content":"Be kind."},{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello! How can I help?"},{"role":"user","content":"Tell me a joke."}]}`},
	{"function_call and function_call_output",
		`{"input":[{"role":"user","content":"Weather in Paris?"},{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},{"type":"function_call_output","call_id":"call_1","output":"Sunny, 22 C"}]}`,
		`{"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","tool_calls":[{"id":"call_1","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"},"type":"function"}]},{"role":"tool","content":"Sunny, 22 C","tool_call_id":"call_1"}]}`},
	{"reasoning item merged into the assistant message",
		`{"input":[{"role":"user","content":"Weather in Paris?"},{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"I should call the weather tool."}]},{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},{"type":"function_call_output","call_id":"call_1","output":"Sunny"}]}`,
		`{"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","reasoning":"I should call the weather tool.","tool_calls":[{"id":"call_1","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"},"type":"function"}]},{"role":"tool","content":"Sunny","tool_call_id":"call_1"}]}`},
	{"reasoning from the summary",
		`{"input":[{"role":"user","content":"Hi"},{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"Greet back."}]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hello!"}]},{"role":"user","content":"Bye"}]}`,
		`{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","reasoning":"Greet back.","content":"Hello!"},{"role":"user","content":"Bye"}]}`},
	{"namespaced function_call flattened, custom_tool_call input wrapped",
		`{"input":[{"role":"user","content":"Patch it"},{"type":"function_call","call_id":"c1","namespace":"fs","name":"read","arguments":"{\"path\":\"a.go\"}"},{"type":"custom_tool_call","call_id":"c2","name":"apply_patch","input":"*** Begin Patch"},{"type":"function_call_output","call_id":"c1","output":"package a"},{"type":"custom_tool_call_output","call_id":"c2","output":"Done"}]}`,
		`{"messages":[{"role":"user","content":"Patch it"},{"role":"assistant","tool_calls":[{"id":"c1","function":{"name":"fs__read","arguments":"{\"path\":\"a.go\"}"},"type":"function"},{"id":"c2","function":{"name":"apply_patch","arguments":"{\"input\": \"*** Begin Patch\"}"},"type":"function"}]},{"role":"tool","content":"package a","tool_call_id":"c1"},{"role":"tool","content":"Done","tool_call_id":"c2"}]}`},
	{"string-content assistant message by its text",
		`{"input":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!","id":"msg_1","status":"completed"},{"role":"user","content":"Bye"}]}`,
		`{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!"},{"role":"user","content":"Bye"}]}`},
}

// checkResponsesGoldens: every Responses mapping rule gives the token ids of the
// chat body vLLM builds from it, tokenized as vLLM's Responses entrypoint does: with
// add_special_tokens true (ResponsesRequest.build_tok_params leaves TokenizeParams' default),
// so a template that writes BOS itself gets a second one from the tokenizer (llama3_1,
// deepseek_v3, gemma3), while qwen3's tokenizer adds none. gpt-oss is left out: vLLM renders its
// Responses with Harmony (checkResponsesHarmony).
func checkResponsesGoldens(t *testing.T, tk *tokenize.Tokenizer, model string) {
	doubleBOS := map[string]bool{"deepseek_v3": true, "gemma3": true, "llama3_1": true, "qwen3": false}
	prefix, err := tk.Encode("", true) // what the post-processor adds: BOS or nothing
	if err != nil {
		t.Fatal(err)
	}
	rendered := 0
	for _, g := range responsesGoldens {
		t.Run(g.name, func(t *testing.T) {
			got, gerr := tokenizeAs(t, tk, "responses", withFields(t, g.responses, `{"model":"m","store":false}`))
			want, werr := tokenizeAs(t, tk, "chat", withFields(t, g.chat, `{"model":"m","add_special_tokens":true}`))
			if sameFailure(t, gerr, werr) {
				return
			}
			rendered++
			if !slices.Equal(got.TokenIDs, want.TokenIDs) {
				t.Errorf("token ids differ (%d vs %d)\nresponses prompt: %q\nchat prompt:      %q", len(got.TokenIDs), len(want.TokenIDs), got.Prompt, want.Prompt)
			}
			plain, err := tokenizeAs(t, tk, "chat", withFields(t, g.chat, `{"model":"m"}`))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.TokenIDs, append(slices.Clone(prefix), plain.TokenIDs...)) {
				t.Errorf("responses ids are not the tokenizer's special prefix %v + the chat ids", prefix)
			}
			double := len(got.TokenIDs) > 1 && len(prefix) == 1 && got.TokenIDs[0] == prefix[0] && got.TokenIDs[1] == prefix[0]
			if double != doubleBOS[model] {
				t.Errorf("double BOS = %v, want %v (ids start %v)", double, doubleBOS[model], got.TokenIDs[:min(3, len(got.TokenIDs))])
			}
		})
	}
	if rendered < len(responsesGoldens)/2 {
		t.Errorf("only %d of %d cases rendered", rendered, len(responsesGoldens))
	}
}

// checkResponsesToolsDump: the tools of a Responses body reach the template as vLLM's
// construct_tool_dicts (responses/utils.py, over tool_parsers/utils.py
// iter_response_function_tool_dicts) builds them: each function tool as
// ChatCompletionToolsParam(function=FunctionDefinition(...)).model_dump() (name, description,
// parameters, then strict), each namespace's function members flattened to
// "namespace__name", built-in tools (web_search, mcp, ...) left out, and tool_choice "none"
// rendering them still. Qwen3's template prints each tool with tojson, so the exact dump is
// visible in the prompt.
func checkResponsesToolsDump(t *testing.T, tk *tokenize.Tokenizer) {
	body := `{"model":"m","store":false,"input":"Weather in Paris?","tools":[{"type":"function","name":"get_weather","description":"Current weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}},` +
		`{"type":"web_search"},{"type":"mcp","server_label":"docs","server_url":"http://127.0.0.1:1"},` +
		`{"type":"namespace","name":"fs","description":"Files","tools":[{"type":"function","name":"read","description":"Read a file","parameters":{"type":"object"},"strict":true}]}]}`
	got, err := tokenizeAs(t, tk, "responses", body)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`{"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": null}}`,
		`{"type": "function", "function": {"name": "fs__read", "description": "Read a file", "parameters": {"type": "object"}, "strict": true}}`,
	} {
		if !strings.Contains(got.Prompt, want) {
			t.Errorf("prompt lacks the tool dump %s:\n%s", want, got.Prompt)
		}
	}
	if strings.Contains(got.Prompt, "web_search") || strings.Contains(got.Prompt, "docs") {
		t.Errorf("built-in tools rendered:\n%s", got.Prompt)
	}
	none, err := tokenizeAs(t, tk, "responses", withFields(t, body, `{"tool_choice":"none"}`))
	if err != nil {
		t.Fatal(err)
	}
	if none.Prompt != got.Prompt {
		t.Errorf("tool_choice none changed the prompt:\n%s", none.Prompt)
	}
	// A text.format and a reasoning effort are read by the same parser the server uses: the
	// format only constrains decoding, the effort reaches the template as reasoning_effort.
	fmtd, err := tokenizeAs(t, tk, "responses", withFields(t, body, `{"text":{"format":{"type":"json_schema","name":"w","schema":{"type":"object"}}},"reasoning":{"effort":"low"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if fmtd.Prompt != got.Prompt {
		t.Errorf("text.format changed the prompt:\n%s", fmtd.Prompt)
	}
	if _, err := tokenizeAs(t, tk, "responses", withFields(t, body, `{"tools":[{"type":"browser"}]}`)); err == nil || !strings.Contains(err.Error(), "tools[0].type") {
		t.Errorf("an unknown tool type: %v, want refused", err)
	}
}

// checkResponsesHarmony: vLLM renders a gpt-oss model's Responses with Harmony, not the chat
// template (responses/serving.py, use_harmony); the gateway does not reproduce it. Such a
// request is routed without block hashes (no 400, no wrong hashes) and `kvgate tokenize`
// refuses it with a clear error, while chat bodies on the same model are still hashed.
func checkResponsesHarmony(t *testing.T, tk *tokenize.Tokenizer) {
	if !tk.Harmony() {
		t.Fatal("the gpt-oss tokenizer is not told as Harmony")
	}
	parser := apireq.NewParser(apireq.DefaultIdentity())
	e := &enricher{tok: tk, blockSize: 16, baseModel: "m"}
	for _, body := range []string{responsesGoldens[0].responses, responsesGoldens[3].responses} {
		in, perr := parser.Parse(apireq.Responses, []byte(withFields(t, body, `{"model":"m","store":false}`)))
		if perr != nil {
			t.Fatal(perr)
		}
		req := &router.Request{Model: "m"}
		if err := e.Enrich(context.Background(), in, req); err != nil {
			t.Fatalf("enrich: %v", err)
		}
		if req.PromptTokens != 0 || req.BlockHashes != nil || req.LocalHashes != nil {
			t.Errorf("a Harmony Responses request got %d prompt tokens and %d block hashes", req.PromptTokens, len(req.BlockHashes))
		}
	}
	if _, err := tokenizeAs(t, tk, "responses", withFields(t, responsesGoldens[0].responses, `{"model":"m"}`)); err == nil || !strings.Contains(err.Error(), "Harmony") {
		t.Errorf("kvgate tokenize of a Harmony Responses body: %v", err)
	}
	in, perr := parser.Parse(apireq.ChatCompletions, []byte(withFields(t, responsesGoldens[0].chat, `{"model":"m"}`)))
	if perr != nil {
		t.Fatal(perr)
	}
	req := &router.Request{Model: "m"}
	if err := e.Enrich(context.Background(), in, req); err != nil || req.PromptTokens == 0 || len(req.LocalHashes) == 0 && req.PromptTokens >= 16 {
		t.Errorf("a chat request on the same model: %d prompt tokens, %d hashes, %v", req.PromptTokens, len(req.LocalHashes), err)
	}
}
