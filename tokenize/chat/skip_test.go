package chat

import (
	"encoding/json"
	"strings"
	"testing"
)

// The elements of "messages" are kept as raw spans, not decoded, yet a malformed one fails the
// parse as encoding/json would fail it: the body is validated whole in its one pass.
func TestRawMessagesValidated(t *testing.T) {
	msgs := []string{
		`{"role":"user","content":"ok"}`,
		`{"role":"user","content":"a\u00e9\n\"q\"\\/"}`,
		`{"n":[-0,1.5e+3,2E-2,0.0,true,false,null,{}]}`,
		`{"role":"user","content":"x\q"}`,
		`{"role":"user","content":"x` + "\x01" + `"}`,
		`{"role":"user","content":"\u12G4"}`,
		`{"role":"user","content":"\u12"}`,
		`{"n":01}`, `{"n":1.}`, `{"n":-}`, `{"n":1e}`, `{"n":+1}`, `{"n":.5}`,
		`{"n":tru}`, `{"n":nul}`, `{"n":True}`,
		`{"role":"user",}`, `{"role" "user"}`, `{role:"user"}`, `{"a":1 "b":2}`,
		`[1,]`, `[1 2]`, `{"a":[}`, `{"a":"}`,
		strings.Repeat("[", 600) + strings.Repeat("]", 600),
	}
	for _, m := range msgs {
		body := `{"messages":[` + m + `],"model":"m"}`
		_, err := ParseDocument([]byte(body))
		valid := json.Valid([]byte(body)) && !strings.HasPrefix(m, "[[[[")
		if valid != (err == nil) {
			t.Errorf("%.60s: json.Valid %v, parse error %v", m, valid, err)
		}
		if _, err := ParseChatBody([]byte(body)); valid != (err == nil) {
			t.Errorf("ParseChatBody %.60s: json.Valid %v, error %v", m, valid, err)
		}
	}
}

// FuzzRawMessages: a message span is accepted exactly when encoding/json accepts the body
// (within the parser's nesting bound).
func FuzzRawMessages(f *testing.F) {
	for _, s := range []string{`{"role":"user","content":"hi"}`, `"a\"b\\c\u0041"`, `[1,-2.5e3,null]`, `{"a":"` + strings.Repeat("x", 40) + `\n"}`, `"\u00"`, "\"a\x1fb\""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, m string) {
		body := []byte(`{"messages":[` + m + `]}`)
		_, err := ParseDocument(body)
		if strings.Count(m, "[")+strings.Count(m, "{") > maxJSONDepth-4 {
			return
		}
		if valid := json.Valid(body); valid != (err == nil) {
			t.Fatalf("%q: json.Valid %v, parse error %v", m, valid, err)
		}
	})
}
