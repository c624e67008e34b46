package sim

import "slices"

// The block pool follows vLLM v1's BlockPool (vllm/v1/core/block_pool.py): block 0 is the null
// block; free blocks sit in an LRU queue (front = evicted first); a freed block keeps its hash
// and stays a prefix-cache hit until it is popped for reuse, which is when its BlockRemoved is
// emitted (lazy eviction); several physical blocks may hold the same hash.

// blockMeta is what a cached block remembers of its content, for events and the host tier.
type blockMeta struct {
	hash      uint64
	parent    uint64
	hasParent bool
	tokens    []uint32
	extra     []string // extra keys of this block (LoRA name, cache salt), nil for none
	loraName  string
	loraID    int
}

type block struct {
	id         int
	ref        int
	meta       *blockMeta // nil when the block holds no cached hash
	prev, next *block     // free-queue links
	inFree     bool
}

// freeQueue is vLLM's FreeKVCacheBlockQueue: a doubly linked list with O(1) removal.
type freeQueue struct {
	head, tail block // sentinels
	n          int
}

func (q *freeQueue) init() {
	q.head.next = &q.tail
	q.tail.prev = &q.head
}

func (q *freeQueue) pushBack(b *block) {
	b.prev = q.tail.prev
	b.next = &q.tail
	q.tail.prev.next = b
	q.tail.prev = b
	b.inFree = true
	q.n++
}

func (q *freeQueue) remove(b *block) {
	b.prev.next = b.next
	b.next.prev = b.prev
	b.prev, b.next = nil, nil
	b.inFree = false
	q.n--
}

func (q *freeQueue) popFront() *block {
	if q.n == 0 {
		return nil
	}
	b := q.head.next
	q.remove(b)
	return b
}

// blockPool is one engine's GPU block pool.
type blockPool struct {
	blocks    []block
	free      freeQueue
	cached    map[uint64][]*block // hash -> physical blocks holding it, oldest first
	caching   bool
	blockSize int
	events    []kvEvent // drained once per step
	// onCached receives the blocks of every cacheFull run (the host tier stores a copy).
	onCached func([]*blockMeta)
}

func newBlockPool(numBlocks, blockSize int, caching bool) *blockPool {
	p := &blockPool{
		blocks:    make([]block, numBlocks),
		cached:    make(map[uint64][]*block),
		caching:   caching,
		blockSize: blockSize,
	}
	p.free.init()
	for i := range p.blocks {
		p.blocks[i].id = i
		if i > 0 { // block 0 is the null block, never handed out
			p.free.pushBack(&p.blocks[i])
		}
	}
	return p
}

func (p *blockPool) numFree() int { return p.free.n }

// usage is vLLM's get_usage: 1 - free/(num_gpu_blocks-1).
func (p *blockPool) usage() float64 {
	total := len(p.blocks) - 1
	if total <= 0 {
		return 0
	}
	return 1 - float64(p.free.n)/float64(total)
}

// lookup returns the first physical block caching hash, if any.
func (p *blockPool) lookup(hash uint64) *block {
	if bs := p.cached[hash]; len(bs) > 0 {
		return bs[0]
	}
	return nil
}

// touch takes a reference on prefix-hit blocks, pulling free ones out of the free queue.
func (p *blockPool) touch(bs []*block) {
	for _, b := range bs {
		if b.ref == 0 && b.inFree {
			p.free.remove(b)
		}
		b.ref++
	}
}

// getNew pops n blocks from the front of the free queue, evicting their cached hashes.
func (p *blockPool) getNew(n int) []*block {
	if n > p.free.n {
		return nil
	}
	out := make([]*block, 0, n)
	for range n {
		b := p.free.popFront()
		p.maybeEvict(b)
		b.ref = 1
		out = append(out, b)
	}
	return out
}

// maybeEvict drops a reused block's hash from the cache and announces the removal.
func (p *blockPool) maybeEvict(b *block) {
	m := b.meta
	if m == nil {
		return
	}
	b.meta = nil
	list := p.cached[m.hash]
	for i, x := range list {
		if x == b {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(p.cached, m.hash)
	} else {
		p.cached[m.hash] = list
	}
	p.events = append(p.events, kvEvent{kind: evRemoved, hashes: []uint64{m.hash}, medium: mediumGPU})
}

// free releases blocks in the given order; blocks reaching ref 0 join the queue's tail, so the
// first ones given are evicted first (the caller passes a request's blocks tail-first).
func (p *blockPool) freeBlocks(bs []*block) {
	for _, b := range bs {
		b.ref--
		if b.ref == 0 && b.id != 0 {
			p.free.pushBack(b)
		}
	}
}

// cacheFull registers blocks[from:to] of a sequence as cached and emits one BlockStored for
// the run (vLLM cache_full_blocks).
func (p *blockPool) cacheFull(s *seqState, blocks []*block, from, to int, sessionID string) {
	if from >= to {
		return
	}
	ev := kvEvent{kind: evStored, medium: mediumGPU, blockSize: p.blockSize, sessionID: sessionID,
		loraName: s.loraName, loraID: s.loraID}
	if from > 0 {
		ev.parent, ev.hasParent = s.hashes[from-1], true
	}
	ev.tokens = s.tokens[from*p.blockSize : to*p.blockSize]
	metas := make([]*blockMeta, 0, to-from)
	for i := from; i < to; i++ {
		b := blocks[i]
		// A copy: a slice would pin the request's whole token array for as long as this
		// block stays cached (gigabytes with long agentic prompts).
		m := &blockMeta{hash: s.hashes[i], tokens: slices.Clone(s.tokens[i*p.blockSize : (i+1)*p.blockSize]),
			extra: s.extraKeys(i), loraName: s.loraName, loraID: s.loraID}
		if i > 0 {
			m.parent, m.hasParent = s.hashes[i-1], true
		}
		b.meta = m
		p.cached[m.hash] = append(p.cached[m.hash], b)
		ev.hashes = append(ev.hashes, m.hash)
		ev.extra = append(ev.extra, m.extra)
		metas = append(metas, m)
	}
	p.events = append(p.events, ev)
	if p.onCached != nil {
		p.onCached(metas)
	}
}

// announceHits re-announces a request's first n prefix-hit blocks as one BlockStored with no
// parent (vLLM emit_cached_block_events, kv_cache_report_mode "full", vllm/v1/core/block_pool.py).
func (p *blockPool) announceHits(s *seqState, n int, sessionID string) {
	ev := kvEvent{kind: evStored, medium: mediumGPU, blockSize: p.blockSize, sessionID: sessionID,
		loraName: s.loraName, loraID: s.loraID, hashes: slices.Clone(s.hashes[:n]), tokens: s.tokens[:n*p.blockSize]}
	for i := range n {
		ev.extra = append(ev.extra, s.extraKeys(i))
	}
	p.events = append(p.events, ev)
}

// reset drops every cached hash when no block is in use (vLLM reset_prefix_cache) and emits
// AllBlocksCleared without per-block removals; it reports false when blocks are still held.
func (p *blockPool) reset() bool {
	if p.free.n != len(p.blocks)-1 {
		return false
	}
	clear(p.cached)
	for i := range p.blocks {
		p.blocks[i].meta = nil
	}
	p.events = append(p.events, kvEvent{kind: evCleared})
	return true
}

// takeEvents drains the events of the current step.
func (p *blockPool) takeEvents() []kvEvent {
	ev := p.events
	p.events = nil
	return ev
}
