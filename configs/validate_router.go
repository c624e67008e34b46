package configs

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// validateRouter checks router.policy and the KV-aware policies' knobs.
func (c *Config) validateRouter(bad func(key, format string, args ...any)) {
	r := c.Router
	switch {
	case r.Policy == "" || r.Policy == PolicyAuto:
		// Only before normalize (Validate called directly on a raw config): nothing to check.
	case !slices.Contains(Policies(), r.Policy):
		bad("router.policy", "unknown policy %q (known: auto, %s)", r.Policy, strings.Join(Policies(), ", "))
	case KVAware(r.Policy) && c.Tokenizer == "":
		why := ""
		if c.policyAuto {
			why = fmt.Sprintf(" (the default because workers[%d] has kv_events)", c.EventsWorker())
		}
		bad("tokenizer", "is required by router.policy %s%s: the gateway must tokenize prompts to match them against the workers' caches; set tokenizer, or router.policy round_robin", r.Policy, why)
	}

	// The KV-aware policies' knobs are validated by their owner, routerconfig.KV (see Validate).
}

// validateSessions checks the session-tracking knobs.
func (c *Config) validateSessions(bad func(key, format string, args ...any)) {
	s := c.Sessions
	if s.MaxSessions < 1 {
		bad("sessions.max_sessions", "must be at least 1, got %d", s.MaxSessions)
	}
	if s.MaxNodes < 1 || s.MaxNodes >= math.MaxUint32 {
		bad("sessions.max_nodes", "must be between 1 and 4294967294, got %d", s.MaxNodes)
	}
	if !(s.AffinityBlocks >= 0) || math.IsInf(s.AffinityBlocks, 0) {
		bad("sessions.affinity_blocks", "must be a finite number >= 0 (0 turns affinity off), got %v", s.AffinityBlocks)
	}
	if !(s.ParentBlocks >= 0) || math.IsInf(s.ParentBlocks, 0) {
		bad("sessions.parent_blocks", "must be a finite number >= 0 (0 turns the hint off), got %v", s.ParentBlocks)
	}
	switch s.ParentMode {
	case "parent", "lineage_root", "sibling_group":
	default:
		bad("sessions.parent_mode", "%q is not one of parent, lineage_root, sibling_group", s.ParentMode)
	}
	if s.GroupTargets < 1 {
		bad("sessions.group_targets", "must be at least 1, got %d", s.GroupTargets)
	}
	if s.PendingTTL < 0 {
		bad("sessions.pending_ttl", "must not be negative, got %s", s.PendingTTL)
	}
}
