package engine

import (
	"container/list"
	"strings"
	"sync"

	"github.com/zeebo/xxh3"
)

// pieceCache maps short pre-tokens to their ids. It is sharded to keep lock contention low and
// bounded by entry count: a full shard is simply cleared (cheap, and pre-token frequencies are
// Zipfian, so the hot entries come back at once).
type pieceCache struct {
	shards   [16]pieceShard
	perShard int
}

type pieceShard struct {
	mu sync.RWMutex
	m  map[string][]uint32
}

// maxCachedPiece is the longest pre-token kept in the piece cache; longer ones are rare.
const maxCachedPiece = 128

func newPieceCache(entries int) *pieceCache {
	if entries <= 0 {
		return nil
	}
	c := &pieceCache{perShard: entries/16 + 1}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]uint32)
	}
	return c
}

func (c *pieceCache) shard(k string) *pieceShard {
	return &c.shards[xxh3.HashString(k)&15]
}

func (c *pieceCache) get(k string) ([]uint32, bool) {
	if c == nil || len(k) > maxCachedPiece {
		return nil, false
	}
	s := c.shard(k)
	s.mu.RLock()
	v, ok := s.m[k]
	s.mu.RUnlock()
	return v, ok
}

func (c *pieceCache) put(k string, ids []uint32) {
	if c == nil || len(k) > maxCachedPiece {
		return
	}
	v := append([]uint32(nil), ids...)
	s := c.shard(k)
	s.mu.Lock()
	if len(s.m) >= c.perShard {
		clear(s.m)
	}
	// Clone: k usually points into a large request text that must not be retained.
	s.m[strings.Clone(k)] = v
	s.mu.Unlock()
}

// segmentCache is an LRU of encoded segments (text between added tokens) bounded by bytes. A
// growing conversation re-sends the same messages every turn; each message is a segment, so only
// the new tail is encoded again.
type segmentCache struct {
	mu       sync.Mutex
	maxBytes int
	bytes    int
	ll       *list.List // front = most recent
	m        map[string]*list.Element
}

type segmentEntry struct {
	key string
	ids []uint32
}

// minCachedSegment is the shortest segment worth caching; shorter ones encode faster than the
// bookkeeping costs.
const minCachedSegment = 64

// segmentOverhead approximates the per-entry bookkeeping bytes (list element, map slot, headers).
const segmentOverhead = 128

func newSegmentCache(maxBytes int) *segmentCache {
	if maxBytes <= 0 {
		return nil
	}
	return &segmentCache{maxBytes: maxBytes, ll: list.New(), m: make(map[string]*list.Element)}
}

func entrySize(key string, ids []uint32) int { return len(key) + 4*len(ids) + segmentOverhead }

func (c *segmentCache) get(k string) ([]uint32, bool) {
	if c == nil || len(k) < minCachedSegment {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.m[k]
	if !ok {
		return nil, false
	}
	c.ll.MoveToFront(el)
	return el.Value.(*segmentEntry).ids, true
}

func (c *segmentCache) put(k string, ids []uint32) {
	if c == nil || len(k) < minCachedSegment {
		return
	}
	size := entrySize(k, ids)
	if size > c.maxBytes/4 {
		return // one giant segment must not flush everything else
	}
	e := &segmentEntry{key: strings.Clone(k), ids: append([]uint32(nil), ids...)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; ok {
		return
	}
	c.m[e.key] = c.ll.PushFront(e)
	c.bytes += size
	for c.bytes > c.maxBytes {
		last := c.ll.Back()
		old := last.Value.(*segmentEntry)
		c.ll.Remove(last)
		delete(c.m, old.key)
		c.bytes -= entrySize(old.key, old.ids)
	}
}

// stats reports the entry count and accounted bytes.
func (c *segmentCache) stats() (entries, bytes int) {
	if c == nil {
		return 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len(), c.bytes
}
