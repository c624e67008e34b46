package indexers

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/kvkey"
)

// SubscriberConfig describes one worker+rank's event stream.
type SubscriberConfig struct {
	Target kvkey.Target
	// Endpoint is the PUB address to connect to (already offset for the rank, see
	// OffsetEndpoint), or the address to bind when Bind is set (workers that connect out).
	Endpoint string
	Bind     bool
	// ReplayEndpoint is the worker's replay ROUTER ("" = no replay: gaps reset the target).
	ReplayEndpoint string
	// Topic is the subscription prefix ("" = everything).
	Topic string
	// ReplayTimeout bounds one replay exchange (default 2 s).
	ReplayTimeout time.Duration
	// MaxPending bounds live batches buffered during a replay (default 10,000, vLLM's ring).
	MaxPending int
	// RcvHWM is the SUB socket's receive high-water mark (default 100,000, like vLLM's PUB).
	RcvHWM int
	// ReconnectMin/ReconnectMax bound the backoff after socket errors (default 100 ms / 5 s);
	// libzmq's own reconnect interval uses the same bounds.
	ReconnectMin, ReconnectMax time.Duration
	// JoinSettle is how long after a join replay the subscriber waits for a live batch before
	// asking the replay socket once more (default 250 ms). A PUB drops what it publishes before
	// it has processed the SUB's subscription (ZMQ's slow joiner), so a batch published right
	// after the join replay can reach nobody; a later live batch reveals it as a gap, but if the
	// worker then goes quiet only this second look finds it.
	JoinSettle time.Duration
	// MaxMsgSize is ZMQ_MAXMSGSIZE on the SUB and replay sockets, in bytes (default
	// DefaultMaxMsgSize; -1 = no limit): a peer sending a larger message is disconnected.
	MaxMsgSize int64
	// RingSize is the worker's replay ring in batches (vLLM's buffer_steps, default 10,000);
	// without a replay socket, a forward jump of more than RingSize+1000 is only followed once
	// the next batch confirms it.
	RingSize int
	// MaxReplayAttempts bounds the replay requests spent on one gap (default 3).
	MaxReplayAttempts int
	// SettleTime is how long a target whose index lost batches stays approximate (default 2 min).
	SettleTime time.Duration
	// SettleBatches, when > 0, also leaves approximate mode after that many applied batches.
	SettleBatches uint64
	// WarmStart, if set, is asked for a peer's snapshot of the target before the first join
	// while the target has no state (Subscribers sets it from SetWarmStarter).
	WarmStart WarmStarter
	// SnapshotTimeout bounds the wait for a peer's snapshot (default 5 s).
	SnapshotTimeout time.Duration
	// Consumer, if set, hears every change set the subscriber's index updates made, after the
	// index released its lock (Subscribers sets it from Subscribers.SetConsumer).
	Consumer ChangeConsumer
	// SilenceAfter is how long the subscription may hear nothing while prompts are routed to
	// its worker before it is reported silent (silence.go); 0 takes SilenceAfter.
	SilenceAfter time.Duration
}

// DefaultMaxMsgSize is the default ZMQ_MAXMSGSIZE of the KV-event sockets (64 MiB).
const DefaultMaxMsgSize = 64 << 20

func (c *SubscriberConfig) defaults() {
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = 2 * time.Second
	}
	if c.MaxPending <= 0 {
		c.MaxPending = DefaultReplayBufferSteps
	}
	if c.RcvHWM <= 0 {
		c.RcvHWM = 100_000
	}
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = 100 * time.Millisecond
	}
	if c.ReconnectMax < c.ReconnectMin {
		c.ReconnectMax = max(5*time.Second, c.ReconnectMin)
	}
	if c.JoinSettle <= 0 {
		c.JoinSettle = 250 * time.Millisecond
	}
	if c.MaxMsgSize == 0 {
		c.MaxMsgSize = DefaultMaxMsgSize
	}
	if c.SnapshotTimeout <= 0 {
		c.SnapshotTimeout = 5 * time.Second
	}
	if c.SilenceAfter <= 0 {
		c.SilenceAfter = SilenceAfter
	}
}

func (c *SubscriberConfig) seqConfig() SeqConfig {
	return SeqConfig{Replay: c.ReplayEndpoint != "", RingSize: uint64(max(c.RingSize, 0)),
		MaxPending: c.MaxPending, MaxReplayAttempts: c.MaxReplayAttempts,
		SettleTime: c.SettleTime, SettleBatches: c.SettleBatches}
}

// Subscription states reported by Snapshot.
const (
	StateConnecting = "connecting"
	StateLive       = "live"
	StateReplaying  = "replaying"
	StateBackoff    = "backoff"
	StateStopped    = "stopped"
)

// Reset reasons (metric label values).
const (
	ResetGap     = "unrecoverable_gap"
	ResetRestart = "restart"
	ResetHealth  = "health"
	// ResetWarmStart: a state installed from a peer's snapshot was dropped because the
	// worker's replay ring did not confirm its cursor.
	ResetWarmStart = "warm_start_rejected"
)

// subStats are the subscriber's counters, read by metrics and Snapshot.
type subStats struct {
	batches, gaps, replaysOK, replaysFailed, replayedBatches atomic.Int64
	resetsGap, resetsRestart, resetsHealth, resetsWarm       atomic.Int64
	parseFrames, parsePayload, unknownEvents, malformed      atomic.Int64
	reconnects, pendingOverflow, rankMismatch                atomic.Int64
	joinReplays, lateDuplicates, stale                       atomic.Int64
	reconnectChecks                                          atomic.Int64 // ring checks after a reconnect
	implausible, unconfirmed, skippedSeq                     atomic.Int64
	lastSeq                                                  atomic.Uint64
	haveSeq                                                  atomic.Bool  // lastSeq is set
	state                                                    atomic.Value // string
	healthy                                                  atomic.Bool  // state is live or replaying
	approximate                                              atomic.Bool  // the index lost batches
	modeReason                                               atomic.Value // string
	lastEvent                                                atomic.Int64 // unix nanos
	started                                                  atomic.Int64 // unix nanos of NewSubscriber
	silent                                                   atomic.Bool  // silence.go
}

// Subscriber follows one worker+rank's KV events into an Index. Its ZMQ sockets live on the
// goroutine that runs Run (sockets are not goroutine-safe); other methods are safe anywhere.
// The sequencing decisions are its Sequencer's; the Subscriber executes them.
type Subscriber struct {
	cfg   SubscriberConfig
	ix    *Index
	zctx  *zmq.Context
	log   *slog.Logger
	stats subStats

	restart   atomic.Bool // set by MarkRestarted, consumed by the socket goroutine
	forgotten atomic.Bool // a collector's target that was stopped
	limiter   logLimiter

	// socket-goroutine state
	seq            *Sequencer
	dealer         *zmq.Socket
	replayDeadline time.Time // of the replay request in flight; zero = none
	changes        ChangeSet // reused for every apply and reset, handed to cfg.Consumer
	join           joinState
	monitors       int  // monitor sockets opened, for unique inproc addresses
	warmTried      bool // a warm start was attempted since the target last had no state
	rewarmDue      bool // a lossy reset happened: ask a peer before rebuilding from the ring
	lastRewarm     time.Time

	// cursor is the applied state's cursor, offered to peers (warmstart.go); its lock is held
	// around every apply, reset and install, so a snapshot is taken between batches.
	cursor cursorState
}

// NewSubscriber prepares a subscriber; zctx may be shared by many subscribers.
func NewSubscriber(zctx *zmq.Context, ix *Index, cfg SubscriberConfig, log *slog.Logger) *Subscriber {
	cfg.defaults()
	if log == nil {
		log = slog.Default()
	}
	s := &Subscriber{cfg: cfg, ix: ix, zctx: zctx, seq: NewSequencer(cfg.seqConfig()),
		log: log.With("component", "kv-events", "target", cfg.Target.String(), "endpoint", cfg.Endpoint)}
	s.stats.modeReason.Store("")
	s.stats.started.Store(time.Now().UnixNano())
	s.cursor.exact = true // a new sequencer is in exact mode
	s.setState(StateConnecting)
	return s
}

// live returns s unless it is nil or was stopped (collector targets).
func (s *Subscriber) live() *Subscriber {
	if s == nil || s.forgotten.Load() {
		return nil
	}
	return s
}

// Target returns the worker+rank this subscriber follows.
func (s *Subscriber) Target() kvkey.Target { return s.cfg.Target }

// MarkRestarted tells the subscriber that its worker may have restarted (the gateway's health
// prober saw /health flap). It is a hint: the subscriber asks the worker's replay ring whether
// the engine that published the last applied batch is still there and resets the target's
// index state only if it is not (see Sequencer).
func (s *Subscriber) MarkRestarted() { s.restart.Store(true) }

func (s *Subscriber) setState(st string) {
	if old, _ := s.stats.state.Load().(string); old != st {
		s.stats.state.Store(st)
		s.stats.healthy.Store(st == StateLive || st == StateReplaying)
		if old != "" {
			s.log.Info("kv-events subscription state", "from", old, "to", st)
		}
	}
}

// Run connects and follows the stream until ctx ends. Socket errors close the sockets and
// retry with exponential backoff.
func (s *Subscriber) Run(ctx context.Context) error {
	if err := s.ix.AddTarget(s.cfg.Target); err != nil {
		return err
	}
	defer s.setState(StateStopped)
	backoff := s.cfg.ReconnectMin
	for ctx.Err() == nil {
		s.setState(StateConnecting)
		err := s.session(ctx)
		s.closeDealer()
		if ctx.Err() != nil {
			return nil
		}
		s.stats.reconnects.Add(1)
		s.log.Warn("kv-events subscription failed; retrying", "err", err, "backoff", backoff)
		s.setState(StateBackoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, s.cfg.ReconnectMax)
	}
	return nil
}

// subOptions are the SUB socket's options, shared by per-worker and collector sockets.
func subOptions(sub *zmq.Socket, hwm int, rmin, rmax time.Duration, maxMsg int64) {
	_ = sub.SetLinger(0)
	_ = sub.SetRcvhwm(hwm)
	_ = sub.SetReconnectIvl(rmin)
	_ = sub.SetReconnectIvlMax(rmax)
	_ = sub.SetMaxmsgsize(maxMsg)
}

func (s *Subscriber) openDealer() error {
	if s.cfg.ReplayEndpoint == "" || s.dealer != nil {
		return nil
	}
	d, err := s.zctx.NewSocket(zmq.DEALER)
	if err != nil {
		return fmt.Errorf("dealer socket: %w", err)
	}
	_ = d.SetLinger(0)
	_ = d.SetMaxmsgsize(s.cfg.MaxMsgSize)
	if err := d.Connect(s.cfg.ReplayEndpoint); err != nil {
		d.Close()
		return fmt.Errorf("dealer %s: %w", s.cfg.ReplayEndpoint, err)
	}
	s.dealer = d
	return nil
}

// closeDealer drops the replay socket, discarding any late replies of an abandoned replay.
func (s *Subscriber) closeDealer() {
	if s.dealer != nil {
		s.dealer.Close()
		s.dealer = nil
	}
	s.replayDeadline = time.Time{}
}

// pollInterval bounds how long the socket goroutine waits before noticing ctx or a restart mark.
const pollInterval = 50 * time.Millisecond

// session opens this target's own SUB (and monitor) and runs the event loop on it.
func (s *Subscriber) session(ctx context.Context) error {
	sub, err := s.zctx.NewSocket(zmq.SUB)
	if err != nil {
		return fmt.Errorf("sub socket: %w", err)
	}
	defer sub.Close()
	subOptions(sub, s.cfg.RcvHWM, s.cfg.ReconnectMin, s.cfg.ReconnectMax, s.cfg.MaxMsgSize)
	if err := sub.SetSubscribe(s.cfg.Topic); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	f := &feed{sub: sub, streams: []*Subscriber{s}, route: func(LiveMessage) *Subscriber { return s }}
	if !s.cfg.Bind {
		f.lostWait = s.cfg.ReconnectMax + time.Second
	}
	s.monitors++
	f.mon = openMonitor(s.zctx, sub, fmt.Sprintf("inproc://kvgate-kv-monitor-%p-%d", s, s.monitors), s.log)
	defer f.closeMonitor() // after the SUB: deferred calls run in reverse
	if s.cfg.Bind {
		err = sub.Bind(s.cfg.Endpoint)
	} else {
		err = sub.Connect(s.cfg.Endpoint)
	}
	if err != nil {
		return fmt.Errorf("sub %s: %w", s.cfg.Endpoint, err)
	}
	// Subscribed first, so that the live batches published while the peer's snapshot travels
	// queue in the socket; they follow the snapshot's cursor.
	s.maybeWarmStart(ctx)
	return f.run(ctx)
}

// step runs the time- and flag-driven work of one loop turn: a restart hint, a replay
// timeout, the join replay and its second look, the settle window.
func (s *Subscriber) step(ctx context.Context, now time.Time) {
	if s.rewarmDue {
		s.rewarm(ctx, now)
	}
	if s.restart.Swap(false) {
		s.exec(s.seq.RestartHint(now))
	}
	if !s.replayDeadline.IsZero() && !now.Before(s.replayDeadline) {
		s.log.Warn("kv-events: replay timed out", "timeout", s.cfg.ReplayTimeout)
		s.closeDealer() // late replies must not leak into the next exchange
		s.exec(s.seq.ReplayFailed(now))
	}
	s.joinIfDue(now)
	s.exec(s.seq.Tick(now))
	s.setState(s.connState())
	s.checkSilence(now)
}

// onLive handles one live batch routed to this target.
func (s *Subscriber) onLive(m LiveMessage) {
	// A batch arrived, so the PUB has our subscription: from here on anything missed shows up
	// as a gap, and the join's second look is not needed.
	s.join.sawLive = true
	s.join.confirmAt = time.Time{}
	if !s.join.connected {
		s.join.connected = true
	}
	s.exec(s.seq.Live(m, time.Now()))
	s.setState(s.connState())
}

// onDealer drains the replay socket.
func (s *Subscriber) onDealer() {
	for s.dealer != nil {
		frames, err := s.dealer.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			return
		}
		rep, err := ParseReplayReply(frames)
		if err != nil {
			s.stats.parseFrames.Add(1)
			s.limiter.log(s.log, "replay", err)
			continue
		}
		now := time.Now()
		if rep.End {
			s.replayDeadline = time.Time{}
			s.exec(s.seq.ReplayEnd(now))
			continue
		}
		s.stats.replayedBatches.Add(1)
		s.exec(s.seq.ReplayBatch(rep.Seq, rep.Payload, now))
	}
}

// exec carries out the sequencer's actions in order.
func (s *Subscriber) exec(acts []Action) {
	for _, a := range acts {
		switch a.Kind {
		case ActApply:
			if s.apply(a.Seq, a.Digest, a.Payload) {
				s.exec(s.seq.Cleared(time.Now()))
			}
		case ActReplay:
			s.sendReplay(a.Seq)
		case ActReset:
			s.resetTarget(a.Reason)
			if a.Reason == ResetGap && s.canRewarm() {
				s.rewarmDue = true // at the next loop turn, after the actions of this step
			}
		case ActDrop:
			switch a.Reason {
			case DropLateDuplicate:
				s.stats.lateDuplicates.Add(1)
			case DropStale:
				s.stats.stale.Add(1)
			case DropImplausible:
				s.stats.implausible.Add(1)
				s.log.Warn("kv-events: implausible sequence number dropped", "seq", a.Seq)
			case DropUnconfirmed:
				s.stats.unconfirmed.Add(1)
			case DropSkipped:
				s.stats.skippedSeq.Add(1)
			}
		case ActMode:
			s.cursor.mu.Lock()
			s.cursor.exact = offerable(a.Mode, a.Reason)
			if a.Reason == ReasonWarmStartVerified && s.cursor.warm != nil {
				w := *s.cursor.warm
				w.Verified = true
				s.cursor.warm = &w
			}
			s.cursor.mu.Unlock()
			s.stats.modeReason.Store(a.Reason)
			s.stats.approximate.Store(a.Mode == ModeApproximate)
			s.log.Warn("kv-events: index mode", "mode", a.Mode, "reason", a.Reason)
		case ActGap:
			s.stats.gaps.Add(1)
			if last, ok := s.seq.Last(); ok {
				s.log.Warn("kv-events: sequence gap", "expected", last+1)
			}
		case ActReplayDone:
			if a.OK {
				s.stats.replaysOK.Add(1)
			} else {
				s.stats.replaysFailed.Add(1)
				s.closeDealer()
			}
			s.join.replayDone()
		case ActOverflow:
			s.stats.pendingOverflow.Add(1)
			s.closeDealer()
		}
	}
}

// sendReplay asks the replay ROUTER for every batch from `from`; a failure to send is reported
// to the sequencer at once.
func (s *Subscriber) sendReplay(from uint64) {
	err := s.openDealer()
	if err == nil && s.dealer != nil {
		_, err = s.dealer.SendMessage(ReplayRequestFrames(from))
	} else if err == nil {
		err = fmt.Errorf("no replay endpoint")
	}
	if err != nil {
		s.log.Warn("kv-events: replay request failed", "from", from, "err", err)
		s.closeDealer()
		s.exec(s.seq.ReplayFailed(time.Now()))
		return
	}
	s.replayDeadline = time.Now().Add(s.cfg.ReplayTimeout)
	s.setState(StateReplaying)
}

func (s *Subscriber) resetTarget(reason string) {
	s.cursor.mu.Lock()
	s.ix.ResetTo(s.cfg.Target, s.changeSet())
	s.cursor.have = false
	if reason == ResetWarmStart && s.cursor.warm != nil {
		s.cursor.noteWarm(WarmStartDebug{State: "cold", Result: WarmRejected, Peer: s.cursor.warm.Peer, Seq: s.cursor.warm.Seq})
	} else {
		s.warmTried = false // no state again: a later session may ask a peer
	}
	s.cursor.mu.Unlock()
	s.handChanges()
	switch reason {
	case ResetGap:
		s.stats.resetsGap.Add(1)
	case ResetRestart:
		s.stats.resetsRestart.Add(1)
	case ResetHealth:
		s.stats.resetsHealth.Add(1)
	case ResetWarmStart:
		s.stats.resetsWarm.Add(1)
	}
	s.log.Warn("kv-events: index state of target reset", "reason", reason)
}

// apply decodes and applies one batch; it reports whether the batch held AllBlocksCleared.
func (s *Subscriber) apply(seq, dig uint64, payload []byte) (cleared bool) {
	// Published once the batch is in the index, so that an observer of last_seq (the debug
	// endpoint, tests) finds the index at least that far.
	defer func() {
		s.stats.batches.Add(1)
		s.stats.lastEvent.Store(time.Now().UnixNano())
		s.stats.lastSeq.Store(seq)
		s.stats.haveSeq.Store(true)
	}()
	b, st, err := DecodeBatchStats(payload)
	if err != nil {
		// Nothing to apply, but the batch is behind the cursor now (a peer's copy fails alike).
		s.cursor.mu.Lock()
		s.cursor.have, s.cursor.cur = true, SnapshotCursor{Seq: seq, Digest: dig}
		s.cursor.mu.Unlock()
		s.stats.parsePayload.Add(1)
		s.limiter.log(s.log, "payload", err)
		return false
	}
	if st.Unknown > 0 {
		s.stats.unknownEvents.Add(int64(st.Unknown))
	}
	if st.Malformed > 0 {
		s.stats.malformed.Add(int64(st.Malformed))
		s.limiter.log(s.log, "event", fmt.Errorf("%d malformed events skipped in batch %d", st.Malformed, seq))
	}
	if b.DPRank.Set && b.DPRank.V != int64(s.cfg.Target.DPRank) {
		s.stats.rankMismatch.Add(1)
	}
	s.cursor.mu.Lock()
	err = s.ix.ApplyTo(s.cfg.Target, b, s.changeSet())
	s.cursor.have, s.cursor.cur = true, SnapshotCursor{Seq: seq, Digest: dig}
	s.cursor.mu.Unlock()
	if err != nil {
		s.limiter.log(s.log, "apply", err)
	}
	s.handChanges()
	for _, ev := range b.Events {
		if _, ok := ev.(*AllBlocksCleared); ok {
			cleared = true
		}
	}
	return cleared
}

// changeSet returns the scratch change set to record into, nil when nobody consumes it.
func (s *Subscriber) changeSet() *ChangeSet {
	if s.cfg.Consumer == nil {
		return nil
	}
	return &s.changes
}

// handChanges passes the last recorded change set to the consumer; the index lock is released
// by now, so the consumer may take its own locks and read (or even write) the index.
func (s *Subscriber) handChanges() {
	if s.cfg.Consumer != nil && !s.changes.Empty() {
		s.cfg.Consumer.IndexChanged(&s.changes)
	}
}

// logLimiter logs a kind of problem at most once per interval, with the suppressed count.
type logLimiter struct {
	mu    sync.Mutex
	last  map[string]time.Time
	count map[string]int
}

const logEvery = 10 * time.Second

func (l *logLimiter) log(log *slog.Logger, kind string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last, l.count = map[string]time.Time{}, map[string]int{}
	}
	now := time.Now()
	if t, ok := l.last[kind]; ok && now.Sub(t) < logEvery {
		l.count[kind]++
		return
	}
	log.Warn("kv-events: skipped malformed input", "kind", kind, "err", err, "suppressed", l.count[kind])
	l.last[kind], l.count[kind] = now, 0
}
