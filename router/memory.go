package router

// MemoryUse is one bounded cache's estimated bytes in use and its byte budget
// (kvgate_memory_used_bytes and kvgate_memory_budget_bytes).
type MemoryUse struct {
	Cache  string
	Used   int64
	Budget int64
}

// Per-entry memory estimates of the router's caches, from the structs' sizes with Go's map
// and list overhead; the memory soak (docs/benchmarks/2026-12-05-memory-soak.md) checks the
// process against their sum.
const (
	// bytesPerSetKey: a working-set key (its map slot in the target's set and in the owner map).
	bytesPerSetKey = 96
	// bytesPerPin: a Responses pin (the response id, its list element, map slot and entry).
	bytesPerPin = 320
	// bytesPerRecentBlock: a block hash kept by a recent-prompt ring.
	bytesPerRecentBlock = 8
)

// MemoryUse reports the router's bounded caches for a fleet of targets worker+ranks: the
// approximate index, the working sets, the recent-prompt rings (KV-aware policies only) and the
// Responses pins. Per-target budgets are multiplied by targets, capped at the targets the
// router keeps state for.
func (d *Dispatcher) MemoryUse(targets int) []MemoryUse {
	timedTargets := int64(min(targets, maxTimedTargets))
	var out []MemoryUse
	if d.approx != nil {
		used, per := d.approx.MemoryUse()
		out = append(out, MemoryUse{Cache: "approximate_index", Used: used, Budget: per * int64(targets)})
	}
	if d.kv != nil && d.kv.timed != nil && d.kv.timed.workset != nil {
		var keys int64
		for _, s := range d.kv.timed.workset.targets.all() {
			s.mu.Lock()
			keys += int64(len(s.seen))
			s.mu.Unlock()
		}
		out = append(out, MemoryUse{Cache: "working_sets", Used: keys * bytesPerSetKey,
			Budget: maxSetKeys * bytesPerSetKey * timedTargets})
	}
	if d.kv != nil && d.kv.recent != nil {
		var blocks int64
		for _, r := range d.kv.recent.rings.all() {
			r.mu.Lock()
			blocks += int64(r.blocks)
			r.mu.Unlock()
		}
		out = append(out, MemoryUse{Cache: "recent_prompts", Used: blocks * bytesPerRecentBlock,
			Budget: recentBlocks * bytesPerRecentBlock * timedTargets})
	}
	if d.pins != nil {
		d.pins.mu.Lock()
		n := int64(len(d.pins.ids))
		d.pins.mu.Unlock()
		out = append(out, MemoryUse{Cache: "responses_pins", Used: n * bytesPerPin,
			Budget: int64(d.pins.cfg.MaxPins) * bytesPerPin})
	}
	return out
}
