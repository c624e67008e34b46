package indexers

import (
	"sync"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// DefaultRoutedBlocks is how many blocks of recently routed prompts each target remembers by
// default (Options.RoutedBlocks): 256 KiB of hashes per target, about 1 MiB once indexed.
const DefaultRoutedBlocks = 16384

// maxRecoveryWalk bounds how many remembered occurrences of one block are examined per
// recovery, so a block shared by every prompt (a system prompt) costs a bounded walk.
const maxRecoveryWalk = 64

// NoteRouted tells the index that a prompt was routed to target t: local are the local hashes
// of its full blocks and seq their chained sequence hashes (kvkey.LocalHashes and
// kvkey.SequenceHashes; seq is what Match takes). The index keeps the most recent
// Options.RoutedBlocks blocks of such prompts per target so that a BlockStored whose parent it
// does not know (lost with a reset whose replay no longer reaches back) can be placed under
// the prompt that produced it instead of being dropped.
//
// It is cheap (one short critical section, no hashing, no map operation): the prompts are
// indexed only when a store needs them. The index keeps references to local and seq; the
// caller must not modify them afterwards. Unknown targets and malformed input are ignored.
func (ix *Index) NoteRouted(t kvkey.Target, local []uint64, seq []kvkey.BlockHash) {
	if len(local) == 0 || len(local) != len(seq) {
		return
	}
	ts := ix.reg.Load().byTarget[t]
	if ts == nil {
		return
	}
	if ts.firstRouted.Load() == 0 {
		ts.firstRouted.CompareAndSwap(0, time.Now().UnixNano())
	}
	budget := ix.opt.RoutedBlocks
	if budget <= 0 {
		return
	}
	if len(local) > budget {
		local, seq = local[:budget], seq[:budget]
	}
	ts.routedQ.push(routedPrompt{local: local, seq: seq}, budget)
}

// ChainRecoveries returns how many stores with an unknown parent target t had placed under a
// recently routed prompt (recovered) and how many it could not place and dropped as
// parent_not_found (failed).
func (ix *Index) ChainRecoveries(t kvkey.Target) (recovered, failed int64) {
	if ts := ix.reg.Load().byTarget[t]; ts != nil {
		return ts.stats.recovered.Load(), ts.stats.unrecovered.Load()
	}
	return 0, 0
}

type routedPrompt struct {
	local []uint64
	seq   []kvkey.BlockHash
}

// routedQueue holds prompts routed since the last recovery, written by request goroutines. It is
// bounded by the block budget (oldest out first) and has its own lock, so routing never waits
// for an event batch being applied.
type routedQueue struct {
	mu     sync.Mutex
	q      []routedPrompt
	head   int
	blocks int
}

func (q *routedQueue) push(p routedPrompt, budget int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if n := len(q.q); n > q.head {
		// The same prompt routed twice in a row (retries, benchmarks) is remembered once.
		if last := q.q[n-1]; len(last.seq) == len(p.seq) && last.seq[len(last.seq)-1] == p.seq[len(p.seq)-1] {
			return
		}
	}
	q.q = append(q.q, p)
	q.blocks += len(p.local)
	for q.blocks > budget && q.head < len(q.q)-1 {
		q.blocks -= len(q.q[q.head].local)
		q.q[q.head] = routedPrompt{}
		q.head++
	}
	if q.head > 32 && q.head > len(q.q)/2 {
		n := copy(q.q, q.q[q.head:])
		clear(q.q[n:])
		q.q = q.q[:n]
		q.head = 0
	}
}

// take appends the queued prompts, oldest first, to dst and empties the queue.
func (q *routedQueue) take(dst []routedPrompt) []routedPrompt {
	q.mu.Lock()
	defer q.mu.Unlock()
	dst = append(dst, q.q[q.head:]...)
	clear(q.q)
	q.q = q.q[:0]
	q.head = 0
	q.blocks = 0
	return dst
}

// occ is one remembered occurrence of a local hash: block k of record id (id 0: none).
type occ struct {
	id uint64
	k  int32
}

// routedRec is one remembered prompt. links[k] is the previous occurrence of local[k] when this
// record was indexed, so all occurrences of a local hash form a chain from byLocal.
type routedRec struct {
	id         uint64
	used       uint64 // recency stamp
	local      []uint64
	seq        []kvkey.BlockHash
	links      []occ
	prev, next *routedRec // LRU list, newest first
}

type routedKey struct {
	last kvkey.BlockHash
	n    int
}

// routedMemory is the indexed LRU of routed prompts of one target, owned by the target's lock.
// Each block costs one map entry at most (byLocal points at the newest occurrence only), so it
// is bounded by the block budget; whole prompts leave, least recently routed first.
type routedMemory struct {
	byLocal        map[uint64]occ
	recs           map[uint64]*routedRec
	byKey          map[routedKey]uint64
	newest, oldest *routedRec
	blocks         int
	lastID, clock  uint64
	scratch        []routedPrompt
}

// sync indexes the prompts queued since the last call.
func (m *routedMemory) sync(q *routedQueue, budget int) {
	m.scratch = q.take(m.scratch[:0])
	if len(m.scratch) == 0 {
		return
	}
	if m.byLocal == nil {
		m.byLocal = map[uint64]occ{}
		m.recs = map[uint64]*routedRec{}
		m.byKey = map[routedKey]uint64{}
	}
	for _, p := range m.scratch {
		m.add(p, budget)
	}
	clear(m.scratch)
}

func (m *routedMemory) add(p routedPrompt, budget int) {
	m.clock++
	key := routedKey{last: p.seq[len(p.seq)-1], n: len(p.seq)}
	if id, ok := m.byKey[key]; ok {
		r := m.recs[id]
		r.used = m.clock
		m.unlink(r)
		m.pushFront(r)
		return
	}
	m.lastID++
	r := &routedRec{id: m.lastID, used: m.clock, local: p.local, seq: p.seq, links: make([]occ, len(p.local))}
	for k, h := range p.local {
		r.links[k] = m.byLocal[h]
		m.byLocal[h] = occ{id: r.id, k: int32(k)}
	}
	m.recs[r.id] = r
	m.byKey[key] = r.id
	m.pushFront(r)
	m.blocks += len(r.local)
	for m.blocks > budget && m.oldest != r {
		m.evict(m.oldest)
	}
}

func (m *routedMemory) pushFront(r *routedRec) {
	r.prev, r.next = nil, m.newest
	if m.newest != nil {
		m.newest.prev = r
	}
	m.newest = r
	if m.oldest == nil {
		m.oldest = r
	}
}

func (m *routedMemory) unlink(r *routedRec) {
	if r.prev != nil {
		r.prev.next = r.next
	} else {
		m.newest = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	} else {
		m.oldest = r.prev
	}
	r.prev, r.next = nil, nil
}

// evict forgets r; a local hash whose newest occurrence was in r falls back to the previous
// occurrence when that prompt is still remembered.
func (m *routedMemory) evict(r *routedRec) {
	for k, h := range r.local {
		if o := m.byLocal[h]; o.id != r.id || int(o.k) != k {
			continue
		}
		l := r.links[k]
		for l.id == r.id { // an earlier block of r itself with the same content
			l = r.links[l.k]
		}
		if l.id != 0 && m.recs[l.id] != nil {
			m.byLocal[h] = l
		} else {
			delete(m.byLocal, h)
		}
	}
	delete(m.recs, r.id)
	if key := (routedKey{last: r.seq[len(r.seq)-1], n: len(r.seq)}); m.byKey[key] == r.id {
		delete(m.byKey, key)
	}
	m.unlink(r)
	m.blocks -= len(r.local)
}

// find returns the sequence hashes of the blocks before the one with local hash local[0] in the
// most recently routed remembered prompt that holds local[0] at some block k > 0 followed by
// local[1:] (as far as both go): S_0..S_{k-1}, so the last is the parent's.
func (m *routedMemory) find(local []uint64) ([]kvkey.BlockHash, bool) {
	if len(local) == 0 || m.byLocal == nil {
		return nil, false
	}
	var best *routedRec
	bestK := 0
	o := m.byLocal[local[0]]
	for steps := 0; o.id != 0 && steps < maxRecoveryWalk; steps++ {
		r := m.recs[o.id]
		if r == nil {
			break
		}
		k := int(o.k)
		if k > 0 && (best == nil || r.used > best.used) && continues(r.local[k:], local) {
			best, bestK = r, k
		}
		o = r.links[k]
	}
	if best == nil {
		return nil, false
	}
	return best.seq[:bestK], true
}

// continues reports whether a and b agree on every block both have.
func continues(a, b []uint64) bool {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// len returns the number of remembered prompts (tests).
func (m *routedMemory) len() int { return len(m.recs) }
