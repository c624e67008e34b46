package indexers

// BytesPerApproxBlock is the approximate memory of one (target, block) residency of the
// approximate index: its LRU node, its share of the block's entry (target bitset, node slice)
// and the map slot, estimated from the structs' sizes with Go's map overhead.
const BytesPerApproxBlock = 160

// MemoryUse reports the index's blocks at BytesPerBlock each, summed over its targets, and the
// budget of one target (MaxBlocksPerTarget blocks); the fleet's budget is that times its
// targets.
func (ix *Index) MemoryUse() (used, perTargetBudget int64) {
	var blocks int64
	for _, ts := range ix.reg.Load().byTarget {
		ts.mu.Lock()
		blocks += int64(ts.blocks())
		ts.mu.Unlock()
	}
	return blocks * BytesPerBlock, int64(ix.opt.MaxBlocksPerTarget) * BytesPerBlock
}

// MemoryUse reports the approximate index's residencies at BytesPerApproxBlock each, summed
// over its targets, and the budget of one target (its block budget).
func (a *ApproxIndex) MemoryUse() (used, perTargetBudget int64) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	var n int64
	for _, t := range a.targets {
		if t != nil {
			n += int64(t.n)
		}
	}
	return n * BytesPerApproxBlock, int64(a.budget) * BytesPerApproxBlock
}
