package router

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// workingSets is, per target, the prompt blocks routed there within a window (the
// approximate TTL): the prefixes the requests of the recent past will ask that worker for
// again, which a prefill that overflows its KV cache evicts. Like the load tracker it keys a
// prompt by a sample of its chained hashes (load_blocks.go), here only the first heldExact and
// then every heldStride-th, so a conversation's next turn, which extends the prompt of the
// last one, counts its blocks once (its last, shorter stretch is left out until it grows).
// A prompt's deep keys (beyond the first heldExact, which shared system prompts and tools
// make common to many sessions) belong to one target at a time: routing them to another moves
// them there, since a session that moved will not ask its old worker for them again, and a
// worker its sessions left must not look full until the window passes.
// Each set also sums its keys' weights by the time they were last routed (ageBuckets), so
// scoring can tell how much of the set is newer than a cached prefix: what LRU eviction keeps
// ahead of it. Scoring reads one atomic per target, and takes a target's lock for that
// count; recording takes mu, then the targets' locks.
type workingSets struct {
	targets *perTarget[targetSet]
	width   int64                          // ns per age bucket
	mu      sync.Mutex                     // guards owner; taken before any targetSet.mu
	owner   map[kvkey.BlockHash]*targetSet // the set each deep key was last routed to
}

// maxSetKeys bounds the keys one target's working set holds (about 16 million blocks).
const maxSetKeys = 1 << 20

type targetSet struct {
	blocks atomic.Int64 // Σ weights of the keys seen within the window
	mu     sync.Mutex
	seen   map[kvkey.BlockHash]setKey
	ages   ageBuckets // Σ weights of seen by when they were last routed
}

// setKey is one key of a working set: when it was last routed and the blocks it stands for.
type setKey struct {
	at     int64 // unix ns
	weight int64
}

// ageSlots is how many age buckets a set keeps; the window spans at most ageSlots−8 of them,
// so a bucket is reused only after its keys have expired.
const ageSlots = 128

// newWorkingSets returns working sets over a window of ttl: age buckets of a second, or of
// ttl/(ageSlots−8) when that is longer.
func newWorkingSets(ttl time.Duration) *workingSets {
	width := max(int64(time.Second), int64(ttl)/(ageSlots-8)+1)
	return &workingSets{targets: newPerTarget[targetSet](), owner: make(map[kvkey.BlockHash]*targetSet), width: width}
}

// ageBuckets sums weights by the bucket of the time they were last routed: slot e mod
// ageSlots holds bucket e (its epoch); a slot whose epoch is older is reset on reuse.
type ageBuckets struct {
	epoch [ageSlots]int64
	sum   [ageSlots]int64
}

func (a *ageBuckets) add(e, w int64) {
	i := e % ageSlots
	if a.epoch[i] != e {
		if a.epoch[i] > e {
			return // older than the window
		}
		a.epoch[i], a.sum[i] = e, 0
	}
	a.sum[i] += w
}

func (a *ageBuckets) sub(e, w int64) {
	if i := e % ageSlots; a.epoch[i] == e {
		a.sum[i] -= w
	}
}

// after is the weight last routed in a bucket later than e.
func (a *ageBuckets) after(e int64) int64 {
	var n int64
	for i, ep := range a.epoch {
		if ep > e {
			n += a.sum[i]
		}
	}
	return n
}

// staleBlocks is how many blocks of t's working set were last routed before cutoff (to the
// width of an age bucket): the ones an LRU cache evicts first.
func (ws *workingSets) staleBlocks(t kvkey.Target, cutoff time.Time) float64 {
	s := ws.targets.get(t)
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return float64(max(0, s.blocks.Load()-s.ages.after(cutoff.UnixNano()/ws.width-1)))
}

// newerThanPrefix is how many blocks of t's working set were routed after the first cached
// blocks of hashes were last routed there: the blocks an LRU cache keeps ahead of that
// prefix. The prefix's age is its deepest key within cached; a prefix not in the set (older
// than the window, or routed elsewhere since) is older than the whole set.
func (ws *workingSets) newerThanPrefix(t kvkey.Target, hashes []kvkey.BlockHash, cached int) float64 {
	s := ws.targets.get(t)
	if s == nil || cached <= 0 {
		return 0
	}
	cached = min(cached, len(hashes))
	p := cached - 1
	if p >= heldExact {
		p = heldExact - 1 + (p-heldExact+1)/heldStride*heldStride
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.seen[hashes[p]]
	if !ok {
		return float64(s.blocks.Load())
	}
	return float64(s.ages.after(k.at / ws.width))
}

// blocks is t's working set in blocks (0 for a target never routed to).
func (ws *workingSets) blocks(t kvkey.Target) float64 {
	if s := ws.targets.get(t); s != nil {
		return float64(s.blocks.Load())
	}
	return 0
}

// record notes hashes as routed to t at now, and moves their deep keys off the target they
// were routed to before.
func (ws *workingSets) record(t kvkey.Target, hashes []kvkey.BlockHash, now time.Time) {
	if len(hashes) == 0 {
		return
	}
	s := ws.targets.getOrCreate(t, func() *targetSet { return &targetSet{seen: make(map[kvkey.BlockHash]setKey)} })
	if s == nil {
		return
	}
	ns := now.UnixNano()
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var moved map[*targetSet][]kvkey.BlockHash
	s.mu.Lock()
	for p := 0; p < len(hashes); p++ {
		if p >= heldExact { // jump to the stride keys
			p = heldExact - 1 + ((p-heldExact)/heldStride+1)*heldStride
			if p >= len(hashes) {
				break
			}
		}
		h, w := hashes[p], heldWeight(p)
		if k, ok := s.seen[h]; ok {
			s.ages.sub(k.at/ws.width, k.weight)
		} else {
			if len(s.seen) >= maxSetKeys {
				break
			}
			s.blocks.Add(w)
		}
		s.seen[h] = setKey{at: ns, weight: w}
		s.ages.add(ns/ws.width, w)
		if p < heldExact {
			continue
		}
		if prev, ok := ws.owner[h]; ok && prev != s {
			if moved == nil {
				moved = make(map[*targetSet][]kvkey.BlockHash)
			}
			moved[prev] = append(moved[prev], h)
		}
		ws.owner[h] = s
	}
	s.mu.Unlock()
	for prev, hs := range moved {
		prev.mu.Lock()
		for _, h := range hs {
			if k, ok := prev.seen[h]; ok {
				delete(prev.seen, h)
				prev.blocks.Add(-k.weight)
				prev.ages.sub(k.at/ws.width, k.weight)
			}
		}
		prev.mu.Unlock()
	}
}

// expire drops the keys last routed before cutoff, and the owners of keys whose target was
// forgotten.
func (ws *workingSets) expire(cutoff time.Time) {
	c := cutoff.UnixNano()
	sets := ws.targets.all()
	live := make(map[*targetSet]bool, len(sets))
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, s := range sets {
		live[s] = true
		s.mu.Lock()
		for h, k := range s.seen {
			if k.at < c {
				delete(s.seen, h)
				s.blocks.Add(-k.weight)
				s.ages.sub(k.at/ws.width, k.weight)
				if ws.owner[h] == s {
					delete(ws.owner, h)
				}
			}
		}
		s.mu.Unlock()
	}
	for h, s := range ws.owner {
		if !live[s] {
			delete(ws.owner, h)
		}
	}
}

// forget drops t's working set (its worker restarted with an empty cache); the next expire
// drops the owners of its keys.
func (ws *workingSets) forget(t kvkey.Target) {
	ws.targets.forget(t)
}
