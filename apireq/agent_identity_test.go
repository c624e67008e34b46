package apireq

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// hashed is the documented stored form of a session id: "sh-" and the first 16 bytes of its
// SHA-256 in hex (computed here independently of kvkey.HashSessionID).
func hashed(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return "sh-" + hex.EncodeToString(sum[:16])
}

var hashedForm = regexp.MustCompile(`^sh-[0-9a-f]{32}$`)

// The session identity agents send on their own is a session source, in the documented order
// (docs/ARCHITECTURE.md, "Session identity"), and the id is hashed before anything keeps it.
func TestAgentSessionSources(t *testing.T) {
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	const chatMsgs = `"messages":[{"role":"user","content":"hi"}]`
	const anthMsgs = `"max_tokens":4,"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name   string
		ep     Endpoint
		h      http.Header
		body   string
		raw    string // the id as sent ("" = no session)
		source string
	}{
		{"codex thread-id and session-id", Responses, hdr("session-id", "conv-1", "thread-id", "thr-1"), `{"input":"hi"}`, "thr-1", "header:thread-id"},
		{"codex session-id", Responses, hdr("session-id", "conv-1"), `{"input":"hi"}`, "conv-1", "header:session-id"},
		{"pi session_id header", ChatCompletions, hdr("session_id", "pi-1"), `{` + chatMsgs + `}`, "pi-1", "header:session_id"},
		{"explicit header wins over agents'", ChatCompletions, hdr("thread-id", "thr-1", "X-Session-ID", "x-1"), `{` + chatMsgs + `}`, "x-1", "header:X-Session-ID"},
		{"prompt_cache_key on chat", ChatCompletions, hdr(), `{"prompt_cache_key":"pck-1",` + chatMsgs + `}`, "pck-1", "body:prompt_cache_key"},
		{"prompt_cache_key on Responses", Responses, hdr(), `{"prompt_cache_key":"pck-2","input":"hi"}`, "pck-2", "body:prompt_cache_key"},
		{"a header wins over prompt_cache_key", Responses, hdr("session-id", "conv-1"), `{"prompt_cache_key":"pck-2","input":"hi"}`, "conv-1", "header:session-id"},
		{"nvext wins over prompt_cache_key", ChatCompletions, hdr(), `{"prompt_cache_key":"pck-1","nvext":{"session_control":{"session_id":"nv"}},` + chatMsgs + `}`, "nv", "body:nvext.session_control.session_id"},
		{"claude code user_id, JSON", Messages, hdr(),
			`{"metadata":{"user_id":"{\"device_id\":\"d3v\",\"account_uuid\":\"\",\"session_id\":\"54c1eb09-bc4c-4d2f-98eb-6d2ab2d5e2fe\"}"},` + anthMsgs + `}`,
			"54c1eb09-bc4c-4d2f-98eb-6d2ab2d5e2fe", "body:metadata.user_id"},
		{"claude code user_id, legacy", MessagesCountTokens, hdr(),
			`{"metadata":{"user_id":"user_0a1b2c_account_5e6f_session_57a121ec-f78c-48c3-a745-e3036a3ecc33"},"messages":[{"role":"user","content":"hi"}]}`,
			"57a121ec-f78c-48c3-a745-e3036a3ecc33", "body:metadata.user_id"},
		{"a plain user_id is no session", Messages, hdr(), `{"metadata":{"user_id":"user-42"},` + anthMsgs + `}`, "", ""},
		{"user_id JSON without a session", Messages, hdr(), `{"metadata":{"user_id":"{\"device_id\":\"d3v\"}"},` + anthMsgs + `}`, "", ""},
		{"claude code header wins over user_id", Messages, hdr("X-Claude-Code-Session-Id", "cc-1"),
			`{"metadata":{"user_id":"{\"session_id\":\"other\"}"},` + anthMsgs + `}`, "cc-1", "header:X-Claude-Code-Session-Id"},
	}
	p := NewParser(DefaultIdentity())
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := strings.Replace(tc.body, "{", `{"model":"m",`, 1)
			r, e := p.Parse(tc.ep, []byte(body))
			if e != nil {
				t.Fatal(e)
			}
			if e := p.Identify(r, tc.h); e != nil {
				t.Fatal(e)
			}
			want := Identity{}
			if tc.raw != "" {
				want = Identity{SessionID: hashed(tc.raw), Source: tc.source}
			}
			if r.Session != want {
				t.Fatalf("identity %+v, want %+v", r.Session, want)
			}
			if tc.raw != "" && strings.Contains(r.Session.SessionID, tc.raw) {
				t.Fatalf("the stored id %q holds the raw one", r.Session.SessionID)
			}
		})
	}
}

// Session and parent ids are hashed (kvkey.HashSessionID: "sh-" and 32 hex digits, the same on every
// replica), so the raw ids never reach the tracker, logs or the worker.
func TestIdentifyHashes(t *testing.T) {
	p := NewParser(DefaultIdentity())
	r, e := p.Parse(ChatCompletions, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if e != nil {
		t.Fatal(e)
	}
	h := http.Header{}
	h.Set("X-Session-ID", "alice@example.com/conv-7")
	h.Set("X-Parent-Session-ID", "alice@example.com/root")
	if e := p.Identify(r, h); e != nil {
		t.Fatal(e)
	}
	id := r.Session
	for _, got := range []string{id.SessionID, id.ParentID} {
		if !hashedForm.MatchString(got) || strings.Contains(got, "alice") {
			t.Errorf("id %q: not a hashed id", got)
		}
	}
	if id.SessionID != hashed("alice@example.com/conv-7") || id.ParentID != hashed("alice@example.com/root") {
		t.Errorf("ids %+v, want the hashes of what was sent", id)
	}
	up := http.Header{}
	p.Forward(up, id)
	if up.Get("X-Session-ID") != id.SessionID {
		t.Errorf("forwarded %q, want the hashed id", up.Get("X-Session-ID"))
	}
}
