package indexers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// WarmStarter fetches a peer replica's snapshot of one target's index (the bytes
// Subscribers.EncodeSnapshot returns on the peer) for a subscription that has no state yet.
// cluster.Snapshots implements it over NATS; without a cluster there is none and every target
// starts from the worker's replay ring alone.
type WarmStarter interface {
	// FetchSnapshot returns the snapshot and the name of the peer that served it, or an error
	// (ErrNoSnapshot when no peer offered one) by the time ctx ends.
	FetchSnapshot(ctx context.Context, t kvkey.Target) (data []byte, peer string, err error)
}

// ErrNoSnapshot is what a WarmStarter returns when no peer offered an exact snapshot of the
// target (no peer at all, or none whose state of it is exact).
var ErrNoSnapshot = errors.New("indexers: no peer offered an exact snapshot")

// ErrNotExact is what EncodeSnapshot returns for a target whose state is not offered: nothing
// applied yet, approximate (batches were lost), only settled, or installed from a snapshot the
// worker's ring has not confirmed yet.
var ErrNotExact = errors.New("indexers: the target's index state is not exact")

// Warm start outcomes (TargetDebug.WarmStart.Result, the result label of
// kvgate_kv_warm_starts_total).
const (
	WarmInstalled     = "installed"          // a peer's snapshot was installed
	WarmNoPeer        = "no_peer"            // no peer offered one
	WarmTimeout       = "timeout"            // none arrived within the snapshot timeout
	WarmFetchFailed   = "fetch_failed"       // the transfer failed (NATS down, a peer gone)
	WarmInstallFailed = "install_failed"     // the snapshot was corrupt or did not fit
	WarmRejected      = "rejected"           // installed, but the ring did not confirm its cursor
	WarmNoReplay      = "no_replay_endpoint" // nothing to confirm a cursor with: not attempted
	// WarmContentRejected: the ring's last batches up to the cursor contradict the snapshot's
	// content (warmcheck.go); not installed.
	WarmContentRejected = "content_rejected"
)

// warmResults are the outcomes counted per target, in metric order.
var warmResults = [...]string{WarmInstalled, WarmNoPeer, WarmTimeout, WarmFetchFailed, WarmInstallFailed, WarmRejected, WarmNoReplay,
	WarmContentRejected}

// WarmStartDebug is a target's warm start in GET /debug/workers.
type WarmStartDebug struct {
	// State is "warm" (its state came from a peer's snapshot), "cold" (from the worker's ring
	// and live stream alone; Result says why) or "fetching".
	State  string `json:"state"`
	Result string `json:"result,omitempty"`
	// Peer and Seq name the snapshot installed: the peer replica and the last batch it held.
	Peer string `json:"peer,omitempty"`
	Seq  uint64 `json:"seq,omitempty"`
	// Verified is set once the worker's ring confirmed the snapshot's cursor.
	Verified bool    `json:"verified"`
	Bytes    int     `json:"bytes,omitempty"`
	TookMS   float64 `json:"took_ms"`
	Error    string  `json:"error,omitempty"`
	At       string  `json:"at"`
}

// cursorState is what a subscriber offers to peers: the cursor of the state its index holds
// for the target, under the subscriber's apply lock.
type cursorState struct {
	mu     sync.Mutex // held around every apply, reset and install of the target
	have   bool
	cur    SnapshotCursor
	exact  bool // the sequencer's mode is exact for a reason worth offering
	warm   *WarmStartDebug
	counts [len(warmResults)]int64
	bytes  int64 // snapshot bytes installed
}

// offerable reports whether an exact-mode reason makes the state one to offer: a target that
// left approximate mode by settling or by an AllBlocksCleared is trusted for routing but may
// still lack what was lost (in the host and disk tiers, which a clear keeps), and an
// unconfirmed seed may be another incarnation's.
func offerable(mode, reason string) bool {
	return mode == ModeExact && reason != "settled" && reason != "all_blocks_cleared" && reason != ReasonWarmStart
}

// noteWarm records a warm start outcome.
func (c *cursorState) noteWarm(d WarmStartDebug) {
	for i, r := range warmResults {
		if r == d.Result {
			c.counts[i]++
		}
	}
	d.At = time.Now().UTC().Format(time.RFC3339Nano)
	c.warm = &d
}

// maybeWarmStart runs before a session's first join when the target has no state and the
// subscription has a WarmStarter: it fetches a peer's snapshot (bounded by SnapshotTimeout),
// installs it and seeds the sequencer with its cursor, which asks the ring from there. Live
// batches meanwhile wait in the SUB socket's queue (RcvHWM). Any failure leaves the target as
// it was: the join then asks the ring from 0, as without a cluster.
func (s *Subscriber) maybeWarmStart(ctx context.Context) {
	if s.cfg.WarmStart == nil || s.warmTried {
		return
	}
	if _, ok := s.seq.Last(); ok || s.seq.Replaying() {
		return
	}
	s.warmTried = true
	c := &s.cursor
	if s.cfg.ReplayEndpoint == "" {
		c.mu.Lock()
		c.noteWarm(WarmStartDebug{State: "cold", Result: WarmNoReplay})
		c.mu.Unlock()
		return
	}
	start := time.Now()
	c.mu.Lock()
	c.warm = &WarmStartDebug{State: "fetching", At: start.UTC().Format(time.RFC3339Nano)}
	c.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, s.cfg.SnapshotTimeout)
	data, peer, err := s.cfg.WarmStart.FetchSnapshot(wctx, s.cfg.Target)
	cancel()
	took := float64(time.Since(start).Microseconds()) / 1000
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		res := WarmFetchFailed
		switch {
		case errors.Is(err, ErrNoSnapshot):
			res = WarmNoPeer
		case errors.Is(err, context.DeadlineExceeded):
			res = WarmTimeout
		}
		s.log.Info("kv-events: no warm start from a peer; starting from the replay ring", "result", res, "err", err)
		c.mu.Lock()
		c.noteWarm(WarmStartDebug{State: "cold", Result: res, TookMS: took, Error: err.Error()})
		c.mu.Unlock()
		return
	}
	cctx, ccancel := context.WithTimeout(ctx, s.cfg.ReplayTimeout)
	err = s.checkSnapshotContent(cctx, data)
	ccancel()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("kv-events: a peer's index snapshot contradicts the worker's replay ring; discarded, starting from the ring", "peer", peer, "err", err)
		c.mu.Lock()
		c.noteWarm(WarmStartDebug{State: "cold", Result: WarmContentRejected, Peer: peer, TookMS: took, Error: err.Error()})
		c.mu.Unlock()
		return
	}
	c.mu.Lock()
	cur, err := s.ix.InstallSnapshot(s.cfg.Target, data, s.changeSet())
	if err != nil {
		c.noteWarm(WarmStartDebug{State: "cold", Result: WarmInstallFailed, Peer: peer, TookMS: took, Error: err.Error()})
		c.mu.Unlock()
		s.log.Warn("kv-events: a peer's index snapshot was not installed", "peer", peer, "err", err)
		return
	}
	c.have, c.cur, c.exact = true, cur, false
	c.bytes += int64(len(data))
	c.noteWarm(WarmStartDebug{State: "warm", Result: WarmInstalled, Peer: peer, Seq: cur.Seq, Bytes: len(data), TookMS: took})
	c.mu.Unlock()
	s.handChanges()
	acts, ok := s.seq.Seed(cur.Seq, cur.Digest, time.Now())
	if !ok { // cannot happen after the checks above; never keep an unconfirmable state
		s.resetTarget(ResetWarmStart)
		return
	}
	s.log.Info("kv-events: index warm-started from a peer's snapshot", "peer", peer, "seq", cur.Seq, "bytes", len(data), "took_ms", took)
	s.exec(acts)
}

// snapshot encodes the target's state with its cursor, if it is one to offer.
func (s *Subscriber) snapshot() ([]byte, SnapshotCursor, error) {
	c := &s.cursor
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.have || !c.exact {
		return nil, SnapshotCursor{}, fmt.Errorf("%w: %s", ErrNotExact, s.cfg.Target)
	}
	data, err := s.ix.EncodeSnapshot(s.cfg.Target, c.cur)
	return data, c.cur, err
}

// offer reports the cursor of an offerable state.
func (s *Subscriber) offer() (uint64, bool) {
	c := &s.cursor
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur.Seq, c.have && c.exact
}

// subscriber returns t's running subscription, nil if none.
func (m *Subscribers) subscriber(t kvkey.Target) *Subscriber {
	if p := m.bySub.Load(); p != nil {
		return (*p)[t].live()
	}
	return nil
}

// SnapshotOffer reports whether this replica holds an exact state of t to give a peer, and the
// last batch it holds.
func (m *Subscribers) SnapshotOffer(t kvkey.Target) (seq uint64, ok bool) {
	if s := m.subscriber(t); s != nil {
		return s.offer()
	}
	return 0, false
}

// EncodeSnapshot returns a snapshot of t's index state with its cursor, for a peer replica's
// warm start; ErrNotExact when the state is not one to offer.
func (m *Subscribers) EncodeSnapshot(t kvkey.Target) ([]byte, error) {
	s := m.subscriber(t)
	if s == nil {
		return nil, fmt.Errorf("%w: %s has no subscription", ErrNotExact, t)
	}
	data, _, err := s.snapshot()
	return data, err
}

// minRewarmInterval spaces the warm starts after lossy resets of one target: a stream that
// keeps losing batches must not keep the socket goroutine waiting for peers.
const minRewarmInterval = 30 * time.Second

// canRewarm reports whether a lossy reset of this target may ask a peer for its state: a
// subscription with its own SUB (a collector's goroutine serves every collector target, so it
// must not wait), a ring to confirm a snapshot with, and no such attempt recently.
func (s *Subscriber) canRewarm() bool {
	return s.cfg.WarmStart != nil && s.cfg.Endpoint != "" && s.cfg.ReplayEndpoint != "" &&
		(s.lastRewarm.IsZero() || time.Since(s.lastRewarm) >= minRewarmInterval)
}

// rewarm replaces the state of a target that lost batches (an unrecoverable gap: the ring no
// longer reaches back to the last applied batch) by a peer's exact snapshot, when one offers
// it. Whatever the ring gave since the reset is dropped and the exchange abandoned; without a
// snapshot the target is rebuilt from the ring, as a first join does, and stays approximate.
func (s *Subscriber) rewarm(ctx context.Context, now time.Time) {
	s.rewarmDue = false
	s.lastRewarm = now
	s.closeDealer() // late replies of the abandoned exchange must not reach the next one
	s.seq.Abandon()
	s.cursor.mu.Lock()
	s.ix.ResetTo(s.cfg.Target, s.changeSet())
	s.cursor.have = false
	s.cursor.mu.Unlock()
	s.handChanges()
	s.warmTried = false
	s.maybeWarmStart(ctx)
	if _, ok := s.seq.Last(); !ok && !s.seq.Replaying() {
		s.exec(s.seq.Join())
	}
}
