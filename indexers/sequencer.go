package indexers

import (
	"time"

	"github.com/zeebo/xxh3"
)

// The sequencer is the pure part of following one worker+rank's event stream: it decides, from
// the sequence numbers of live batches and replay replies, what to apply, what to ask the
// worker's replay socket for, when the target's index state must be reset and whether the index
// is exact or only approximate. It does no I/O and reads no clock (callers pass the time); the
// Subscriber feeds it socket events and executes the actions it returns.
//
// Rules (vLLM's publisher, vllm/distributed/kv_events.py ZmqEventPublisher: one counter per
// engine from 0, +1 per batch, a ring of the last buffer_steps batches served by the replay
// ROUTER in order, live publishing and replay serviced by one thread):
//
//   - In order (last+1, modulo 2^64) is applied. A gap asks the ring for last+1 onwards while
//     live batches are buffered; whatever contiguous part arrives is applied, the rest is asked
//     for again (SeqConfig.MaxReplayAttempts in all), then the buffer is drained in order.
//   - A restart is never decided from one number. A live seq that goes back (at or below the
//     last one seen live, or with no live seq since the last decision) is checked against the
//     ring: asked from last, the same engine still holds batch `last` with the same bytes; a
//     restarted engine has no such batch (its counter is lower) or a different one. Only then
//     is the target reset and rebuilt from the ring (from 0). A health flap (RestartHint) asks
//     the same question. Without a replay socket a step back needs a second witness: the next
//     live batch continuing from it, or a health flap.
//   - A forward jump whose seq the ring does not hold (after every attempt) is a bogus number:
//     dropped and counted, not adopted. Without a replay socket a jump of more than the ring
//     size plus SeqConfig.JumpMargin is only followed once the next batch continues from it.
//   - A reset whose rebuild reaches back to the engine's first batch (seq 0, or 1 for publishers
//     counting from 1) leaves the index exact. Otherwise batches were lost and the target is
//     approximate (Subscribers.EventsHealthy reports false, so the router scores it from its own
//     decisions) until there is evidence the index is trustworthy again: an engine restart
//     followed from its first batch (its cache starts empty), an AllBlocksCleared applied, or
//     the settle window (SeqConfig.SettleTime, and SettleBatches when set) passing since.
//   - Sequence numbers compare modulo 2^64 (after). A batch numbered 2^64-1 cannot come back
//     in a replay: that number is the replay end marker (EndSeq).
//   - A seeded start (Seed) begins from a state installed from elsewhere (a peer replica's
//     snapshot of the index after batch S): the ring is asked from S, and its first reply must
//     be batch S with the bytes the snapshot's digest names, the same engine incarnation. Then
//     the rest of the reply fills (S, ring end] and the live batches buffered meanwhile follow,
//     as for any gap. Any other first reply (a restarted engine, a ring that moved past S), no
//     reply at all, or a ring that cannot be reached rejects the seed: the target is reset
//     (ResetWarmStart) and rebuilt as on a first join without a seed.

// SeqConfig tunes a Sequencer.
type SeqConfig struct {
	// Replay is set when the worker has a replay socket.
	Replay bool
	// RingSize is the worker's replay ring in batches (vLLM's buffer_steps, default 10,000).
	RingSize uint64
	// JumpMargin is added to RingSize to decide that a forward jump is implausible (default 1,000).
	JumpMargin uint64
	// MaxPending bounds live batches buffered during a replay (default 10,000).
	MaxPending int
	// MaxReplayAttempts bounds the replay requests spent on one gap (default 3).
	MaxReplayAttempts int
	// SettleTime is how long after a lossy reset the target stays approximate (default 2 min).
	SettleTime time.Duration
	// SettleBatches, when > 0, also leaves approximate mode after that many applied batches.
	SettleBatches uint64
}

func (c *SeqConfig) defaults() {
	if c.RingSize == 0 {
		c.RingSize = DefaultReplayBufferSteps
	}
	if c.JumpMargin == 0 {
		c.JumpMargin = 1000
	}
	if c.MaxPending <= 0 {
		c.MaxPending = DefaultReplayBufferSteps
	}
	if c.MaxReplayAttempts <= 0 {
		c.MaxReplayAttempts = 3
	}
	if c.SettleTime <= 0 {
		c.SettleTime = DefaultSettleTime
	}
}

// DefaultSettleTime is how long a target stays approximate after a lossy reset by default.
const DefaultSettleTime = 2 * time.Minute

// ActionKind says what a sequencer Action asks for.
type ActionKind int

// Action kinds.
const (
	// ActApply: decode and apply Payload, the batch Seq.
	ActApply ActionKind = iota
	// ActReplay: ask the replay socket for every batch from Seq on (one exchange at a time;
	// the caller reports ReplayBatch…ReplayEnd, or ReplayFailed).
	ActReplay
	// ActReset: drop the target's index state (Reason is a Reset* value).
	ActReset
	// ActDrop: a batch Seq is not applied (Reason is a Drop* value).
	ActDrop
	// ActMode: the index mode changed to Mode (Reason says why).
	ActMode
	// ActGap: a sequence gap was detected (Seq is the first missing batch).
	ActGap
	// ActReplayDone: an exchange ended (OK reports whether it covered what it was asked for).
	ActReplayDone
	// ActOverflow: the live buffer filled up during a replay; the exchange is abandoned.
	ActOverflow
)

// Drop reasons (ActDrop).
const (
	DropLateDuplicate = "late_duplicate"  // a replay delivered it already
	DropStale         = "stale"           // older than the last applied batch of the same engine
	DropImplausible   = "implausible_seq" // a jump the ring does not confirm
	DropUnconfirmed   = "unconfirmed"     // a step back no later batch confirmed
	// DropSkipped is not a batch but a sequence number no batch ever had: the ring, which
	// holds the batch before it, twice jumped over it (Seq is the number after the skip).
	DropSkipped = "skipped_seq"
)

// Index modes (ActMode, TargetDebug.IndexMode).
const (
	ModeExact       = "exact"
	ModeApproximate = "approximate"
)

// Action is one thing the caller must do, in order.
type Action struct {
	Kind    ActionKind
	Seq     uint64
	Payload []byte
	Reason  string
	Mode    string
	OK      bool
	// Digest is the xxh3 of Payload (ActApply), the cursor a snapshot taken after it carries.
	Digest uint64
}

// Index mode reasons of a seeded start (ActMode, TargetDebug.IndexModeReason).
const (
	// ReasonWarmStart: the state was installed from a snapshot; the ring has not confirmed its
	// cursor yet.
	ReasonWarmStart = "warm_start"
	// ReasonWarmStartVerified: the ring still holds the snapshot's last batch with its bytes.
	ReasonWarmStartVerified = "warm_start_verified"
	// ReasonWarmStartRejected: the seed was dropped (another engine incarnation, a ring past
	// the cursor, or no ring to confirm it); the target is rebuilt without it.
	ReasonWarmStartRejected = "warm_start_rejected"
)

// exchange purposes.
const (
	xFill    = iota // fill after last (gap or join), asked from last
	xProbe          // is it still the same engine? asked from last
	xRebuild        // after a reset: everything from 0
)

type exchange struct {
	active   bool
	purpose  int
	hint     bool   // probe started by a health flap
	from     uint64 // what was asked for
	target   uint64 // the trigger's seq (a batch the ring must hold), if hasT
	hasT     bool
	attempts int
	got      bool   // a reply arrived in this request
	first    uint64 // first reply seq in this request
	newest   uint64 // newest reply seq over all attempts (valid when seen)
	seen     bool
	hole     bool // a reply was not contiguous: ask again
	verified bool // this request's first reply was batch `last` itself, with the same bytes
	skipAt   uint64
	skipSeen bool // a verified request jumped from last to skipAt (kept across attempts)
	decided  bool // probe: first reply judged
	same     bool // probe: same engine
	restart  bool // probe: restarted engine
	lo, hi   uint64
	haveSpan bool // [lo, hi] replies received over the exchange, for dropping live copies
	seed     bool // the exchange confirms a seeded start's cursor
	seedOK   bool // seed: its first reply was batch `last` with the seed's digest
}

// Sequencer is the per-target sequencing state machine. It is not safe for concurrent use.
type Sequencer struct {
	cfg SeqConfig

	haveSeq    bool
	last       uint64
	lastDigest uint64
	haveLive   bool
	liveLast   uint64

	x       exchange
	pending []LiveMessage

	// without a replay socket (or when it failed): a step back or implausible jump waiting
	// for the next batch to confirm it
	cand     *LiveMessage
	candBack bool
	suspect  bool // a health flap not yet confirmed or refuted

	mode          string
	modeReason    string
	approxSince   time.Time
	approxBatches uint64

	out []Action
}

// NewSequencer returns a sequencer with no batch seen yet, in exact mode.
func NewSequencer(cfg SeqConfig) *Sequencer {
	cfg.defaults()
	return &Sequencer{cfg: cfg, mode: ModeExact}
}

// Last returns the last applied seq and whether there is one.
func (q *Sequencer) Last() (uint64, bool) { return q.last, q.haveSeq }

// Mode returns the index mode and the reason for it.
func (q *Sequencer) Mode() (string, string) { return q.mode, q.modeReason }

// Replaying reports whether a replay exchange is under way.
func (q *Sequencer) Replaying() bool { return q.x.active }

// digest fingerprints a batch's payload, to tell the same engine's batch from a restarted
// engine's batch under the same number. It runs on every applied batch: xxh3, not a
// byte-at-a-time hash.
func digest(p []byte) uint64 { return xxh3.Hash(p) }

// after reports a > b in sequence space (modulo 2^64: a is less than 2^63 ahead of b).
func after(a, b uint64) bool { return a != b && a-b < 1<<63 }

func (q *Sequencer) emit(a Action) { q.out = append(q.out, a) }

func (q *Sequencer) flush() []Action {
	out := q.out
	q.out = nil
	return out
}

func (q *Sequencer) apply(seq uint64, payload []byte, now time.Time) {
	q.haveSeq, q.last, q.lastDigest = true, seq, digest(payload)
	q.emit(Action{Kind: ActApply, Seq: seq, Payload: payload, Digest: q.lastDigest})
	if q.mode == ModeApproximate {
		q.approxBatches++
		q.settle(now)
	}
}

func (q *Sequencer) setMode(mode, reason string, now time.Time) {
	if mode == ModeApproximate {
		q.approxSince, q.approxBatches = now, 0
	}
	if q.mode == mode && q.modeReason == reason {
		return
	}
	q.mode, q.modeReason = mode, reason
	q.emit(Action{Kind: ActMode, Mode: mode, Reason: reason})
}

func (q *Sequencer) settle(now time.Time) {
	if q.mode != ModeApproximate {
		return
	}
	if (!now.IsZero() && !q.approxSince.IsZero() && now.Sub(q.approxSince) >= q.cfg.SettleTime) ||
		(q.cfg.SettleBatches > 0 && q.approxBatches >= q.cfg.SettleBatches) {
		q.setMode(ModeExact, "settled", now)
	}
}

func (q *Sequencer) reset(reason string) {
	q.haveSeq, q.haveLive, q.cand, q.suspect = false, false, nil, false
	q.emit(Action{Kind: ActReset, Reason: reason})
}

// startOK reports whether seq can be an engine's first batch (vLLM counts from 0, llm-d's
// simulator from 1).
func startOK(seq uint64) bool { return seq <= 1 }

// begin starts a replay exchange.
func (q *Sequencer) begin(purpose int, from uint64, trigger *LiveMessage) {
	q.x = exchange{active: true, purpose: purpose, from: from, attempts: 1}
	if trigger != nil {
		q.x.target, q.x.hasT = trigger.Seq, true
		q.pending = append(q.pending, *trigger)
	}
	q.emit(Action{Kind: ActReplay, Seq: from})
}

// again re-asks the ring within the same exchange.
func (q *Sequencer) again(from uint64) {
	q.x.attempts++
	q.x.from, q.x.got, q.x.hole, q.x.verified = from, false, false, false
	q.emit(Action{Kind: ActReplay, Seq: from})
}

// Tick lets time-based rules run (the settle window).
func (q *Sequencer) Tick(now time.Time) []Action {
	q.settle(now)
	return q.flush()
}

// Cleared reports that an applied batch held AllBlocksCleared: the worker's cache is empty,
// so whatever was lost before no longer matters.
func (q *Sequencer) Cleared(now time.Time) []Action {
	if q.mode == ModeApproximate {
		q.setMode(ModeExact, "all_blocks_cleared", now)
	}
	return q.flush()
}

// Join asks the ring for what was published while the subscriber had no connection: from
// last+1, or from 0 when nothing was applied yet. It does nothing during an exchange or
// without a replay socket.
func (q *Sequencer) Join() []Action {
	if q.cfg.Replay && !q.x.active {
		if q.haveSeq {
			q.begin(xFill, q.last, nil)
		} else {
			q.begin(xFill, 0, nil)
		}
	}
	return q.flush()
}

// Seed starts the sequencer from a state installed from elsewhere, a snapshot of the index
// after batch seq whose payload digests (xxh3) to dig: batch seq counts as applied, the mode is
// exact (ReasonWarmStart), and the ring is asked from seq to confirm the incarnation and fill
// what followed (see the rules above). It does nothing (no actions, false) once a batch was
// applied or during an exchange: a seed only replaces having no state. Without a replay socket
// the seed cannot be confirmed and is not taken either.
func (q *Sequencer) Seed(seq, dig uint64, now time.Time) ([]Action, bool) {
	if q.haveSeq || q.x.active || !q.cfg.Replay {
		return q.flush(), false
	}
	q.haveSeq, q.last, q.lastDigest = true, seq, dig
	q.haveLive, q.cand, q.suspect = false, nil, false
	q.setMode(ModeExact, ReasonWarmStart, now)
	q.begin(xFill, seq, nil)
	q.x.seed = true
	return q.flush(), true
}

// Abandon forgets the applied state and any exchange under way, keeping the live batches
// buffered and the mode: the caller replaces the target's state (a warm start after a lossy
// reset), then calls Seed, or Join to rebuild from the ring. It returns no actions; the caller
// drops the replay socket so that late replies of the abandoned exchange cannot arrive.
func (q *Sequencer) Abandon() {
	q.x = exchange{}
	q.haveSeq, q.haveLive, q.cand, q.suspect = false, false, nil, false
}

// rejectSeed drops a seeded state whose cursor the ring did not confirm: reset, and the
// rebuild a first join would run (from 0), the live batches buffered meanwhile kept for it.
func (q *Sequencer) rejectSeed(now time.Time) {
	pending := q.pending
	q.pending = nil
	q.x = exchange{}
	q.emit(Action{Kind: ActReplayDone, OK: false})
	q.reset(ResetWarmStart)
	// Approximate until the rebuild shows it reaches the engine's first batch.
	q.setMode(ModeApproximate, ReasonWarmStartRejected, now)
	q.begin(xRebuild, 0, nil)
	q.pending = pending
}

// RestartHint reports a health flap of the worker: checked against the ring, never trusted
// alone.
func (q *Sequencer) RestartHint(now time.Time) []Action {
	switch {
	case q.x.active:
		q.suspect = true // looked at when the exchange ends
	case !q.cfg.Replay:
		q.suspect = true
	case !q.haveSeq:
		q.begin(xFill, 0, nil)
	default:
		q.begin(xProbe, q.last, nil)
		q.x.hint = true
	}
	return q.flush()
}

// Live handles one batch from the live socket.
func (q *Sequencer) Live(m LiveMessage, now time.Time) []Action {
	q.live(m, now, q.cfg.Replay)
	return q.flush()
}

func (q *Sequencer) sawLive(seq uint64) { q.haveLive, q.liveLast = true, seq }

func (q *Sequencer) live(m LiveMessage, now time.Time, replay bool) {
	if q.x.active {
		if len(q.pending) >= q.cfg.MaxPending {
			q.emit(Action{Kind: ActOverflow, Seq: m.Seq})
			q.fail(now)
			q.live(m, now, replay)
			return
		}
		q.pending = append(q.pending, m)
		return
	}
	if q.cand != nil {
		c := *q.cand
		q.cand = nil
		if m.Seq == c.Seq+1 {
			// Two consecutive numbers agree: follow them.
			reason := ResetGap
			if q.candBack {
				reason = ResetRestart
			}
			q.reset(reason)
			q.startFresh(c, now)
			q.sawLive(m.Seq)
			q.apply(m.Seq, m.Payload, now)
			return
		}
		reason := DropImplausible
		if q.candBack {
			reason = DropUnconfirmed
		}
		q.emit(Action{Kind: ActDrop, Seq: c.Seq, Reason: reason})
	}
	prevLive, hadLive := q.liveLast, q.haveLive
	q.sawLive(m.Seq)
	if !q.haveSeq {
		switch {
		case replay && !startOK(m.Seq):
			// Joined mid-stream (or after a reset): earlier batches may be in the ring.
			q.begin(xRebuild, 0, &m)
		default:
			q.startFresh(m, now)
		}
		return
	}
	switch {
	case m.Seq == q.last+1:
		q.apply(m.Seq, m.Payload, now)
	case !after(m.Seq, q.last):
		// At or below the last applied batch.
		if hadLive && after(m.Seq, prevLive) {
			// Not a step back of the live stream: the live copy of a batch a replay already
			// delivered (replies and live batches travel on different connections).
			q.emit(Action{Kind: ActDrop, Seq: m.Seq, Reason: DropLateDuplicate})
			return
		}
		switch {
		case replay:
			q.begin(xProbe, q.last, &m)
		case q.suspect:
			// A health flap and the counter going back: two witnesses.
			q.reset(ResetRestart)
			q.startFresh(m, now)
		default:
			q.cand, q.candBack = &m, true
		}
	default:
		q.emit(Action{Kind: ActGap, Seq: q.last + 1})
		switch {
		case replay:
			q.begin(xFill, q.last, &m)
		case m.Seq-q.last > q.cfg.RingSize+q.cfg.JumpMargin:
			q.cand, q.candBack = &m, false
		default:
			q.reset(ResetGap)
			q.startFresh(m, now)
		}
	}
}

// startFresh applies m as the first batch after a reset or at a first join; the index is
// exact only if m can be the engine's first batch.
func (q *Sequencer) startFresh(m LiveMessage, now time.Time) {
	q.sawLive(m.Seq)
	if startOK(m.Seq) {
		if q.mode == ModeApproximate {
			q.setMode(ModeExact, "engine_start", now)
		}
	} else {
		q.setMode(ModeApproximate, "batches_lost", now)
	}
	q.apply(m.Seq, m.Payload, now)
}

// ReplayBatch handles one reply of the current exchange.
func (q *Sequencer) ReplayBatch(seq uint64, payload []byte, now time.Time) []Action {
	if !q.x.active {
		return q.flush()
	}
	x := &q.x
	firstOfRequest := !x.got
	x.got = true
	if !x.seen || after(seq, x.newest) {
		x.newest, x.seen = seq, true
	}
	if firstOfRequest {
		x.first = seq
	}
	if x.seed && !x.seedOK {
		if firstOfRequest && seq == q.last && digest(payload) == q.lastDigest {
			x.seedOK, x.verified = true, true
			q.setMode(ModeExact, ReasonWarmStartVerified, now)
			q.span(seq)
			return q.flush()
		}
		return q.flush() // rejected at the end of the reply stream
	}
	if x.purpose == xProbe && !x.decided {
		x.decided = true
		if seq == q.last && digest(payload) == q.lastDigest {
			x.same = true
			return q.flush() // batch `last` itself, already applied
		}
		x.restart = true
	}
	if x.restart {
		return q.flush() // the rebuild asks from 0
	}
	if firstOfRequest && q.haveSeq && seq == q.last {
		// Fills ask from the last applied batch rather than the one after it: the ring
		// holding it proves that nothing between it and the next reply was lost.
		if digest(payload) != q.lastDigest {
			// A different batch under the same number: the engine restarted.
			x.purpose, x.decided, x.restart = xProbe, true, true
			return q.flush()
		}
		x.verified = true
		q.span(seq)
		return q.flush()
	}
	switch {
	case !q.haveSeq:
		// Rebuild or first join: whatever the ring has is the start.
		if !startOK(seq) {
			q.setMode(ModeApproximate, "ring_does_not_reach_back", now)
		} else if x.purpose == xRebuild && q.mode == ModeApproximate {
			// Rebuilt from the engine's first batch: nothing is missing.
			q.setMode(ModeExact, "rebuilt_from_engine_start", now)
		}
		q.span(seq)
		q.apply(seq, payload, now)
	case seq == q.last+1:
		q.span(seq)
		q.apply(seq, payload, now)
	case !after(seq, q.last):
		q.span(seq)
	case x.verified && x.skipSeen && seq == x.skipAt:
		// Asked twice from a batch the ring holds, it jumped to the same number twice: the
		// numbers in between never had a batch (vLLM's ring keeps every batch it published,
		// and a reply lost at the ROUTER's HWM would not be lost at the same place twice).
		q.emit(Action{Kind: ActDrop, Seq: seq, Reason: DropSkipped})
		x.skipSeen = false
		q.span(seq)
		q.apply(seq, payload, now)
	case x.verified && !x.hole:
		x.hole, x.skipAt, x.skipSeen = true, seq, true
	case firstOfRequest && x.attempts == 1:
		// The ring no longer reaches back to last+1: those batches are lost for good. What it
		// has is the new start. (On a later attempt it is more likely a lost reply: a hole.)
		q.reset(ResetGap)
		q.setMode(ModeApproximate, "batches_lost", now)
		q.span(seq)
		q.apply(seq, payload, now)
	default:
		x.hole = true // a reply went missing (the ROUTER drops at its HWM): ask again
	}
	return q.flush()
}

func (q *Sequencer) span(seq uint64) {
	x := &q.x
	if !x.haveSpan {
		x.lo, x.hi, x.haveSpan = seq, seq, true
		return
	}
	if after(x.lo, seq) {
		x.lo = seq
	}
	if after(seq, x.hi) {
		x.hi = seq
	}
}

// ReplayEnd handles the end marker of the current exchange.
func (q *Sequencer) ReplayEnd(now time.Time) []Action {
	if !q.x.active {
		return q.flush()
	}
	x := &q.x
	if x.seed && !x.seedOK {
		q.rejectSeed(now)
		return q.flush()
	}
	if x.purpose == xProbe {
		switch {
		case !x.decided || x.restart:
			// No batch `last` in the ring, or a different one: a restarted engine.
			reason := ResetRestart
			if x.hint || q.suspect {
				reason = ResetHealth
			}
			pending := q.pending
			q.pending = nil
			q.x = exchange{}
			q.reset(reason)
			q.setMode(ModeExact, "engine_restart", now) // its cache started empty
			q.emit(Action{Kind: ActReplayDone, OK: true})
			q.begin(xRebuild, 0, nil)
			q.pending = pending
			return q.flush()
		default:
			q.suspect = false
			// The same engine: the live step back was a stale copy; carry on as a fill.
			if len(q.pending) > 0 && !after(q.pending[0].Seq, q.last) && q.x.hasT {
				q.emit(Action{Kind: ActDrop, Seq: q.pending[0].Seq, Reason: DropStale})
				q.pending = q.pending[1:]
				q.x.hasT = false
			}
			x.purpose = xFill
		}
	}
	if q.haveSeq && (x.hole || x.hasT && after(x.target, q.last+1)) {
		// Batches before the trigger did not all arrive (a reply lost at the ROUTER's HWM, or
		// a trigger the ring does not hold): ask again for the rest.
		if x.attempts < q.cfg.MaxReplayAttempts {
			q.again(q.last)
			return q.flush()
		}
		if x.hole && x.purpose != xRebuild {
			// The ring holds batches we cannot get in order: reset and rebuild from all it
			// holds (from 0). Lost batches make the index approximate.
			pending := q.pending
			q.pending = nil
			q.emit(Action{Kind: ActReplayDone, OK: false})
			q.x = exchange{}
			q.reset(ResetGap)
			q.setMode(ModeApproximate, "batches_lost", now)
			q.begin(xRebuild, 0, nil)
			q.pending = pending
			return q.flush()
		}
	}
	q.finish(now, true)
	return q.flush()
}

// ReplayFailed reports that the current exchange timed out or failed.
func (q *Sequencer) ReplayFailed(now time.Time) []Action {
	if q.x.active && q.x.seed && !q.x.seedOK && q.x.attempts >= q.cfg.MaxReplayAttempts {
		// The ring never answered: the seed cannot be confirmed. Judge the buffered live
		// batches as a first join whose replay failed would.
		q.x.seed = false
		q.emit(Action{Kind: ActReplayDone, OK: false})
		q.x.active = false
		q.reset(ResetWarmStart)
		q.setMode(ModeApproximate, ReasonWarmStartRejected, now)
		q.drain(now, false)
		return q.flush()
	}
	if q.x.active {
		if q.x.attempts < q.cfg.MaxReplayAttempts && q.x.purpose != xProbe {
			from := uint64(0)
			if q.haveSeq {
				from = q.last
			}
			q.again(from)
			return q.flush()
		}
		q.fail(now)
	}
	return q.flush()
}

// fail abandons the current exchange: the buffer is judged without the ring.
func (q *Sequencer) fail(now time.Time) {
	q.emit(Action{Kind: ActReplayDone, OK: false})
	if q.x.purpose == xProbe {
		q.suspect = q.suspect || q.x.hint
	}
	q.x.active = false
	q.drain(now, false)
}

// finish ends an exchange that completed and drains the live buffer.
func (q *Sequencer) finish(now time.Time, ok bool) {
	x := q.x
	if q.haveSeq && x.hasT && after(x.target, q.last) && (!x.seen || after(x.target, x.newest)) {
		// The ring never held the batch that revealed the gap, though it was published before
		// the request was served: a bogus sequence number.
		for i, m := range q.pending {
			if m.Seq == x.target {
				q.emit(Action{Kind: ActDrop, Seq: m.Seq, Reason: DropImplausible})
				q.pending = append(q.pending[:i:i], q.pending[i+1:]...)
				break
			}
		}
	}
	covered := !(q.haveSeq && x.hole)
	q.emit(Action{Kind: ActReplayDone, OK: ok && covered})
	if q.suspect && !x.hint && q.haveSeq && q.cfg.Replay {
		// A health flap arrived during the exchange: check it now.
		q.x = exchange{}
		q.drain(now, covered)
		if !q.x.active {
			q.begin(xProbe, q.last, nil)
			q.x.hint = true
		}
		return
	}
	q.x.active = false
	q.drain(now, covered)
}

// drain feeds the buffered live batches through the live path; one that starts another
// exchange leaves the rest buffered for it.
func (q *Sequencer) drain(now time.Time, replay bool) {
	x := q.x
	pending := q.pending
	q.pending = nil
	for i, m := range pending {
		if q.x.active {
			q.pending = append(q.pending, pending[i:]...)
			return
		}
		if x.haveSpan && !after(x.lo, m.Seq) && !after(m.Seq, x.hi) {
			// Received live during the exchange and delivered by it as well.
			q.sawLive(m.Seq)
			q.emit(Action{Kind: ActDrop, Seq: m.Seq, Reason: DropLateDuplicate})
			continue
		}
		if q.haveSeq && !after(m.Seq, q.last) && x.haveSpan {
			// Received live during the exchange but older than what the ring gave: stale, not
			// a restart (the ring and the live stream come from the same engine).
			q.sawLive(m.Seq)
			q.emit(Action{Kind: ActDrop, Seq: m.Seq, Reason: DropStale})
			continue
		}
		// Without a replay socket that works, or with nothing applied yet after an exchange,
		// the live path must not start the same exchange over again.
		q.live(m, now, replay && q.haveSeq)
	}
}
