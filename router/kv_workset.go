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
// Scoring reads one atomic per target; recording takes mu, then the targets' locks.
type workingSets struct {
	targets *perTarget[targetSet]
	mu      sync.Mutex                     // guards owner; taken before any targetSet.mu
	owner   map[kvkey.BlockHash]*targetSet // the set each deep key was last routed to
}

// maxSetKeys bounds the keys one target's working set holds (about 16 million blocks).
const maxSetKeys = 1 << 20

type targetSet struct {
	blocks atomic.Int64 // Σ weights of the keys seen within the window
	mu     sync.Mutex
	seen   map[kvkey.BlockHash]setKey
}

// setKey is one key of a working set: when it was last routed and the blocks it stands for.
type setKey struct {
	at     int64 // unix ns
	weight int64
}

func newWorkingSets() *workingSets {
	return &workingSets{targets: newPerTarget[targetSet](), owner: make(map[kvkey.BlockHash]*targetSet)}
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
		if _, ok := s.seen[h]; !ok {
			if len(s.seen) >= maxSetKeys {
				break
			}
			s.blocks.Add(w)
		}
		s.seen[h] = setKey{at: ns, weight: w}
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
