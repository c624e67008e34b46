package indexers

import (
	"math/bits"
	"sync"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// ApproxIndex predicts which blocks each target holds from the gateway's own routing decisions,
// for targets whose KV events are absent or down (approximate mode, as Dynamo's
// --no-router-kv-events and SGLang's cache-aware tree). Blocks routed to a target are assumed
// resident until TTL after their last use or until the target's block budget pushes them out,
// least recently used first. Within one request the deepest blocks count as the least recent,
// so a budget eviction trims sequences from the tail, as vLLM's free queue does, and never
// punches a hole at the start of a prefix. Safe for concurrent use; matches share a read lock.
type ApproxIndex struct {
	mu      sync.RWMutex
	ttl     time.Duration
	budget  int
	now     func() time.Time
	bit     map[kvkey.Target]int
	targets []*approxTarget
	free    []int // bits of removed targets, reused before the bitsets grow
	blocks  map[kvkey.BlockHash]*approxBlock
}

// approxTarget is one target's LRU list of assumed-resident blocks (head = most recent).
type approxTarget struct {
	head, tail *approxNode
	n          int
}

// approxNode is one (target, block) residency.
type approxNode struct {
	hash       kvkey.BlockHash
	bit        int
	touched    time.Time
	prev, next *approxNode
}

// approxBlock is one block hash: the set of targets assumed to hold it, as a bitset over target
// bits (so a match walks the prompt once for all targets), and their LRU nodes.
type approxBlock struct {
	bits  []uint64
	nodes []*approxNode
}

// NewApproxIndex returns an empty index with the given TTL and per-target block budget
// (router/routerconfig.Approx holds the configured values).
func NewApproxIndex(ttl time.Duration, budget int) *ApproxIndex {
	return &ApproxIndex{
		ttl:    ttl,
		budget: budget,
		now:    time.Now,
		bit:    make(map[kvkey.Target]int),
		blocks: make(map[kvkey.BlockHash]*approxBlock),
	}
}

// Record notes that the prompt with these chained block hashes was routed to t.
func (a *ApproxIndex) Record(t kvkey.Target, hashes []kvkey.BlockHash) {
	if len(hashes) == 0 {
		return
	}
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.bit[t]
	if !ok {
		if n := len(a.free); n > 0 {
			b, a.free = a.free[n-1], a.free[:n-1]
		} else {
			b = len(a.targets)
			a.targets = append(a.targets, &approxTarget{})
		}
		a.bit[t] = b
	}
	at := a.targets[b]
	// Deepest first, so that block 0 ends up the most recent of this prompt.
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		blk := a.blocks[h]
		if blk == nil {
			blk = &approxBlock{}
			a.blocks[h] = blk
		}
		if n := blk.node(b); n != nil {
			n.touched = now
			at.unlink(n)
			at.pushFront(n)
			continue
		}
		n := &approxNode{hash: h, bit: b, touched: now}
		blk.add(n)
		at.pushFront(n)
	}
	for at.n > a.budget {
		a.remove(at, at.tail)
	}
	a.expireLocked(at, now)
}

// MatchTiers implements Matcher: out[i].G1 is how many leading blocks of hashes are assumed
// resident on targets[i] (0 for a target never recorded); approximate mode predicts no host or
// disk tier, so G2 and G3 stay 0. len(out) must be len(targets).
func (a *ApproxIndex) MatchTiers(hashes []kvkey.BlockHash, targets []kvkey.Target, out []TierMatch) {
	clear(out)
	if len(hashes) == 0 {
		return
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	first := a.blocks[hashes[0]]
	if first == nil {
		return
	}
	nw := len(first.bits)
	var buf [4]uint64
	cur := buf[:0]
	if nw > len(buf) {
		cur = make([]uint64, 0, nw)
	}
	cur = append(cur, first.bits...)
	// depth[bit] is where a target dropped out, -1 while it has not.
	var depthBuf [64]int32
	depth := depthBuf[:0]
	if len(a.targets) > len(depthBuf) {
		depth = make([]int32, 0, len(a.targets))
	}
	for range a.targets {
		depth = append(depth, -1)
	}
	alive := 0
	for _, w := range cur {
		alive += bits.OnesCount64(w)
	}
	for i := 1; i < len(hashes) && alive > 0; i++ {
		blk := a.blocks[hashes[i]]
		for w := range cur {
			var next uint64
			if blk != nil && w < len(blk.bits) {
				next = cur[w] & blk.bits[w]
			}
			for dropped := cur[w] &^ next; dropped != 0; dropped &= dropped - 1 {
				depth[w*64+bits.TrailingZeros64(dropped)] = int32(i)
				alive--
			}
			cur[w] = next
		}
	}
	for i, t := range targets {
		b, ok := a.bit[t]
		if !ok {
			continue
		}
		if depth[b] >= 0 {
			out[i].G1 = int(depth[b])
		} else if b/64 < len(cur) && cur[b/64]&(1<<(b%64)) != 0 {
			out[i].G1 = len(hashes)
		}
	}
}

// Resident returns how many blocks are assumed resident on t.
func (a *ApproxIndex) Resident(t kvkey.Target) int {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if b, ok := a.bit[t]; ok {
		return a.targets[b].n
	}
	return 0
}

// Expire drops every residency not used for TTL; it returns how many it dropped.
func (a *ApproxIndex) Expire() int {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, at := range a.targets {
		n += a.expireLocked(at, now)
	}
	return n
}

// Forget drops everything assumed about t (e.g. the worker restarted or was removed).
func (a *ApproxIndex) Forget(t kvkey.Target) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if b, ok := a.bit[t]; ok {
		at := a.targets[b]
		for at.tail != nil {
			a.remove(at, at.tail)
		}
	}
}

// RemoveTarget forgets t and frees its bit for the next new target, so that a fleet whose
// workers come and go (discovery) does not widen every block's bitset without bound.
func (a *ApproxIndex) RemoveTarget(t kvkey.Target) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.bit[t]
	if !ok {
		return
	}
	at := a.targets[b]
	for at.tail != nil {
		a.remove(at, at.tail)
	}
	delete(a.bit, t)
	a.free = append(a.free, b)
}

func (a *ApproxIndex) expireLocked(at *approxTarget, now time.Time) int {
	n := 0
	cutoff := now.Add(-a.ttl)
	for at.tail != nil && at.tail.touched.Before(cutoff) {
		a.remove(at, at.tail)
		n++
	}
	return n
}

func (a *ApproxIndex) remove(at *approxTarget, n *approxNode) {
	at.unlink(n)
	blk := a.blocks[n.hash]
	if blk != nil && blk.del(n) {
		delete(a.blocks, n.hash)
	}
}

func (at *approxTarget) pushFront(n *approxNode) {
	n.prev, n.next = nil, at.head
	if at.head != nil {
		at.head.prev = n
	}
	at.head = n
	if at.tail == nil {
		at.tail = n
	}
	at.n++
}

func (at *approxTarget) unlink(n *approxNode) {
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		at.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		at.tail = n.prev
	}
	n.prev, n.next = nil, nil
	at.n--
}

func (blk *approxBlock) node(bit int) *approxNode {
	for _, n := range blk.nodes {
		if n.bit == bit {
			return n
		}
	}
	return nil
}

func (blk *approxBlock) add(n *approxNode) {
	w := n.bit / 64
	for len(blk.bits) <= w {
		blk.bits = append(blk.bits, 0)
	}
	blk.bits[w] |= 1 << (n.bit % 64)
	blk.nodes = append(blk.nodes, n)
}

// del removes n and reports whether the block is now held by no target.
func (blk *approxBlock) del(n *approxNode) bool {
	blk.bits[n.bit/64] &^= 1 << (n.bit % 64)
	for i, m := range blk.nodes {
		if m == n {
			last := len(blk.nodes) - 1
			blk.nodes[i] = blk.nodes[last]
			blk.nodes[last] = nil
			blk.nodes = blk.nodes[:last]
			break
		}
	}
	return len(blk.nodes) == 0
}
