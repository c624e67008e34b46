package sessions

import "github.com/kvgate/kvgate/kvkey"

// Hint is a soft placement preference derived from session state, folded into the router's cost.
type Hint struct {
	Target kvkey.Target `json:"target"`
	// Rule names what produced the hint ("affinity", "parent", "lineage_root", "sibling_group", ...);
	// it is reported in the decision record.
	Rule string `json:"rule"`
	// Blocks is the preference's strength in prompt blocks: the router credits the target as if
	// this many more blocks were already cached there.
	Blocks float64 `json:"blocks"`
}
