package server

import (
	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/sessions"
)

// identityConfig maps the configured header names onto the session identity parser
// (docs/ARCHITECTURE.md, "Session identity"); the body fields keep the parser's defaults:
// nvext.session_control.{session_id, parent_session_id, action} and vLLM's own session_id.
func identityConfig(c configs.Sessions) sessions.IdentityConfig {
	ic := sessions.DefaultIdentity()
	// A configured empty list turns a source off (non-nil empty slice); nil keeps the default.
	if c.Headers != nil {
		ic.SessionHeaders = append([]string{}, c.Headers...)
	}
	if c.ParentHeaders != nil {
		ic.ParentHeaders = append([]string{}, c.ParentHeaders...)
	}
	if c.FinalHeaders != nil {
		ic.FinalHeaders = append([]string{}, c.FinalHeaders...)
	}
	return ic
}
