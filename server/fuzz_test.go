package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvgate/kvgate/apireq"
)

// FuzzParseRequest feeds arbitrary bodies to the request parser: it must never panic, and a
// body it accepts must satisfy the invariants the proxy relies on.
func FuzzParseRequest(f *testing.F) {
	seeds := []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:x"}}]}],"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":false}}`,
		`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"cache_salt":"abc","nvext":{"session_control":{"session_id":"s","action":"close"}},"stop":"\n","logit_bias":{"5":-1.5},"metadata":{"k":1}}`,
		`{"model":"m","prompt":"Once","max_tokens":5,"logprobs":null,"stop":["a","b"]}`,
		`{"model":"m","prompt":[1,2,3],"stream":true}`,
		`{"model":"m","prompt":["a","b"],"echo":true}`,
		`{"model":"m","messages":[]}`,
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":"ten"}`,
		`[]`, `{`, ``, `null`, `{"prompt":{}}`,
	}
	// Real chat request bodies from the tokenizer golden data (testdata/chat/*.jsonl lines
	// carry {"request": {...}}), a few per file.
	files, _ := filepath.Glob("../testdata/chat/*.jsonl")
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		n := 0
		for _, line := range bytes.Split(data, []byte("\n")) {
			var rec struct {
				Request json.RawMessage `json:"request"`
			}
			if json.Unmarshal(line, &rec) == nil && len(rec.Request) > 0 && n < 8 {
				seeds = append(seeds, string(rec.Request))
				n++
			}
		}
	}
	for _, s := range seeds {
		f.Add(s, true)
		f.Add(s, false)
	}
	p := apireq.NewParser(apireq.DefaultIdentity())
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		endpoint := pathCompletions
		if chat {
			endpoint = pathChat
		}
		in, e := parseRequest(p, endpoint, []byte(body))
		if e != nil {
			if e.Status != 400 || e.Message == "" {
				t.Fatalf("bad error %+v", e)
			}
			if _, err := json.Marshal(e.body()); err != nil {
				t.Fatal(err)
			}
			return
		}
		if string(in.Body) != body {
			t.Fatal("body altered")
		}
		if !json.Valid([]byte(body)) {
			t.Fatal("invalid JSON accepted")
		}
		if chat && in.Messages() == 0 {
			t.Fatal("chat accepted without messages")
		}
		if !chat {
			var probe struct{ Prompt any }
			if json.Unmarshal([]byte(body), &probe) != nil || probe.Prompt == nil {
				t.Fatal("completion accepted without prompt")
			}
		}
		if in.StreamOptions != nil && !in.Stream {
			t.Fatal("stream_options accepted without stream")
		}
		if e := p.Identify(in, http.Header{}); e != nil && (e.Status != 400 || e.Message == "") {
			t.Fatalf("bad identity error %+v", e)
		}
		// The template and prompt views come from the same parse and never panic either.
		_, _ = in.TemplateInput()
		_, _ = in.Prompts()
	})
}
