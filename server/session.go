package server

import (
	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/configs"
)

// identityConfig maps the configured header names onto the request model's session identity
// (docs/ARCHITECTURE.md, "Session identity"), and the session body fields; the parent and
// close body fields keep the defaults: nvext.session_control.{parent_session_id, action}.
func identityConfig(c configs.Sessions) apireq.IdentityConfig {
	ic := apireq.DefaultIdentity()
	// A configured empty list turns a source off (non-nil empty slice); nil keeps the default.
	if c.Headers != nil {
		ic.SessionHeaders = append([]string{}, c.Headers...)
	}
	if c.BodyFields != nil {
		ic.SessionBodyFields = append([]string{}, c.BodyFields...)
	}
	if c.ParentHeaders != nil {
		ic.ParentHeaders = append([]string{}, c.ParentHeaders...)
	}
	if c.FinalHeaders != nil {
		ic.FinalHeaders = append([]string{}, c.FinalHeaders...)
	}
	return ic
}
