package sim

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tokenize"
)

// "tools": [] on each endpoint as vLLM answers it: chat refuses it with vLLM's message
// (chat_completion/protocol.py, check_tool_usage); Messages and count_tokens render it as
// tools=[] (anthropic/serving.py, _convert_tools); Responses as no tools; completions ignore it.
func TestEmptyToolsPerEndpoint(t *testing.T) {
	dir := modelDir(t)
	tok, err := tokenize.Load(dir, tokenize.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, base := startWorker(t, Options{ServedModelName: "m", Model: dir, Tokenize: tok, TTFT: time.Millisecond, ITL: time.Millisecond})
	cases := []struct {
		path, body string
		want       int
		contains   string
	}{
		{"/v1/chat/completions", `{"model":"m","max_tokens":2,"tools":[],"messages":[{"role":"user","content":"hi"}]}`,
			400, "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely."},
		{"/v1/completions", `{"model":"m","max_tokens":2,"tools":[],"prompt":"hi"}`, 200, `"text_completion"`},
		{"/v1/messages", `{"model":"m","max_tokens":2,"tools":[],"messages":[{"role":"user","content":"hi"}]}`, 200, `"type":"message"`},
		{"/v1/messages", `{"model":"m","max_tokens":2,"stream":true,"tools":[],"messages":[{"role":"user","content":"hi"}]}`, 200, "event: message_stop"},
		{"/v1/messages/count_tokens", `{"model":"m","tools":[],"messages":[{"role":"user","content":"hi"}]}`, 200, `"input_tokens"`},
		{"/v1/responses", `{"model":"m","max_output_tokens":2,"tools":[],"input":"hi"}`, 200, `"object":"response"`},
	}
	for _, tc := range cases {
		code, body := postJSON(t, http.MethodPost, base+tc.path, tc.body)
		if code != tc.want || !strings.Contains(string(body), tc.contains) {
			t.Errorf("%s %s: %d %s", tc.path, tc.body, code, body)
		}
	}
}
