package indexers

import (
	"sync"
	"sync/atomic"

	"github.com/kvgate/kvgate/kvkey"
)

// extEntry maps one of the worker's opaque block hashes to our node, with the worker's own
// reference count per tier (the same hash can be stored by two physical blocks: vLLM's
// prefix cache does not deduplicate, vllm/v1/core/block_pool.py).
// While an entry exists its node has references, so the node index stays valid.
type extEntry struct {
	node int32
	refs [numTiers]int32
}

// node is one of our block hashes on one target, kept in a slab so parent links are indexes
// rather than map lookups. res counts references per tier (several external hashes or
// duplicate stores can name it); kids counts resident children per nested set, kept while the
// node itself is absent so orphan accounting stays exact. A node lives while res or kids is
// non-zero.
type node struct {
	our    kvkey.BlockHash
	parent int32 // slab index of the parent node, -1 for a root
	res    [numTiers]int32
	kids   [numTiers]int32
}

// memberMask returns the nested sets (bit k: G1..G(k+1)) the node belongs to.
func (n *node) memberMask() uint8 {
	switch {
	case n.res[0] > 0:
		return 0b111
	case n.res[1] > 0:
		return 0b110
	case n.res[2] > 0:
		return 0b100
	}
	return 0
}

func (n *node) member(k int) bool { return n.memberMask()&(1<<k) != 0 }

func (n *node) dead() bool { return n.res == [numTiers]int32{} && n.kids == [numTiers]int32{} }

// targetState is one worker+rank's view. Maps and slab are owned by whoever holds mu; the
// atomics are read by queries and metrics without it.
type targetState struct {
	ix     *Index
	target kvkey.Target
	slot   int
	// firstRouted is when a prompt with a full block was first routed here (unix nanos; 0:
	// none yet): from then on the worker should publish KV events (silence.go).
	firstRouted atomic.Int64

	mu     sync.Mutex
	ext    map[kvkey.EngineHash]extEntry
	byOur  map[kvkey.BlockHash]int32
	slab   []node
	free   []int32
	groups uint64 // group_idx values whose stores were accepted (removals of others are ignored)
	// recent remembers removed hashes once the worker has shown a lower tier (lowerTiers):
	// workers without CPU offload never need it and do not pay for it on every removal.
	recent     recentRemoved
	lowerTiers bool
	buf        []byte
	keys       []uint64
	out        [numTiers][]kvkey.BlockHash // scratch: blocks that became resident or left, per tier
	run        []kvkey.BlockHash           // scratch: a store's whole run in chain order
	// cs records the changes of the ApplyTo/ResetTo in progress (nil: none), under mu.
	cs     *ChangeSet
	locals []uint64 // scratch: a store's local block hashes

	// routedQ (own lock, written by request goroutines) and routed (under mu) remember recently
	// routed prompts for chain recovery; anchors are the parents placed by recovery (see
	// recoverParent). All three survive a reset: that is when they are needed.
	routedQ routedQueue
	routed  routedMemory
	anchors map[kvkey.EngineHash]anchor

	// orphans[k] counts members of nested set k whose parent is not a member. While it is zero,
	// membership of block i of a query implies membership of blocks 0..i-1, which lets Match
	// bisect instead of scanning.
	orphans  [numTiers]atomic.Int64
	resident [numTiers]atomic.Int64 // blocks with a reference in tier t
	version  atomic.Uint64
	stats    targetStats
}

func newTargetState(ix *Index, t kvkey.Target, slot int) *targetState {
	ts := &targetState{ix: ix, target: t, slot: slot, buf: make([]byte, 0, 4*ix.opt.BlockSize+8*16)}
	ts.clearMaps()
	return ts
}

func (ts *targetState) clearMaps() {
	ts.ext = map[kvkey.EngineHash]extEntry{}
	ts.anchors = map[kvkey.EngineHash]anchor{}
	ts.byOur = map[kvkey.BlockHash]int32{}
	ts.slab = ts.slab[:0]
	ts.free = ts.free[:0]
}

// blocks returns the number of live nodes.
func (ts *targetState) blocks() int { return len(ts.byOur) }

// nodeFor returns the node of our hash, creating it under parent if absent. An existing node
// that is in no set takes the parent given now (its old parent may have been freed).
func (ts *targetState) nodeFor(our kvkey.BlockHash, parent int32) int32 {
	if i, ok := ts.byOur[our]; ok {
		if ts.slab[i].memberMask() == 0 {
			ts.slab[i].parent = parent
		}
		return i
	}
	var i int32
	if n := len(ts.free); n > 0 {
		i = ts.free[n-1]
		ts.free = ts.free[:n-1]
	} else {
		ts.slab = append(ts.slab, node{})
		i = int32(len(ts.slab) - 1)
	}
	ts.slab[i] = node{our: our, parent: parent}
	ts.byOur[our] = i
	return i
}

func (ts *targetState) maybeFree(i int32) {
	if n := &ts.slab[i]; n.dead() {
		delete(ts.byOur, n.our)
		n.parent = -1
		ts.free = append(ts.free, i)
	}
}

// applyStored indexes one BlockStored (vllm/v1/core/block_pool.py, _build_block_stored_event).
func (ts *targetState) applyStored(e *BlockStored) {
	tier, ok := TierOf(e.Medium)
	if !ok {
		ts.stats.drop(dropMedium, len(e.BlockHashes))
		return
	}
	if e.Locality.Set && e.Locality.V != "LOCAL" {
		ts.stats.drop(dropRemote, len(e.BlockHashes))
		return
	}
	if !mainAttentionKind(e.KVCacheSpecKind) {
		ts.stats.drop(dropKind, len(e.BlockHashes))
		return
	}
	if e.GroupIdx.V >= 0 && e.GroupIdx.V < 64 {
		ts.groups |= 1 << e.GroupIdx.V
	}
	if !validChain(e) {
		ts.stats.drop(dropInvalid, len(e.BlockHashes))
		return
	}
	ts.stats.events[kindStored][tier].Add(1)
	if tier != G1 {
		ts.lowerTiers = true
	}
	if len(e.TokenIDs) == 0 {
		ts.storeTokenless(e, tier)
		return
	}
	bs := ts.ix.opt.BlockSize
	if int(e.BlockSize) != bs {
		ts.stats.drop(dropBlockSize, len(e.BlockHashes))
		return
	}
	if len(e.TokenIDs) != len(e.BlockHashes)*bs {
		ts.stats.drop(dropInvalid, len(e.BlockHashes))
		return
	}
	seed := kvkey.LocalSeed(e.LoRAName.V)
	locals := ts.locals[:0]
	for i := range e.BlockHashes {
		ts.keys = ts.keys[:0]
		if i < len(e.ExtraKeys) && e.ExtraKeys[i] != nil {
			ts.keys = foldExtraKeys(e.ExtraKeys[i], e.LoRAName.V, ts.keys)
		}
		locals = append(locals, kvkey.LocalBlockHash(e.TokenIDs[i*bs:(i+1)*bs], ts.keys, seed, ts.buf[:0]))
	}
	ts.locals = locals
	var parentOur kvkey.BlockHash
	parent := int32(-1)
	hasParent := false
	var prefix []kvkey.BlockHash // set when the parent was recovered: our hashes of blocks 0..k-1
	if e.ParentBlockHash.Set {
		if pe, ok := ts.ext[e.ParentBlockHash.V.Engine()]; ok {
			parent, parentOur = pe.node, ts.slab[pe.node].our
		} else if prefix, ok = ts.recoverParent(locals); ok {
			parentOur = prefix[len(prefix)-1]
			ts.stats.recovered.Add(1)
		} else {
			// Without the parent's hash of ours the chain cannot be computed; indexing the run
			// as a new root would invent matches for prompts that start with these tokens.
			// Drop it, counted; its
			// descendants will be dropped the same way.
			ts.stats.unrecovered.Add(1)
			ts.stats.drop(dropParentNotFound, len(e.BlockHashes))
			return
		}
		hasParent = true
	}
	runParent := parentOur
	if ts.blocks()+len(e.BlockHashes)+len(prefix) > ts.ix.opt.MaxBlocksPerTarget {
		ts.stats.drop(dropCapacity, len(e.BlockHashes))
		return
	}
	stored := ts.out[tier][:0]
	if prefix != nil {
		parent, stored = ts.anchor(e.ParentBlockHash.V.Engine(), prefix, tier, stored)
	}
	run := ts.run[:0]
	for i, h := range e.BlockHashes {
		local := locals[i]
		our := kvkey.BlockHash(local) // a root block: its chained hash is its local hash (kvkey.SequenceHashes)
		if parent >= 0 {
			our = kvkey.ChainHash(parentOur, local)
		}
		var became bool
		parent, became = ts.storeOne(h.Engine(), our, parent, tier)
		if became {
			stored = append(stored, our)
		}
		run = append(run, our)
		parentOur = our
	}
	ts.out[tier], ts.run = stored, run
	ts.stats.blocks[kindStored][tier].Add(int64(len(e.BlockHashes)))
	if cs := ts.cs; cs != nil {
		if len(stored) > 0 {
			cs.add(Change{Kind: ChangeStored, Tier: tier}, stored)
		}
		cs.add(Change{Kind: ChangeStoredRun, Tier: tier, Parent: runParent, HasParent: hasParent,
			SessionID: e.SessionID.V}, run)
	}
}

// anchor is a parent placed by chain recovery: the worker's hash of it is known (the store's
// parent_block_hash), those of the blocks before it are not. nodes are the blocks before it,
// which hold one reference each in tier for as long as the anchor is resident there.
type anchor struct {
	tier  Tier
	nodes []int32
}

// recoverParent finds where a store whose parent is unknown sits, from the prompts recently
// routed to this target: our hashes of every block before its first (see routedMemory.find).
func (ts *targetState) recoverParent(locals []uint64) ([]kvkey.BlockHash, bool) {
	budget := ts.ix.opt.RoutedBlocks
	if budget <= 0 {
		return nil, false
	}
	ts.routed.sync(&ts.routedQ, budget)
	return ts.routed.find(locals)
}

// anchor makes a recovered parent known: the worker's hash ext names our prefix[len-1],
// resident in tier (vLLM stores a block only while its parent is cached, and the request that
// computed it holds its whole prefix). The blocks before it, whose worker hashes are unknown so
// that no event can name them, are made resident in tier too, but only as long as the anchor
// stays there: its removal, a clear of the tier or a reset takes them away again. It returns
// the anchor's node and stored with the blocks that became resident appended.
func (ts *targetState) anchor(ext kvkey.EngineHash, prefix []kvkey.BlockHash, tier Tier, stored []kvkey.BlockHash) (int32, []kvkey.BlockHash) {
	parent := int32(-1)
	var nodes []int32
	if n := len(prefix) - 1; n > 0 {
		nodes = make([]int32, 0, n)
	}
	for _, h := range prefix[:len(prefix)-1] {
		our := h
		i := ts.nodeFor(our, parent)
		if ts.ref(i, tier) {
			stored = append(stored, our)
		}
		nodes = append(nodes, i)
		parent = i
	}
	our := prefix[len(prefix)-1]
	i, became := ts.storeOne(ext, our, parent, tier)
	if became {
		stored = append(stored, our)
	}
	if len(nodes) > 0 {
		ts.anchors[ext] = anchor{tier: tier, nodes: nodes}
	}
	return i, stored
}

// releaseAnchor drops the prefix references of the anchor ext once it left tier; it appends
// the blocks that stopped being resident to removed.
func (ts *targetState) releaseAnchor(ext kvkey.EngineHash, tier Tier, removed []kvkey.BlockHash) []kvkey.BlockHash {
	a, ok := ts.anchors[ext]
	if !ok || a.tier != tier {
		return removed
	}
	delete(ts.anchors, ext)
	for j := len(a.nodes) - 1; j >= 0; j-- {
		i := a.nodes[j]
		our := ts.slab[i].our
		if ts.unref(i, tier) {
			removed = append(removed, our)
		}
	}
	return removed
}

// validChain rejects a store whose hashes repeat or reference the parent (Dynamo's
// self-reference check): applying it could make a block its own ancestor.
func validChain(e *BlockStored) bool {
	for i, h := range e.BlockHashes {
		if e.ParentBlockHash.Set && h.U == e.ParentBlockHash.V.U {
			return false
		}
		for _, g := range e.BlockHashes[:i] {
			if g.U == h.U {
				return false
			}
		}
		if i > 8 { // long runs: duplicates inside are vanishingly rare; keep this O(n)
			break
		}
	}
	return true
}

// storeTokenless resolves CPU/disk placeholder stores (no tokens, block_size 0, from vLLM's offloading connector)
// through the worker's earlier stores of the same hash.
func (ts *targetState) storeTokenless(e *BlockStored, tier Tier) {
	stored := ts.out[tier][:0]
	for _, h := range e.BlockHashes {
		var our kvkey.BlockHash
		var parent int32
		if x, ok := ts.ext[h.Engine()]; ok {
			n := &ts.slab[x.node]
			our, parent = n.our, n.parent
		} else if our, parent, ok = ts.resolveRemoved(h.Engine()); !ok {
			ts.stats.drop(dropUnresolved, 1)
			continue
		}
		if _, became := ts.storeOne(h.Engine(), our, parent, tier); became {
			stored = append(stored, our)
		}
	}
	ts.out[tier] = stored
	ts.stats.blocks[kindStored][tier].Add(int64(len(e.BlockHashes)))
	if cs := ts.cs; cs != nil && len(stored) > 0 {
		cs.add(Change{Kind: ChangeStored, Tier: tier}, stored)
	}
}

// resolveRemoved finds a worker hash whose last reference was removed recently (the GPU copy
// evicted before the CPU offload's placeholder store arrived): our hash and the parent node,
// re-created outside every set if it is gone too, so the block keeps its chain position.
func (ts *targetState) resolveRemoved(ext kvkey.EngineHash) (our kvkey.BlockHash, parent int32, ok bool) {
	b, ok := ts.recent.take(ext)
	if !ok {
		return 0, -1, false
	}
	parent = -1
	if b.hasParent {
		if i, found := ts.byOur[b.parentOur]; found {
			parent = i
		} else {
			parent = ts.nodeFor(b.parentOur, -1)
		}
	}
	return b.our, parent, true
}

// rememberRemoved records a worker hash whose last reference is about to go; node i must still
// be a member of some set (so its parent index is valid).
func (ts *targetState) rememberRemoved(ext kvkey.EngineHash, i int32) {
	n := &ts.slab[i]
	b := removedBlock{our: n.our}
	if n.parent >= 0 {
		b.parentOur, b.hasParent = ts.slab[n.parent].our, true
	}
	ts.recent.record(ts.ix.opt.RecentlyRemoved, ext, b)
}

// rememberRemovals reports whether removed hashes should be remembered: only for a worker that
// has stored blocks in a lower tier (its first offloads may miss evictions that came before).
func (ts *targetState) rememberRemovals() bool { return ts.lowerTiers && ts.ix.opt.RecentlyRemoved > 0 }

// storeOne adds one reference; it returns the node and whether the block became resident in
// the tier.
func (ts *targetState) storeOne(ext kvkey.EngineHash, our kvkey.BlockHash, parent int32, tier Tier) (int32, bool) {
	x, ok := ts.ext[ext]
	if ok && ts.slab[x.node].our != our {
		// The worker reuses a hash for different content: its earlier state is stale.
		ts.stats.drop(dropConflict, 1)
		old := x.node
		for t := range Tier(numTiers) {
			for range x.refs[t] {
				ts.unref(old, t)
			}
			if x.refs[t] > 0 {
				ts.releaseAnchor(ext, t, nil)
			}
		}
		ok = false
		if parent == old { // cannot happen for a valid chain; keep the slab consistent anyway
			parent = -1
		}
	}
	if !ok {
		x = extEntry{node: ts.nodeFor(our, parent)}
	}
	x.refs[tier]++
	ts.ext[ext] = x
	return x.node, ts.ref(x.node, tier)
}

// ref adds one tier reference to node i and maintains set membership and orphan counts.
func (ts *targetState) ref(i int32, tier Tier) bool {
	n := &ts.slab[i]
	before := n.memberMask()
	n.res[tier]++
	if joined := n.memberMask() &^ before; joined != 0 {
		ts.transition(i, joined, true)
	}
	if n.res[tier] == 1 {
		ts.resident[tier].Add(1)
		return true
	}
	return false
}

// unref drops one tier reference of node i; it reports whether the block left the tier.
func (ts *targetState) unref(i int32, tier Tier) bool {
	n := &ts.slab[i]
	if n.res[tier] == 0 {
		return false
	}
	before := n.memberMask()
	n.res[tier]--
	left := n.res[tier] == 0
	if gone := before &^ n.memberMask(); gone != 0 {
		ts.transition(i, gone, false)
	}
	if left {
		ts.resident[tier].Add(-1)
	}
	ts.maybeFree(i)
	return left
}

// transition moves node i into (join) or out of the nested sets in mask: one global update,
// the parent's child counts and the orphan counts.
func (ts *targetState) transition(i int32, mask uint8, join bool) {
	n := &ts.slab[i]
	ts.ix.setBits(n.our, ts.slot, mask, join)
	p := n.parent
	sign := int32(1)
	if !join {
		sign = -1
	}
	for k := range numTiers {
		if mask&(1<<k) == 0 {
			continue
		}
		if p >= 0 {
			pn := &ts.slab[p]
			pn.kids[k] += sign
			if !pn.member(k) {
				ts.orphans[k].Add(int64(sign))
			}
		}
		// This node's resident children stop (join) or start (leave) being orphans.
		if c := n.kids[k]; c > 0 {
			ts.orphans[k].Add(-int64(sign * c))
		}
	}
	if p >= 0 && !join {
		ts.maybeFree(p)
	}
}

// applyRemoved drops one reference per listed hash in the event's tier.
func (ts *targetState) applyRemoved(e *BlockRemoved) {
	tier, ok := TierOf(e.Medium)
	if !ok {
		ts.stats.drop(dropMedium, len(e.BlockHashes))
		return
	}
	if e.Locality.Set && e.Locality.V != "LOCAL" {
		ts.stats.drop(dropRemote, len(e.BlockHashes))
		return
	}
	if g := e.GroupIdx.V; e.GroupIdx.Set && g > 0 && (g >= 64 || ts.groups&(1<<g) == 0) {
		// A group whose stores we never indexed (sliding window, mamba): its removals must not
		// touch blocks of the attention group that happen to share the hash value.
		ts.stats.drop(dropKind, len(e.BlockHashes))
		return
	}
	ts.stats.events[kindRemoved][tier].Add(1)
	removed := ts.out[tier][:0]
	for _, h := range e.BlockHashes {
		x, ok := ts.ext[h.Engine()]
		if !ok || x.refs[tier] == 0 {
			ts.stats.drop(dropNotFound, 1)
			continue
		}
		x.refs[tier]--
		if x.refs == [numTiers]int32{} {
			if ts.rememberRemovals() {
				ts.rememberRemoved(h.Engine(), x.node)
			}
			delete(ts.ext, h.Engine())
		} else {
			ts.ext[h.Engine()] = x
		}
		our := ts.slab[x.node].our
		if ts.unref(x.node, tier) {
			removed = append(removed, our)
		}
		if x.refs[tier] == 0 {
			removed = ts.releaseAnchor(h.Engine(), tier, removed)
		}
		ts.stats.blocks[kindRemoved][tier].Add(1)
	}
	ts.out[tier] = removed
	ts.version.Add(1)
	if cs := ts.cs; cs != nil && len(removed) > 0 {
		cs.add(Change{Kind: ChangeRemoved, Tier: tier}, removed)
	}
}

// clearTier drops every reference in one tier (AllBlocksCleared clears the GPU prefix cache of
// this worker+rank only; host and disk tiers survive: vLLM's block pool gives no medium).
func (ts *targetState) clearTier(tier Tier) {
	for h, x := range ts.ext {
		if x.refs[tier] == 0 {
			continue
		}
		rest := x.refs
		rest[tier] = 0
		last := rest == [numTiers]int32{}
		if last && ts.rememberRemovals() {
			ts.rememberRemoved(h, x.node)
		}
		for range x.refs[tier] {
			ts.unref(x.node, tier)
		}
		ts.releaseAnchor(h, tier, nil)
		x.refs[tier] = 0
		if last {
			delete(ts.ext, h)
		} else {
			ts.ext[h] = x
		}
	}
	ts.version.Add(1)
	if cs := ts.cs; cs != nil {
		cs.add(Change{Kind: ChangeCleared, Tier: tier}, nil)
	}
}

// resetLocked forgets the target entirely (all tiers).
func (ts *targetState) resetLocked() {
	for _, i := range ts.byOur {
		if m := ts.slab[i].memberMask(); m != 0 {
			ts.ix.setBits(ts.slab[i].our, ts.slot, m, false)
		}
	}
	ts.clearMaps()
	ts.groups = 0
	ts.recent.reset()
	for k := range numTiers {
		ts.orphans[k].Store(0)
		ts.resident[k].Store(0)
	}
	ts.version.Add(1)
	ts.stats.resets.Add(1)
	if cs := ts.cs; cs != nil {
		cs.add(Change{Kind: ChangeCleared, AllTiers: true}, nil)
		cs.seal()
	}
}
