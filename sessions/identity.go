package sessions

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// MaxIDLength bounds a session or parent id; longer ids are rejected rather than stored.
const MaxIDLength = 256

// IdentityConfig names where session identity is read from (docs/ARCHITECTURE.md, "Session identity"). Lists are tried in order
// and the first non-empty value wins; headers are tried before body fields.
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
		SessionHeaders: []string{"X-Session-ID", "X-Dynamo-Session-ID", "X-Correlation-ID",
			"X-Session-Affinity", "X-Claude-Code-Session-Id"},
		// session_id is vLLM's own body field (it echoes it on KV events); nvext wins over it.
		SessionBodyFields: []string{"nvext.session_control.session_id", "session_id"},
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

// IdentityParser reads Identity from headers and the raw JSON body.
type IdentityParser struct {
	cfg IdentityConfig
}

// NewIdentityParser returns a parser for cfg (empty lists take the defaults; an explicitly empty,
// non-nil list disables that source).
func NewIdentityParser(cfg IdentityConfig) *IdentityParser {
	return &IdentityParser{cfg: cfg.withDefaults()}
}

// Parse extracts the identity. body may be nil. An id that is too long or contains control
// characters is an error (the server answers 400); a body that is not a JSON object is ignored
// here (the OpenAI parser reports it).
func (p *IdentityParser) Parse(h http.Header, body []byte) (Identity, error) {
	var id Identity
	var doc map[string]json.RawMessage
	docTried := false
	field := func(path string) (json.RawMessage, bool) {
		// Decode the body at most once, and only if it can contain the path's first key: most
		// requests carry no body identity and their bodies can be large.
		if !docTried && len(body) > 0 && bytes.Contains(body, []byte(strings.SplitN(path, ".", 2)[0])) {
			docTried = true
			_ = json.Unmarshal(body, &doc) // not an object: no body identity
		}
		return lookupPath(doc, path)
	}
	bodyString := func(path string) string {
		raw, ok := field(path)
		if !ok {
			return ""
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return ""
		}
		return s
	}

	for _, name := range p.cfg.SessionHeaders {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			id.SessionID, id.Source = v, "header:"+name
			break
		}
	}
	if id.SessionID == "" {
		for _, path := range p.cfg.SessionBodyFields {
			if v := strings.TrimSpace(bodyString(path)); v != "" {
				id.SessionID, id.Source = v, "body:"+path
				break
			}
		}
	}
	for _, name := range p.cfg.ParentHeaders {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			id.ParentID = v
			break
		}
	}
	if id.ParentID == "" {
		for _, path := range p.cfg.ParentBodyFields {
			if v := strings.TrimSpace(bodyString(path)); v != "" {
				id.ParentID = v
				break
			}
		}
	}
	for _, name := range p.cfg.FinalHeaders {
		switch strings.ToLower(strings.TrimSpace(h.Get(name))) {
		case "true", "1", "yes":
			id.Final = true
		}
	}
	if !id.Final {
		for _, path := range p.cfg.CloseBodyFields {
			raw, ok := field(path)
			if !ok {
				continue
			}
			var v any
			if json.Unmarshal(raw, &v) != nil {
				continue
			}
			if s, isStr := v.(string); isStr && strings.EqualFold(s, "close") {
				id.Final = true
			}
			if b, isBool := v.(bool); isBool && b {
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

// Forward sets the forwarded session header on an upstream request's headers.
func (p *IdentityParser) Forward(h http.Header, id Identity) {
	if id.SessionID != "" {
		h.Set(p.cfg.ForwardHeader, id.SessionID)
	}
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

// lookupPath follows a dotted path through nested JSON objects.
func lookupPath(doc map[string]json.RawMessage, path string) (json.RawMessage, bool) {
	if doc == nil {
		return nil, false
	}
	parts := strings.Split(path, ".")
	cur := doc
	for i, part := range parts {
		raw, ok := cur[part]
		if !ok {
			return nil, false
		}
		if i == len(parts)-1 {
			return raw, true
		}
		var next map[string]json.RawMessage
		if json.Unmarshal(raw, &next) != nil {
			return nil, false
		}
		cur = next
	}
	return nil, false
}
