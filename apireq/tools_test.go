package apireq

import (
	"net/http"
	"testing"

	"github.com/kvgate/kvgate/tokenize/chat"
)

// "tools": [] is what each vLLM entrypoint makes of it: chat refuses it (chat_completion/
// protocol.py, check_tool_usage, as OpenAI does); Messages and count_tokens render the empty
// list as tools=[] (anthropic/serving.py, _convert_tools assigns it after validation);
// Responses renders no tools (responses/utils.py, construct_tool_dicts); completions has no
// tools and ignores the field. Interactive Claude Code sends it on its title and /context
// requests, so a refusal on the Messages side broke them.
func TestEmptyToolsPerEndpoint(t *testing.T) {
	tmpl, err := chat.NewTemplate(`{% if tools is none %}none{% else %}list of {{ tools|length }}{% endif %}|{{ messages|length }}`, chat.TemplateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := NewParser(DefaultIdentity())
	cases := []struct {
		ep         Endpoint
		body       string
		wantErr    string // the 400's message; "" = accepted
		wantRender string // "" = no template input (completions)
	}{
		{ChatCompletions, `{"model":"m","tools":[],"messages":[{"role":"user","content":"hi"}]}`,
			"`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.", ""},
		{Completions, `{"model":"m","tools":[],"prompt":"hi"}`, "", ""},
		{Messages, `{"model":"m","max_tokens":4,"tools":[],"messages":[{"role":"user","content":"hi"}]}`, "", "list of 0|1"},
		{MessagesCountTokens, `{"model":"m","tools":[],"messages":[{"role":"user","content":"hi"}]}`, "", "list of 0|1"},
		{Responses, `{"model":"m","tools":[],"input":"hi"}`, "", "none|1"},
	}
	for _, tc := range cases {
		t.Run(string(tc.ep), func(t *testing.T) {
			r, e := p.Parse(tc.ep, []byte(tc.body))
			if tc.wantErr != "" {
				if e == nil || e.Status != http.StatusBadRequest || e.Message != tc.wantErr || e.Param != "tools" {
					t.Fatalf("got %+v, want 400 %q", e, tc.wantErr)
				}
				return
			}
			if e != nil {
				t.Fatalf("refused: %v", e)
			}
			if tc.wantRender == "" {
				return
			}
			in, err := r.TemplateInput()
			if err != nil {
				t.Fatal(err)
			}
			out, err := tmpl.Render(in)
			if err != nil || out != tc.wantRender {
				t.Fatalf("rendered %q (%v), want %q", out, err, tc.wantRender)
			}
		})
	}
}
