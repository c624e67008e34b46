package router

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// LoadVector is one target's in-flight load as one replica accounts it: the LoadTracker's
// counters and the kv policy's time-model queue. As a delta its fields are signed increments;
// as a total they are what the replica has in flight there now.
type LoadVector struct {
	Requests        int64 `json:"requests"`         // active requests
	PrefillRequests int64 `json:"prefill_requests"` // requests before their first token
	PrefillTokens   int64 `json:"prefill_tokens"`   // their uncached prompt tokens
	Blocks          int64 `json:"active_blocks"`    // distinct prompt blocks held (counted once per replica)
	AheadTokens     int64 `json:"ahead_tokens"`     // kv time model: uncached tokens queued before the first token
	AheadPairs      int64 `json:"ahead_pairs"`      // their attention pairs
	Decodes         int64 `json:"decode_requests"`  // kv time model: requests past their first token
	DecodeKV        int64 `json:"decode_kv_tokens"` // their prompt tokens
}

// Add adds d to v field by field.
func (v *LoadVector) Add(d LoadVector) {
	v.Requests += d.Requests
	v.PrefillRequests += d.PrefillRequests
	v.PrefillTokens += d.PrefillTokens
	v.Blocks += d.Blocks
	v.AheadTokens += d.AheadTokens
	v.AheadPairs += d.AheadPairs
	v.Decodes += d.Decodes
	v.DecodeKV += d.DecodeKV
}

// Neg is -v.
func (v LoadVector) Neg() LoadVector {
	return LoadVector{-v.Requests, -v.PrefillRequests, -v.PrefillTokens, -v.Blocks,
		-v.AheadTokens, -v.AheadPairs, -v.Decodes, -v.DecodeKV}
}

// IsZero reports whether every field is 0.
func (v LoadVector) IsZero() bool { return v == LoadVector{} }

// clamped is v with negative fields (a peer's deltas seen without its baseline) read as 0.
func (v LoadVector) clamped() LoadVector {
	return LoadVector{max(v.Requests, 0), max(v.PrefillRequests, 0), max(v.PrefillTokens, 0), max(v.Blocks, 0),
		max(v.AheadTokens, 0), max(v.AheadPairs, 0), max(v.Decodes, 0), max(v.DecodeKV, 0)}
}

// TargetLoadVector is one target's entry in a load message.
type TargetLoadVector struct {
	Target kvkey.Target
	Load   LoadVector
}

// LoadPublisher hears every change of this replica's own load as signed increments per target
// (the cluster's load sync batches and publishes them). It is called on the request path, so
// it must be quick, never block and be safe for concurrent use.
type LoadPublisher interface {
	LoadDelta(t kvkey.Target, d LoadVector)
}

// ApproxPublisher hears every prompt this replica routes to a target scored in approximate
// mode (what ApproxIndex.Record records), so its peers' approximate indexes predict the same.
// The same rules as LoadPublisher apply; it must not keep hashes past the call.
type ApproxPublisher interface {
	RoutedApprox(t kvkey.Target, hashes []kvkey.BlockHash)
}

// Fleet is what a replica shares with its peers (SetFleet): its own load changes and
// approximate-mode routing go out, the peers' load comes in. Any field may be nil.
type Fleet struct {
	Peers  *PeerLoads
	Load   LoadPublisher
	Approx ApproxPublisher
}

// Bounds of PeerLoads.
const (
	// MaxPeers is how many peer replicas' load is kept; messages of further peers are dropped.
	MaxPeers = 64
	// maxPeerTargets bounds the targets of one peer, and of the sums.
	maxPeerTargets = 4096
)

// PeerLoads is the fleet's other replicas' in-flight load, per target, as their load messages
// describe it. It is a pure state machine fed by the cluster's receiver (one goroutine) and read
// by scoring:
//
//   - a delta message adds its signed increments to the peer's contribution;
//   - a snapshot (the peer's absolute totals) replaces the peer's contribution wholesale and
//     clears its approximate flag;
//   - a sequence gap (a lost message) marks the peer approximate until its next snapshot; a
//     message older than the last one applied is ignored;
//   - a new epoch (the peer restarted) resets the peer;
//   - a peer silent for the timeout has its contribution dropped (Expire).
//
// Scoring reads the sum over peers of one target with one atomic map load and a few atomic
// loads (Sum), never a lock; writers serialise on a mutex.
type PeerLoads struct {
	timeout time.Duration

	sums atomic.Pointer[map[kvkey.Target]*peerSum] // copy-on-write; grown under mu

	mu    sync.Mutex
	peers map[string]*peerState
	stats PeerStats
}

// peerSum is Σ peers' contribution to one target: an immutable vector behind an atomic
// pointer. The one writer (under PeerLoads.mu) stores a new vector per increment, so a read
// never sees half of one message applied (the count of a new request without its prefill
// tokens, which would price that target as cheaper than it is).
type peerSum struct {
	v atomic.Pointer[LoadVector]
}

// add applies d. Callers hold PeerLoads.mu, so there is one writer at a time.
func (s *peerSum) add(d LoadVector) {
	v := s.load()
	v.Add(d)
	s.v.Store(&v)
}

// load returns the vector as the last whole increment left it.
func (s *peerSum) load() LoadVector {
	if p := s.v.Load(); p != nil {
		return *p
	}
	return LoadVector{}
}

// peerState is what is known of one peer replica.
type peerState struct {
	epoch   uint64
	next    uint64 // the sequence number expected next
	approx  bool   // a message was lost (or the baseline is unknown) since the last snapshot
	heard   time.Time
	contrib map[kvkey.Target]LoadVector
}

// PeerStats counts what PeerLoads did with the messages it was given.
type PeerStats struct {
	Applied   uint64 `json:"applied"`   // messages applied
	Stale     uint64 `json:"stale"`     // older than the last one applied from the same peer and epoch
	Gaps      uint64 `json:"gaps"`      // sequence gaps (messages lost on the way)
	Resets    uint64 `json:"resets"`    // peers seen with a new epoch
	Expired   uint64 `json:"expired"`   // peers dropped after the timeout
	Refused   uint64 `json:"refused"`   // messages or entries dropped by a bound (peers, targets)
	Snapshots uint64 `json:"snapshots"` // snapshots applied
}

// NewPeerLoads returns an empty view; a peer silent for timeout stops counting.
func NewPeerLoads(timeout time.Duration) *PeerLoads {
	pl := &PeerLoads{timeout: timeout, peers: make(map[string]*peerState)}
	m := make(map[kvkey.Target]*peerSum)
	pl.sums.Store(&m)
	return pl
}

// Sum returns Σ peers' load on t (negative transients read as 0). Lock-free.
func (pl *PeerLoads) Sum(t kvkey.Target) LoadVector {
	if pl == nil {
		return LoadVector{}
	}
	s := (*pl.sums.Load())[t]
	if s == nil {
		return LoadVector{}
	}
	return s.load().clamped()
}

// ApplyDelta applies a peer's delta message: signed increments per target.
func (pl *PeerLoads) ApplyDelta(peer string, epoch, seq uint64, deltas []TargetLoadVector, now time.Time) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	ps := pl.accept(peer, epoch, seq, now, false)
	if ps == nil {
		return
	}
	for _, e := range deltas {
		if e.Load.IsZero() {
			continue
		}
		old, ok := ps.contrib[e.Target]
		if !ok && len(ps.contrib) >= maxPeerTargets {
			pl.stats.Refused++
			continue
		}
		s := pl.cell(e.Target)
		if s == nil {
			pl.stats.Refused++
			continue
		}
		old.Add(e.Load)
		if old.IsZero() {
			delete(ps.contrib, e.Target)
		} else {
			ps.contrib[e.Target] = old
		}
		s.add(e.Load)
	}
}

// ApplySnapshot applies a peer's snapshot: its absolute totals replace its contribution.
func (pl *PeerLoads) ApplySnapshot(peer string, epoch, seq uint64, totals []TargetLoadVector, now time.Time) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	ps := pl.accept(peer, epoch, seq, now, true)
	if ps == nil {
		return
	}
	next := make(map[kvkey.Target]LoadVector, len(totals))
	for _, e := range totals {
		if e.Load.IsZero() {
			continue
		}
		if len(next) >= maxPeerTargets {
			pl.stats.Refused++
			break
		}
		v := next[e.Target]
		v.Add(e.Load)
		next[e.Target] = v
	}
	for t, old := range ps.contrib {
		if _, ok := next[t]; !ok {
			if s := pl.cell(t); s != nil {
				s.add(old.Neg())
			}
		}
	}
	for t, v := range next {
		d := v
		d.Add(ps.contrib[t].Neg())
		s := pl.cell(t)
		if s == nil {
			pl.stats.Refused++
			delete(next, t)
			continue
		}
		s.add(d)
	}
	ps.contrib = next
	ps.approx = false
	pl.stats.Snapshots++
}

// accept runs the sequencing rules for one message and returns the peer's state to apply it
// to, or nil when the message is to be ignored. Callers hold mu.
func (pl *PeerLoads) accept(peer string, epoch, seq uint64, now time.Time, snapshot bool) *peerState {
	ps := pl.peers[peer]
	if ps != nil && ps.epoch != epoch {
		pl.dropLocked(peer, ps)
		pl.stats.Resets++
		ps = nil
	}
	if ps == nil {
		if len(pl.peers) >= MaxPeers {
			pl.stats.Refused++
			return nil
		}
		// A peer first heard from a delta: its baseline is unknown until its snapshot.
		ps = &peerState{epoch: epoch, next: seq, approx: !snapshot, contrib: make(map[kvkey.Target]LoadVector)}
		pl.peers[peer] = ps
	}
	switch {
	case seq < ps.next:
		pl.stats.Stale++
		return nil
	case seq > ps.next:
		pl.stats.Gaps++
		ps.approx = true
	}
	ps.next = seq + 1
	ps.heard = now
	pl.stats.Applied++
	return ps
}

// Expire drops every peer not heard from for longer than the timeout and returns how many.
func (pl *PeerLoads) Expire(now time.Time) int {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	n := 0
	for id, ps := range pl.peers {
		if now.Sub(ps.heard) > pl.timeout {
			pl.dropLocked(id, ps)
			pl.stats.Expired++
			n++
		}
	}
	return n
}

// Forget drops one peer at once (e.g. it announced its shutdown).
func (pl *PeerLoads) Forget(peer string) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if ps := pl.peers[peer]; ps != nil {
		pl.dropLocked(peer, ps)
	}
}

func (pl *PeerLoads) dropLocked(id string, ps *peerState) {
	for t, v := range ps.contrib {
		if s := pl.cell(t); s != nil {
			s.add(v.Neg())
		}
	}
	delete(pl.peers, id)
}

// cell returns t's sum, adding one (copy-on-write) when t is new; nil past the bound.
// Callers hold mu.
func (pl *PeerLoads) cell(t kvkey.Target) *peerSum {
	m := *pl.sums.Load()
	if s := m[t]; s != nil {
		return s
	}
	if len(m) >= maxPeerTargets {
		return nil
	}
	next := make(map[kvkey.Target]*peerSum, len(m)+1)
	for k, s := range m {
		next[k] = s
	}
	s := &peerSum{}
	next[t] = s
	pl.sums.Store(&next)
	return s
}

// Len is how many peers currently count.
func (pl *PeerLoads) Len() int {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return len(pl.peers)
}

// Stats returns the message counters.
func (pl *PeerLoads) Stats() PeerStats {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.stats
}

// PeerView is one peer replica in GET /debug/workers.
type PeerView struct {
	Replica     string  `json:"replica"`
	Epoch       uint64  `json:"epoch"`
	Approximate bool    `json:"approximate"` // a message was lost since its last snapshot
	AgeSeconds  float64 `json:"age_seconds"` // since its last message
	Targets     int     `json:"targets"`     // targets it has load on
}

// Peers lists the peers, by replica id.
func (pl *PeerLoads) Peers(now time.Time) []PeerView {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	out := make([]PeerView, 0, len(pl.peers))
	for id, ps := range pl.peers {
		out = append(out, PeerView{Replica: id, Epoch: ps.epoch, Approximate: ps.approx,
			AgeSeconds: now.Sub(ps.heard).Seconds(), Targets: len(ps.contrib)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Replica < out[j].Replica })
	return out
}

// PeerShare is the peers' part of one target's load in GET /debug/workers.
type PeerShare struct {
	// Total is Σ peers, as scoring adds it to this replica's own load.
	Total LoadVector `json:"total"`
	// ByPeer is each peer's contribution (peers with none are left out).
	ByPeer map[string]LoadVector `json:"by_peer,omitempty"`
}

// Share returns the peers' share of t's load.
func (pl *PeerLoads) Share(t kvkey.Target) PeerShare {
	out := PeerShare{Total: pl.Sum(t)}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for id, ps := range pl.peers {
		if v, ok := ps.contrib[t]; ok {
			if out.ByPeer == nil {
				out.ByPeer = make(map[string]LoadVector)
			}
			out.ByPeer[id] = v
		}
	}
	return out
}
