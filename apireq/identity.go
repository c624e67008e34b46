package apireq

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/ardanlabs/jinja"
)

// MaxIDLength bounds a session or parent id; longer ids are rejected rather than stored.
const MaxIDLength = 256

// IdentityConfig names where session identity is read from (docs/ARCHITECTURE.md, "Session
// identity"). Lists are tried in order and the first non-empty value wins; headers are tried
// before body fields.
type IdentityConfig struct {
	// SessionHeaders carry the session id.
	SessionHeaders []string `yaml:"session_headers" json:"session_headers"`
	// SessionBodyFields are dotted JSON paths in the request body carrying the session id.
	SessionBodyFields []string `yaml:"session_body_fields" json:"session_body_fields"`
	// ParentHeaders carry the parent session id.
	ParentHeaders []string `yaml:"parent_headers" json:"parent_headers"`
	// ParentBodyFields are dotted JSON paths carrying the parent session id.
	ParentBodyFields []string `yaml:"parent_body_fields" json:"parent_body_fields"`
	// FinalHeaders end the session when their value is true (true, 1, yes; any case).
	FinalHeaders []string `yaml:"final_headers" json:"final_headers"`
	// CloseBodyFields end the session when their value is the string "close" or boolean true.
	CloseBodyFields []string `yaml:"close_body_fields" json:"close_body_fields"`
	// ForwardHeader is the header the session id is forwarded to the worker in ("X-Session-ID":
	// newer vLLM attributes its KV events to it).
	ForwardHeader string `yaml:"forward_header" json:"forward_header"`
}

// DefaultIdentity returns the names listed in docs/ARCHITECTURE.md, "Session identity".
func DefaultIdentity() IdentityConfig {
	return IdentityConfig{
		// Explicit session headers first, then what agents send on their own: Claude Code's
		// X-Claude-Code-Session-Id, Codex's thread-id and session-id, pi's session_id.
		SessionHeaders: []string{"X-Session-ID", "X-Dynamo-Session-ID", "X-Correlation-ID",
			"X-Session-Affinity", "X-Claude-Code-Session-Id", "thread-id", "session-id", "session_id"},
		// session_id is vLLM's own body field (it echoes it on KV events); nvext wins over it.
		// prompt_cache_key is OpenAI's cache-routing key (chat and Responses; Codex sends its
		// conversation id there); metadata.user_id counts only where it carries a session
		// (AnthropicUserIDField).
		SessionBodyFields: []string{"nvext.session_control.session_id", "session_id", "prompt_cache_key", AnthropicUserIDField},
		ParentHeaders:     []string{"X-Parent-Session-ID", "X-Dynamo-Parent-Session-ID", "X-Claude-Code-Parent-Agent-Id"},
		ParentBodyFields:  []string{"nvext.session_control.parent_session_id"},
		FinalHeaders:      []string{"X-Dynamo-Session-Final"},
		CloseBodyFields:   []string{"nvext.session_control.action"},
		ForwardHeader:     "X-Session-ID",
	}
}

func (c IdentityConfig) withDefaults() IdentityConfig {
	d := DefaultIdentity()
	if c.SessionHeaders == nil {
		c.SessionHeaders = d.SessionHeaders
	}
	if c.SessionBodyFields == nil {
		c.SessionBodyFields = d.SessionBodyFields
	}
	if c.ParentHeaders == nil {
		c.ParentHeaders = d.ParentHeaders
	}
	if c.ParentBodyFields == nil {
		c.ParentBodyFields = d.ParentBodyFields
	}
	if c.FinalHeaders == nil {
		c.FinalHeaders = d.FinalHeaders
	}
	if c.CloseBodyFields == nil {
		c.CloseBodyFields = d.CloseBodyFields
	}
	if c.ForwardHeader == "" {
		c.ForwardHeader = d.ForwardHeader
	}
	return c
}

// AnthropicUserIDField is the Anthropic Messages body field metadata.user_id. As a session
// source it yields only the session a Claude Code user id carries (claudeCodeSession); a plain
// user id names a user, not a conversation, and is no session.
const AnthropicUserIDField = "metadata.user_id"

// claudeCodeSession returns the session id inside a Claude Code metadata.user_id: the JSON
// string {"device_id": ..., "account_uuid": ..., "session_id": ...} it sends since 2.1.78, or
// the older "user_<hash>_account_<uuid>_session_<uuid>"; "" for anything else.
func claudeCodeSession(userID string) string {
	if strings.HasPrefix(userID, "{") {
		var v struct {
			SessionID string `json:"session_id"`
		}
		if json.Unmarshal([]byte(userID), &v) != nil {
			return ""
		}
		return v.SessionID
	}
	if !strings.HasPrefix(userID, "user_") {
		return ""
	}
	if i := strings.LastIndex(userID, "_session_"); i >= 0 {
		return userID[i+len("_session_"):]
	}
	return ""
}

// Identity is who a request says it is.
type Identity struct {
	SessionID string `json:"session_id,omitempty"`
	ParentID  string `json:"parent_session_id,omitempty"`
	// Final is set when the request ends its session: the session's state is released once the
	// request has been routed.
	Final bool `json:"final,omitempty"`
	// Source names where the session id came from ("header:X-Session-ID", "body:nvext...").
	Source string `json:"source,omitempty"`
}

// bodyFields reads dotted paths of a parsed body (nil: no body).
type bodyFields interface {
	Path(path string) (jinja.Value, bool)
}

// identity extracts the identity from the headers and the parsed body (nil when there is none).
// An id that is too long or contains control characters is an error (the server answers 400).
func (c *IdentityConfig) identity(h http.Header, body bodyFields) (Identity, error) {
	var id Identity
	field := func(path string) (jinja.Value, bool) {
		if body == nil {
			return jinja.None(), false
		}
		return body.Path(path)
	}
	bodyString := func(path string) string {
		v, ok := field(path)
		if !ok || !v.IsString() {
			return ""
		}
		if path == AnthropicUserIDField {
			return claudeCodeSession(v.AsString())
		}
		return v.AsString()
	}

	for _, name := range c.SessionHeaders {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			id.SessionID, id.Source = v, "header:"+name
			break
		}
	}
	if id.SessionID == "" {
		for _, path := range c.SessionBodyFields {
			if v := strings.TrimSpace(bodyString(path)); v != "" {
				id.SessionID, id.Source = v, "body:"+path
				break
			}
		}
	}
	for _, name := range c.ParentHeaders {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			id.ParentID = v
			break
		}
	}
	if id.ParentID == "" {
		for _, path := range c.ParentBodyFields {
			if v := strings.TrimSpace(bodyString(path)); v != "" {
				id.ParentID = v
				break
			}
		}
	}
	for _, name := range c.FinalHeaders {
		switch strings.ToLower(strings.TrimSpace(h.Get(name))) {
		case "true", "1", "yes":
			id.Final = true
		}
	}
	if !id.Final {
		for _, path := range c.CloseBodyFields {
			v, ok := field(path)
			if !ok {
				continue
			}
			if v.IsString() && strings.EqualFold(v.AsString(), "close") {
				id.Final = true
			}
			if v.IsBool() && v.AsBool() {
				id.Final = true
			}
		}
	}
	if err := checkID("session id", id.SessionID); err != nil {
		return Identity{}, err
	}
	if err := checkID("parent session id", id.ParentID); err != nil {
		return Identity{}, err
	}
	if id.ParentID == id.SessionID {
		id.ParentID = "" // a session cannot be its own parent
	}
	return id, nil
}

func checkID(what, s string) error {
	if len(s) > MaxIDLength {
		return fmt.Errorf("%s longer than %d bytes", what, MaxIDLength)
	}
	for _, r := range s {
		// C0 (U+0000..U+001F), DEL and C1 (U+0080..U+009F, e.g. NEL U+0085): none belongs in
		// an id that is logged, forwarded as a header and used as a map key.
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return fmt.Errorf("%s contains a control character", what)
		}
	}
	return nil
}
