package apireq

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tokenize/chat"
)

// docs/ARCHITECTURE.md, "Session identity": every listed header and body field is accepted; first match wins.
func TestIdentityParse(t *testing.T) {
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	cases := []struct {
		name    string
		cfg     IdentityConfig
		h       http.Header
		body    string
		want    Identity
		wantErr bool
	}{
		{"nothing", IdentityConfig{}, hdr(), `{"model":"m"}`, Identity{}, false},
		{"X-Session-ID", IdentityConfig{}, hdr("X-Session-ID", "s1"), "", Identity{SessionID: "s1", Source: "header:X-Session-ID"}, false},
		{"dynamo header", IdentityConfig{}, hdr("X-Dynamo-Session-ID", "d1"), "", Identity{SessionID: "d1", Source: "header:X-Dynamo-Session-ID"}, false},
		{"aiperf correlation id", IdentityConfig{}, hdr("X-Correlation-ID", "c1"), "", Identity{SessionID: "c1", Source: "header:X-Correlation-ID"}, false},
		{"session affinity header", IdentityConfig{}, hdr("X-Session-Affinity", "a1"), "", Identity{SessionID: "a1", Source: "header:X-Session-Affinity"}, false},
		{"claude code, lower case", IdentityConfig{}, hdr("x-claude-code-session-id", "cc", "x-claude-code-parent-agent-id", "pp"), "",
			Identity{SessionID: "cc", ParentID: "pp", Source: "header:X-Claude-Code-Session-Id"}, false},
		{"first configured header wins", IdentityConfig{}, hdr("X-Correlation-ID", "late", "X-Session-ID", "early"), "",
			Identity{SessionID: "early", Source: "header:X-Session-ID"}, false},
		{"header wins over body", IdentityConfig{}, hdr("X-Dynamo-Session-ID", "h"), `{"nvext":{"session_control":{"session_id":"b"}}}`,
			Identity{SessionID: "h", Source: "header:X-Dynamo-Session-ID"}, false},
		{"body nvext", IdentityConfig{}, hdr(), `{"messages":[],"nvext":{"session_control":{"session_id":"b","action":"close"}}}`,
			Identity{SessionID: "b", Final: true, Source: "body:nvext.session_control.session_id"}, false},
		{"nvext wins over vLLM's session_id", IdentityConfig{}, hdr(), `{"session_id":"v","nvext":{"session_control":{"session_id":"n"}}}`,
			Identity{SessionID: "n", Source: "body:nvext.session_control.session_id"}, false},
		{"vLLM body session_id", IdentityConfig{}, hdr(), `{"session_id":"v"}`, Identity{SessionID: "v", Source: "body:session_id"}, false},
		{"parents: first match wins", IdentityConfig{}, hdr("X-Session-ID", "k", "X-Dynamo-Parent-Session-ID", "p2", "X-Parent-Session-ID", "p1"), "",
			Identity{SessionID: "k", ParentID: "p1", Source: "header:X-Session-ID"}, false},
		{"parent in body", IdentityConfig{}, hdr("X-Session-ID", "k"), `{"nvext":{"session_control":{"parent_session_id":"bp"}}}`,
			Identity{SessionID: "k", ParentID: "bp", Source: "header:X-Session-ID"}, false},
		{"final header", IdentityConfig{}, hdr("X-Session-ID", "k", "X-Dynamo-Session-Final", "TRUE"), "",
			Identity{SessionID: "k", Final: true, Source: "header:X-Session-ID"}, false},
		{"final header false", IdentityConfig{}, hdr("X-Session-ID", "k", "X-Dynamo-Session-Final", "false"), "",
			Identity{SessionID: "k", Source: "header:X-Session-ID"}, false},
		{"other action is not a close", IdentityConfig{}, hdr("X-Session-ID", "k"), `{"nvext":{"session_control":{"action":"open"}}}`,
			Identity{SessionID: "k", Source: "header:X-Session-ID"}, false},
		{"self parent ignored", IdentityConfig{}, hdr("X-Session-ID", "k", "X-Parent-Session-ID", "k"), "",
			Identity{SessionID: "k", Source: "header:X-Session-ID"}, false},
		{"custom names replace the defaults", IdentityConfig{SessionHeaders: []string{"X-Conv"}, SessionBodyFields: []string{"meta.conv"}},
			hdr("X-Session-ID", "ignored"), `{"meta":{"conv":"m1"}}`, Identity{SessionID: "m1", Source: "body:meta.conv"}, false},
		{"empty list disables a source", IdentityConfig{SessionBodyFields: []string{}}, hdr(), `{"session_id":"v"}`, Identity{}, false},
		{"body not an object", IdentityConfig{}, hdr(), `["session_id"]`, Identity{}, false},
		{"wrong type in body", IdentityConfig{}, hdr(), `{"nvext":{"session_control":{"session_id":42}}}`, Identity{}, false},
		{"id too long", IdentityConfig{}, hdr("X-Session-ID", strings.Repeat("x", MaxIDLength+1)), "", Identity{}, true},
		{"control character", IdentityConfig{}, hdr(), `{"session_id":"a\u0001b"}`, Identity{}, true},
		{"C1 control NEL in body", IdentityConfig{}, hdr(), `{"session_id":"a\u0085b"}`, Identity{}, true},
		{"C1 control U+0080 in body", IdentityConfig{}, hdr(), `{"session_id":"a\u0080b"}`, Identity{}, true},
		{"C1 control U+009F in header", IdentityConfig{}, hdr("X-Session-ID", "a\u009fb"), "", Identity{}, true},
		{"U+00A0 is not a control", IdentityConfig{}, hdr(), `{"session_id":"a\u00a0b"}`,
			Identity{SessionID: "a\u00a0b", Source: "body:session_id"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The identity is read from the request's one parse of the body; a body that is not
			// an object has none (Parse refuses it before identity is read).
			var body bodyFields
			if doc, err := chat.ParseDocument([]byte(tc.body)); err == nil {
				body = doc
			}
			cfg := tc.cfg.withDefaults()
			got, err := cfg.identity(tc.h, body)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestIdentityForward(t *testing.T) {
	p := NewParser(IdentityConfig{})
	h := http.Header{}
	p.Forward(h, Identity{SessionID: "abc"})
	if h.Get("X-Session-ID") != "abc" {
		t.Fatalf("forwarded header = %q", h.Get("X-Session-ID"))
	}
	h2 := http.Header{}
	p.Forward(h2, Identity{})
	if len(h2) != 0 {
		t.Fatalf("no session: headers %v", h2)
	}
}
