package sessions

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Placement modes for requests that carry a parent session id (docs/ARCHITECTURE.md, "Sessions and frontiers").
const (
	// PlaceParent prefers the targets where the parent session has its frontier.
	PlaceParent = "parent"
	// PlaceLineageRoot prefers the targets where the root of the lineage has its frontier.
	PlaceLineageRoot = "lineage_root"
	// PlaceSiblingGroup prefers the targets where earlier siblings (children of the same parent)
	// landed, falling back to the parent's frontier for the first sibling.
	PlaceSiblingGroup = "sibling_group"
)

// Hint rules reported in the decision record.
const (
	RuleAffinity     = "affinity"
	RuleParent       = "parent"
	RuleLineageRoot  = "lineage_root"
	RuleSiblingGroup = "sibling_group"
	// RuleSiblingPrefix is the lineage-aware extra: credit for a sibling's (or the parent's)
	// in-flight prompt blocks that the worker has not announced by KV events yet.
	RuleSiblingPrefix = "sibling_prefix"
)

// Config holds the session settings. Every field is used as given: zero is a value, not "use
// the default" (AffinityBlocks 0 or ParentBlocks 0 turn that hint off, MaxLineageBlocks 0
// records the whole prefix), as in every kvgate config struct; start from Defaults and change
// what differs. Identity keeps IdentityConfig's own rule (a nil list is the built-in list).
type Config struct {
	// MaxSessions bounds tracked sessions; the least recently used is evicted at the cap.
	MaxSessions int `yaml:"max_sessions" json:"max_sessions"`
	// MaxNodes bounds the shared prefix forest (about 80 bytes per node with its map entry; the default is ~85 MB at most).
	MaxNodes int `yaml:"max_nodes" json:"max_nodes"`
	// MaxFrontiersPerTarget bounds a session's frontier nodes on one worker+rank (divergent branches).
	MaxFrontiersPerTarget int `yaml:"max_frontiers_per_target" json:"max_frontiers_per_target"`
	// MaxFrontiersPerSession bounds a session's frontier nodes over all targets.
	MaxFrontiersPerSession int `yaml:"max_frontiers_per_session" json:"max_frontiers_per_session"`
	// AffinityBlocks is the strength of session affinity, in prompt blocks of credit. Larger keeps a
	// session on its worker against bigger load differences; 0 turns affinity off.
	AffinityBlocks float64 `yaml:"affinity_blocks" json:"affinity_blocks"`
	// ParentAware turns parent-aware placement on for requests that carry a parent session id.
	ParentAware bool `yaml:"parent_aware" json:"parent_aware"`
	// ParentMode chooses whose placement a new child follows: parent, lineage_root or sibling_group.
	ParentMode string `yaml:"parent_mode" json:"parent_mode"`
	// ParentBlocks is the strength of a parent-aware hint, in prompt blocks of credit; 0 turns the
	// hint off while keeping group bookkeeping.
	ParentBlocks float64 `yaml:"parent_blocks" json:"parent_blocks"`
	// GroupTargets bounds how many targets a sibling group remembers (the warmed workers a spilled
	// group keeps preferring instead of scattering to cold ones).
	GroupTargets int `yaml:"group_targets" json:"group_targets"`
	// SiblingPrefix turns on credit for in-flight prompt blocks of the parent and siblings.
	SiblingPrefix bool `yaml:"sibling_prefix" json:"sibling_prefix"`
	// PendingTTL is how long an in-flight prompt is credited before its KV events are expected.
	PendingTTL time.Duration `yaml:"pending_ttl" json:"pending_ttl"`
	// MaxLineageBlocks caps the blocks a route-time update records (the deepest ones); the first
	// recorded block then becomes a temporary root. 0 records the whole matched prefix.
	MaxLineageBlocks int `yaml:"max_lineage_blocks" json:"max_lineage_blocks"`
}

// Defaults returns the default configuration.
func Defaults() Config {
	return Config{
		MaxSessions:            16384,
		MaxNodes:               1 << 20,
		MaxFrontiersPerTarget:  4,
		MaxFrontiersPerSession: 32,
		AffinityBlocks:         16,
		ParentAware:            true,
		ParentMode:             PlaceParent,
		ParentBlocks:           16,
		GroupTargets:           2,
		SiblingPrefix:          true,
		PendingTTL:             30 * time.Second,
	}
}

// Validate reports every invalid setting, the config taken as given.
func (c Config) Validate() error {
	var errs []error
	if c.MaxSessions < 1 {
		errs = append(errs, fmt.Errorf("sessions.max_sessions must be >= 1, got %d", c.MaxSessions))
	}
	if c.MaxNodes < 1 || c.MaxNodes >= int(nilSlot) {
		errs = append(errs, fmt.Errorf("sessions.max_nodes must be in [1, 2^32-1), got %d", c.MaxNodes))
	}
	if c.MaxFrontiersPerTarget < 1 || c.MaxFrontiersPerSession < c.MaxFrontiersPerTarget {
		errs = append(errs, fmt.Errorf("sessions: need 1 <= max_frontiers_per_target (%d) <= max_frontiers_per_session (%d)",
			c.MaxFrontiersPerTarget, c.MaxFrontiersPerSession))
	}
	if !(c.AffinityBlocks >= 0) || math.IsInf(c.AffinityBlocks, 0) {
		errs = append(errs, fmt.Errorf("sessions.affinity_blocks must be a finite number >= 0 (0 turns affinity off), got %v", c.AffinityBlocks))
	}
	if !(c.ParentBlocks >= 0) || math.IsInf(c.ParentBlocks, 0) {
		errs = append(errs, fmt.Errorf("sessions.parent_blocks must be a finite number >= 0 (0 turns the hint off), got %v", c.ParentBlocks))
	}
	switch c.ParentMode {
	case PlaceParent, PlaceLineageRoot, PlaceSiblingGroup:
	default:
		errs = append(errs, fmt.Errorf("sessions.parent_mode must be parent, lineage_root or sibling_group, got %q", c.ParentMode))
	}
	if c.GroupTargets < 1 {
		errs = append(errs, fmt.Errorf("sessions.group_targets must be >= 1, got %d", c.GroupTargets))
	}
	if c.PendingTTL < 0 || c.MaxLineageBlocks < 0 {
		errs = append(errs, errors.New("sessions: pending_ttl and max_lineage_blocks must be >= 0"))
	}
	return errors.Join(errs...)
}
