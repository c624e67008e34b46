// Package sessionsconfig holds the sessions section of the kvgate YAML (identity headers,
// affinity, parent-aware placement) with its defaults and validation. It is a leaf, so configs
// composes it into the schema (under sessions:) without importing the session tracker, and the
// sessions package itself keeps importing only kvkey.
package sessionsconfig

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/confval"
)

// Parent placement modes (sessions.PlaceParent, PlaceLineageRoot, PlaceSiblingGroup).
const (
	ModeParent       = "parent"
	ModeLineageRoot  = "lineage_root"
	ModeSiblingGroup = "sibling_group"
)

// Config names the request headers that carry session identity (first match wins, see the
// docs/sessions.md) and configures session affinity and parent-aware placement
// (KV-aware policies only). Every field is used as given: zero is a value, not "use the
// default" (affinity_blocks 0 or parent_blocks 0 turn that hint off); start from Default.
type Config struct {
	// Headers are the session id headers, first match wins.
	Headers []string `yaml:"headers"`
	// BodyFields are dotted body paths carrying the session id, tried after the headers,
	// first match wins; "metadata.user_id" counts only where it holds a Claude Code session.
	BodyFields []string `yaml:"body_fields"`
	// ParentHeaders are the parent session id headers, first match wins.
	ParentHeaders []string `yaml:"parent_headers"`
	// FinalHeaders are headers whose value "true" ends the session after the request.
	FinalHeaders []string `yaml:"final_headers"`
	// MaxSessions bounds tracked sessions (least recently used evicted).
	MaxSessions int `yaml:"max_sessions"`
	// MaxNodes bounds the shared session prefix forest (blocks).
	MaxNodes int `yaml:"max_nodes"`
	// AffinityBlocks is the credit, in prompt blocks, a session's earlier target gets; 0 = off.
	AffinityBlocks float64 `yaml:"affinity_blocks"`
	// ParentAware turns parent-aware placement of a new child session on.
	ParentAware bool `yaml:"parent_aware"`
	// ParentMode is whose placement a new child follows: parent, lineage_root or sibling_group.
	ParentMode string `yaml:"parent_mode"`
	// ParentBlocks is the credit, in prompt blocks, of a parent-aware hint; 0 = off.
	ParentBlocks float64 `yaml:"parent_blocks"`
	// GroupTargets bounds how many targets a sibling group remembers.
	GroupTargets int `yaml:"group_targets"`
	// SiblingPrefix credits blocks the parent's or a sibling's in-flight request is computing.
	SiblingPrefix bool `yaml:"sibling_prefix"`
	// PendingTTL is how long such an in-flight prompt is credited.
	PendingTTL confval.Duration `yaml:"pending_ttl"`
}

// Default returns the built-in defaults (configs/kvgate.yaml documents the same values).
func Default() Config {
	return Config{
		Headers: []string{
			"X-Session-ID", "X-Dynamo-Session-ID", "X-Correlation-ID",
			"X-Session-Affinity", "x-claude-code-session-id", "thread-id", "session-id", "session_id",
		},
		BodyFields: []string{
			"nvext.session_control.session_id", "session_id", "prompt_cache_key", "metadata.user_id",
		},
		ParentHeaders: []string{
			"X-Parent-Session-ID", "X-Dynamo-Parent-Session-ID", "x-claude-code-parent-agent-id",
		},
		FinalHeaders:   []string{"X-Dynamo-Session-Final"},
		MaxSessions:    16384,
		MaxNodes:       1 << 20,
		AffinityBlocks: 16,
		ParentAware:    true,
		ParentMode:     ModeParent,
		ParentBlocks:   16,
		GroupTargets:   2,
		SiblingPrefix:  true,
		PendingTTL:     confval.Duration(30 * time.Second),
	}
}

// Validate returns every invalid key, named relative to the section ("max_sessions",
// "headers[1]"); configs prefixes them with "sessions.".
func (c Config) Validate() error {
	var p confval.Problems
	for _, l := range []struct {
		key   string
		names []string
	}{{"headers", c.Headers}, {"parent_headers", c.ParentHeaders}, {"final_headers", c.FinalHeaders}} {
		for i, h := range l.names {
			if !ValidHeaderName(h) {
				p.Addf(l.key+"["+strconv.Itoa(i)+"]", "%q is not a valid HTTP header name", h)
			}
		}
	}
	for i, f := range c.BodyFields {
		if !validBodyPath(f) {
			p.Addf("body_fields["+strconv.Itoa(i)+"]", "%q is not a dotted path of JSON object keys", f)
		}
	}
	if c.MaxSessions < 1 {
		p.Addf("max_sessions", "must be at least 1, got %d", c.MaxSessions)
	}
	if c.MaxNodes < 1 || c.MaxNodes >= math.MaxUint32 {
		p.Addf("max_nodes", "must be between 1 and 4294967294, got %d", c.MaxNodes)
	}
	if !(c.AffinityBlocks >= 0) || math.IsInf(c.AffinityBlocks, 0) {
		p.Addf("affinity_blocks", "must be a finite number >= 0 (0 turns affinity off), got %v", c.AffinityBlocks)
	}
	if !(c.ParentBlocks >= 0) || math.IsInf(c.ParentBlocks, 0) {
		p.Addf("parent_blocks", "must be a finite number >= 0 (0 turns the hint off), got %v", c.ParentBlocks)
	}
	switch c.ParentMode {
	case ModeParent, ModeLineageRoot, ModeSiblingGroup:
	default:
		p.Addf("parent_mode", "%q is not one of parent, lineage_root, sibling_group", c.ParentMode)
	}
	if c.GroupTargets < 1 {
		p.Addf("group_targets", "must be at least 1, got %d", c.GroupTargets)
	}
	if c.PendingTTL < 0 {
		p.Addf("pending_ttl", "must not be negative, got %s", c.PendingTTL)
	}
	return p.Err()
}

// ValidHeaderName reports whether h is a valid HTTP header field name (an RFC 9110 token).
func ValidHeaderName(h string) bool {
	if h == "" {
		return false
	}
	for _, r := range h {
		if r <= ' ' || r >= 0x7f || strings.ContainsRune("()<>@,;:\\\"/[]?={}", r) {
			return false
		}
	}
	return http.CanonicalHeaderKey(h) != ""
}

// validBodyPath reports whether f is a dotted path of non-empty keys ("a.b.c").
func validBodyPath(f string) bool {
	if f == "" {
		return false
	}
	for _, k := range strings.Split(f, ".") {
		if k == "" {
			return false
		}
	}
	return true
}
