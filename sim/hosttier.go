package sim

import "container/list"

// hostTier simulates CPU offload (vLLM's OffloadingConnector with its LRU manager): every
// computed block is copied to a host-memory LRU, so blocks the GPU pool evicts can be loaded
// back on a prefix hit for less than recomputing them.
type hostTier struct {
	capacity int
	full     bool       // self-describing events instead of token-less placeholders
	lru      *list.List // of *blockMeta, front = most recently used
	index    map[uint64]*list.Element
	events   []kvEvent
}

func newHostTier(capacity int, fullEvents bool) *hostTier {
	return &hostTier{capacity: capacity, full: fullEvents, lru: list.New(), index: make(map[uint64]*list.Element)}
}

// store keeps a copy of newly computed GPU blocks, as vLLM's OffloadingConnector does
// (write-through, so a block the GPU evicts later is still on the host). Blocks already held are
// only touched. Like the connector it announces one CPU BlockRemoved for the LRU blocks it evicts
// to make room, then one CPU BlockStored for the new blocks.
func (h *hostTier) store(metas []*blockMeta) {
	var fresh []*blockMeta
	for _, m := range metas {
		if e, ok := h.index[m.hash]; ok {
			h.lru.MoveToFront(e)
			continue
		}
		fresh = append(fresh, m)
	}
	if len(fresh) == 0 {
		return
	}
	if len(fresh) > h.capacity {
		fresh = fresh[len(fresh)-h.capacity:] // keep the newest; older ones would be evicted at once
	}
	var evicted []uint64
	for h.lru.Len()+len(fresh) > h.capacity {
		om := h.lru.Remove(h.lru.Back()).(*blockMeta)
		delete(h.index, om.hash)
		evicted = append(evicted, om.hash)
	}
	if len(evicted) > 0 {
		h.events = append(h.events, kvEvent{kind: evRemoved, hashes: evicted, medium: mediumCPU})
	}
	ev := kvEvent{kind: evStored, medium: mediumCPU, placeholder: !h.full}
	for _, m := range fresh {
		h.index[m.hash] = h.lru.PushFront(m)
		ev.hashes = append(ev.hashes, m.hash)
	}
	if h.full {
		first := fresh[0]
		ev.parent, ev.hasParent = first.parent, first.hasParent
		ev.blockSize = len(first.tokens)
		ev.loraName, ev.loraID = first.loraName, first.loraID
		for _, m := range fresh {
			ev.tokens = append(ev.tokens, m.tokens...)
			ev.extra = append(ev.extra, m.extra)
		}
	}
	h.events = append(h.events, ev)
}

// has reports whether hash is resident and marks it used.
func (h *hostTier) has(hash uint64) bool {
	e, ok := h.index[hash]
	if ok {
		h.lru.MoveToFront(e)
	}
	return ok
}

// reset drops everything silently (an engine restart).
func (h *hostTier) reset() {
	h.lru.Init()
	clear(h.index)
	h.events = nil
}

func (h *hostTier) takeEvents() []kvEvent {
	ev := h.events
	h.events = nil
	return ev
}
