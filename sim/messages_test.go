package sim

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/tokenize"
)

// messagesBodies are Messages requests with tools, tool_result history, thinking, system
// blocks, inline system messages and images in tool results.
var messagesBodies = []string{
	`{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"Hello"}]}`,
	`{"model":"m","max_tokens":256,
 "system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.1; cch=ab12;"},{"type":"text","text":"You are a coding agent.","cache_control":{"type":"ephemeral"}},{"type":"text","text":"Be terse."}],
 "tools":[{"name":"read_file","description":"Read a file","input_schema":{"properties":{"path":{"type":"string"},"limit":{"type":"integer"}},"required":["path"]}},
          {"name":"bash","input_schema":{"type":"object","properties":{"cmd":{"type":"string"}}}}],
 "messages":[
  {"role":"user","content":"Show me /etc/hostname"},
  {"role":"assistant","content":[{"type":"thinking","thinking":"I should read it.","signature":"sig"},{"type":"text","text":"Reading."},
     {"type":"tool_use","id":"toolu_01","name":"read_file","input":{"path":"/etc/hostname","limit":10,"é":true}}]},
  {"role":"user","content":[{"type":"text","text":"(note first)"},
     {"type":"tool_result","tool_use_id":"toolu_01","content":[{"type":"text","text":"box-1"},{"type":"text","text":"ok"}]},
     {"type":"text","text":"Now summarize.","cache_control":{"type":"ephemeral"}}]}]}`,
	`{"model":"m","max_tokens":64,"system":"Top.","tool_choice":{"type":"any"},
 "tools":[{"name":"bash","input_schema":{"type":"object","properties":{}}}],
 "messages":[{"role":"user","content":"go"},
  {"role":"assistant","content":[{"type":"redacted_thinking","data":"xx"}]},
  {"role":"system","content":"Inline reminder."},
  {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"bash","input":{"cmd":"ls -la","flags":[1,2.5,null]}},
     {"type":"tool_use","id":"t2","name":"bash","input":{}},
     {"type":"tool_result","tool_use_id":"zz","content":[{"type":"text","text":"it's \"x\"","cache_control":{"type":"ephemeral"}}]}]},
  {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"a\nb"},{"type":"tool_result","tool_use_id":"t2","content":"plain","is_error":true}]},
  {"role":"system","content":[{"type":"text","text":"x-anthropic-billing-header: q"},{"type":"text","text":"Second."}]},
  {"role":"user","content":[{"type":"text","text":"and?"}]}]}`,
	// Claude Code's session-title request: "tools": [] renders tools=[] (not None).
	`{"model":"m","max_tokens":32,"tools":[],"system":[{"type":"text","text":"Generate a title."}],"messages":[{"role":"user","content":"fix the bug"}]}`,
	`{"model":"m","max_tokens":8,"output_config":{"effort":"high"},"chat_template_kwargs":{"enable_thinking":false},
 "messages":[{"role":"user","content":""},{"role":"assistant","content":[{"type":"thinking","thinking":""},{"type":"text","text":"only"}]},{"role":"user","content":"again"}]}`,
}

// The gateway's conversion (apireq) and the simulator's own (toChat) render the same token
// ids for every body: two independent implementations of vLLM's Anthropic entrypoint.
func TestMessagesTokensMatchGateway(t *testing.T) {
	tok, err := tokenize.Load(modelDir(t), tokenize.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, preserve := range []bool{false, true} {
		p := apireq.NewParser(apireq.DefaultIdentity())
		if preserve {
			_ = p.SetInlineSystem(apireq.InlineSystemPreserve)
		}
		for i, body := range messagesBodies {
			for _, ep := range []apireq.Endpoint{apireq.Messages, apireq.MessagesCountTokens} {
				in, e := p.Parse(ep, []byte(body))
				if e != nil {
					t.Fatalf("body %d: %v", i, e)
				}
				ti, err := in.TemplateInput()
				if err != nil {
					t.Fatal(err)
				}
				gw, err := tok.TokenizeInput(ctx, tokenize.Input{Chat: ti}, 0)
				if err != nil {
					t.Fatalf("body %d: gateway: %v", i, err)
				}
				var b anthBody
				if err := jsonUnmarshal(body, &b); err != nil {
					t.Fatal(err)
				}
				chat, err := toChat(&b, ep == apireq.MessagesCountTokens, preserve)
				if err != nil {
					t.Fatal(err)
				}
				sp, err := tok.TokenizeChat(ctx, chat)
				if err != nil {
					t.Fatalf("body %d: sim: %v", i, err)
				}
				if !slices.Equal(gw.TokenIDs, sp.TokenIDs) {
					gt, _ := tok.Decode(gw.TokenIDs, false)
					st, _ := tok.Decode(sp.TokenIDs, false)
					t.Errorf("body %d %s preserve=%v: gateway and simulator differ\ngateway: %q\nsim:     %q", i, ep, preserve, gt, st)
				}
			}
		}
	}
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }
