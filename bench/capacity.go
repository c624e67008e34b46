package bench

import "container/list"

// pooledLRU is the capacity reference next to the theoretical hit: one LRU cache of the fleet's
// whole GPU capacity (every worker's blocks pooled), fed the requests in the order kvbench sends
// them. Its hit is what a perfect router could capture if the fleet were one cache evicting least
// recently used blocks, so the gap between it and the theoretical (unlimited) hit is the reuse
// lost to capacity alone. It is a reference, not a proof: LRU is not the optimal eviction, and a
// real worker also holds running requests' decode blocks.
type pooledLRU struct {
	capacity int
	order    *list.List // front = most recently used; values are blockKey
	where    map[blockKey]*list.Element
}

// blockKey names a trace block within its namespace (repeated copies never share blocks).
type blockKey struct {
	ns string
	id int64
}

func newPooledLRU(capacity int) *pooledLRU {
	return &pooledLRU{capacity: capacity, order: list.New(), where: map[blockKey]*list.Element{}}
}

// touch returns the request's leading blocks the cache holds, then makes all of them resident,
// and returns the blocks it added (those it did not hold). The prompt's first blocks end most
// recent, as vLLM frees a finished request's blocks tail first
// (vllm/v1/core/single_type_kv_cache_manager.py, SingleTypeKVCacheManager.free).
func (c *pooledLRU) touch(ns string, ids []int64) (hit int, added []int64) {
	for hit < len(ids) {
		if _, ok := c.where[blockKey{ns, ids[hit]}]; !ok {
			break
		}
		hit++
	}
	for i := len(ids) - 1; i >= 0; i-- {
		k := blockKey{ns, ids[i]}
		if e, ok := c.where[k]; ok {
			c.order.MoveToFront(e)
			continue
		}
		c.where[k] = c.order.PushFront(k)
		added = append(added, ids[i])
	}
	for c.order.Len() > c.capacity {
		e := c.order.Back()
		delete(c.where, e.Value.(blockKey))
		c.order.Remove(e)
	}
	return hit, added
}

// forget drops blocks a request added that no worker computed (runner.unsee). What they
// evicted stays evicted: the reference errs towards a smaller hit.
func (c *pooledLRU) forget(ns string, ids []int64) {
	for _, id := range ids {
		k := blockKey{ns, id}
		if e, ok := c.where[k]; ok {
			delete(c.where, k)
			c.order.Remove(e)
		}
	}
}
