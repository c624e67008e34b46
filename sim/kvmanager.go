package sim

// kvManager is vLLM's KVCacheManager for one engine and a single full-attention KV group:
// prefix lookup, slot allocation with caching of newly full blocks, and freeing.
type kvManager struct {
	pool      *blockPool
	host      *hostTier // nil without --num-cpu-blocks
	blockSize int
	caching   bool
}

func newKVManager(o Options) *kvManager {
	m := &kvManager{
		pool:      newBlockPool(o.NumGPUBlocks, o.BlockSize, !o.DisablePrefixCaching),
		blockSize: o.BlockSize,
		caching:   !o.DisablePrefixCaching,
	}
	if o.NumCPUBlocks > 0 && m.caching {
		m.host = newHostTier(o.NumCPUBlocks, o.CPUEventsFull)
		m.pool.onCached = m.host.store
	}
	return m
}

// prefixHit is what get_computed_blocks finds for a new request: GPU blocks to reuse and the
// number of following blocks the host tier can load back.
type prefixHit struct {
	gpu  []*block
	host int
}

func (h prefixHit) tokens(blockSize int) int { return (len(h.gpu) + h.host) * blockSize }

// computedBlocks finds the longest cached prefix. Like vLLM it never hits the last prompt
// token (it must be recomputed to sample), so at most (len-1)/block_size blocks match.
func (m *kvManager) computedBlocks(s *seqState) prefixHit {
	var hit prefixHit
	if !m.caching {
		return hit
	}
	maxBlocks := min((len(s.tokens)-1)/m.blockSize, len(s.hashes))
	for i := 0; i < maxBlocks; i++ {
		b := m.pool.lookup(s.hashes[i])
		if b == nil {
			break
		}
		hit.gpu = append(hit.gpu, b)
	}
	if m.host != nil {
		for i := len(hit.gpu); i < maxBlocks && m.host.has(s.hashes[i]); i++ {
			hit.host++
		}
	}
	return hit
}

// allocate reserves KV slots for numNew more tokens of s (vLLM allocate_slots). hit is the
// prefix hit of a newly scheduled request (zero afterwards); computed the tokens already
// computed. It returns false, changing nothing, when the pool lacks free blocks.
func (m *kvManager) allocate(s *seqState, computed, numNew int, hit prefixHit, sessionID string) bool {
	toAlloc, ok := m.blocksToAllocate(s, computed, numNew, hit)
	if !ok {
		return false
	}
	computed += hit.tokens(m.blockSize)
	if len(s.blocks) == 0 {
		s.numCached = len(hit.gpu)
	}
	m.pool.touch(hit.gpu)
	s.blocks = append(s.blocks, hit.gpu...)
	s.blocks = append(s.blocks, m.pool.getNew(toAlloc)...)
	if !m.caching {
		return true
	}
	full := min(computed+numNew, len(s.tokens)) / m.blockSize
	if full > s.numCached {
		m.pool.cacheFull(s, s.blocks, s.numCached, full, sessionID)
		s.numCached = full
	}
	return true
}

// blocksToAllocate is vLLM's get_num_blocks_to_allocate: new blocks needed, and whether they
// and the prefix-hit blocks that sit in the free queue fit in it.
func (m *kvManager) blocksToAllocate(s *seqState, computed, numNew int, hit prefixHit) (int, bool) {
	computed += hit.tokens(m.blockSize)
	need := (computed + numNew + m.blockSize - 1) / m.blockSize
	toAlloc := max(need-len(s.blocks)-len(hit.gpu), 0)
	evictableHits := 0
	for _, b := range hit.gpu {
		if b.ref == 0 {
			evictableHits++
		}
	}
	return toAlloc, toAlloc+evictableHits <= m.pool.numFree()
}

// canAllocate reports whether allocate would succeed.
func (m *kvManager) canAllocate(s *seqState, computed, numNew int, hit prefixHit) bool {
	_, ok := m.blocksToAllocate(s, computed, numNew, hit)
	return ok
}

// free releases a finished, aborted or preempted request's blocks, tail first so the end of
// its sequence is evicted before its (more shareable) prefix.
func (m *kvManager) free(s *seqState) {
	rev := make([]*block, len(s.blocks))
	for i, b := range s.blocks {
		rev[len(s.blocks)-1-i] = b
	}
	m.pool.freeBlocks(rev)
	s.blocks = nil
	s.numCached = 0
}

// takeEvents drains one step's events: block-pool events first, then the host tier's
// (connector events come last in vLLM's batch).
func (m *kvManager) takeEvents() []kvEvent {
	ev := m.pool.takeEvents()
	if m.host != nil {
		ev = append(ev, m.host.takeEvents()...)
	}
	return ev
}
