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

	weights := []struct {
		key string
		v   float64
	}{
		{"router.prefill_weight", r.PrefillWeight},
		{"router.prefill_load_weight", r.PrefillLoadWeight},
		{"router.decode_weight", r.DecodeWeight},
		{"router.request_weight", r.RequestWeight},
		{"router.waiting_weight", r.WaitingWeight},
		{"router.temperature", r.Temperature},
	}
	for _, w := range weights {
		if !(w.v >= 0) || math.IsInf(w.v, 0) {
			bad(w.key, "must be a finite number >= 0, got %v", w.v)
		}
	}
	fractions := []struct {
		key string
		v   float64
	}{
		{"router.g2_credit", r.G2Credit},
		{"router.g3_credit", r.G3Credit},
		{"router.busy_kv_usage", r.BusyKVUsage},
	}
	for _, f := range fractions {
		if !(f.v >= 0 && f.v <= 1) {
			bad(f.key, "must be between 0 and 1, got %v", f.v)
		}
	}
	if r.BusyWaitingRequests < 0 {
		bad("router.busy_waiting_requests", "must be >= 0 (0 turns it off), got %d", r.BusyWaitingRequests)
	}
	if r.BusyPrefillTokens < 0 {
		bad("router.busy_prefill_tokens", "must be >= 0 (0 turns it off), got %d", r.BusyPrefillTokens)
	}
	durations := []struct {
		key string
		v   Duration
	}{
		{"router.metrics_interval", r.MetricsInterval},
		{"router.metrics_max_age", r.MetricsMaxAge},
		{"router.load_expiry", r.LoadExpiry},
		{"router.approximate.ttl", r.Approximate.TTL},
	}
	for _, d := range durations {
		if d.v <= 0 {
			bad(d.key, "must be a positive duration, got %s", d.v)
		}
	}
	if r.MetricsMaxAge > 0 && r.MetricsInterval > 0 && r.MetricsMaxAge < r.MetricsInterval {
		bad("router.metrics_max_age", "(%s) must be at least router.metrics_interval (%s), or every reading is stale before the next scrape", r.MetricsMaxAge, r.MetricsInterval)
	}
	if r.Approximate.BlockBudget < 1 {
		bad("router.approximate.block_budget", "must be at least 1 block, got %d", r.Approximate.BlockBudget)
	}
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
