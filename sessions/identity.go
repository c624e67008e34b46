package sessions

// Identity is who a request says it is, as the manager records it (the gateway reads it from
// the request, apireq.Identity, and hands it on through router.Request).
type Identity struct {
	SessionID string `json:"session_id,omitempty"`
	ParentID  string `json:"parent_session_id,omitempty"`
	// Final is set when the request ends its session: the session's state is released once the
	// request has been routed.
	Final bool `json:"final,omitempty"`
	// Source names where the session id came from ("header:X-Session-ID", "body:nvext...").
	Source string `json:"source,omitempty"`
}
