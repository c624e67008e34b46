package indexers

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/workers"
)

// SubscriberConfig describes one worker+rank's event stream.
type SubscriberConfig struct {
	Target workers.Target
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
}

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
)

// subStats are the subscriber's counters, read by metrics and Snapshot.
type subStats struct {
	batches, gaps, replaysOK, replaysFailed, replayedBatches atomic.Int64
	resetsGap, resetsRestart, resetsHealth                   atomic.Int64
	parseFrames, parsePayload, unknownEvents, malformed      atomic.Int64
	reconnects, pendingOverflow, rankMismatch, midStream     atomic.Int64
	joinReplays, lateDuplicates                              atomic.Int64
	lastSeq                                                  atomic.Int64 // -1: none yet
	state                                                    atomic.Value // string
	healthy                                                  atomic.Bool  // state is live or replaying
	lastEvent                                                atomic.Int64 // unix nanos
}

// Subscriber follows one worker+rank's KV events into an Index. Its ZMQ sockets live on the
// goroutine that runs Run (sockets are not goroutine-safe); other methods are safe anywhere.
type Subscriber struct {
	cfg   SubscriberConfig
	ix    *Index
	zctx  *zmq.Context
	log   *slog.Logger
	stats subStats

	restart atomic.Bool // set by MarkRestarted, consumed by the socket goroutine
	limiter logLimiter

	// socket-goroutine state
	haveSeq  bool
	last     uint64
	haveLive bool   // liveLast is set: a batch came over the live socket since the last reset
	liveLast uint64 // seq of the last live batch (see sawLive)
	sub      *zmq.Socket
	dealer   *zmq.Socket
	join     joinState
	monitors int // monitor sockets opened, for unique inproc addresses
}

// NewSubscriber prepares a subscriber; zctx may be shared by many subscribers.
func NewSubscriber(zctx *zmq.Context, ix *Index, cfg SubscriberConfig, log *slog.Logger) *Subscriber {
	cfg.defaults()
	if log == nil {
		log = slog.Default()
	}
	s := &Subscriber{cfg: cfg, ix: ix, zctx: zctx,
		log: log.With("component", "kv-events", "target", cfg.Target.String(), "endpoint", cfg.Endpoint)}
	s.stats.lastSeq.Store(-1)
	s.setState(StateConnecting)
	return s
}

// Target returns the worker+rank this subscriber follows.
func (s *Subscriber) Target() workers.Target { return s.cfg.Target }

// MarkRestarted tells the subscriber that its worker restarted (e.g. the gateway's health
// prober saw /health flap): the target's index state is reset and the stream restarts clean.
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
		s.closeSockets()
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

func (s *Subscriber) openSockets() error {
	sub, err := s.zctx.NewSocket(zmq.SUB)
	if err != nil {
		return fmt.Errorf("sub socket: %w", err)
	}
	s.sub = sub
	_ = sub.SetLinger(0)
	_ = sub.SetRcvhwm(s.cfg.RcvHWM)
	_ = sub.SetReconnectIvl(s.cfg.ReconnectMin)
	_ = sub.SetReconnectIvlMax(s.cfg.ReconnectMax)
	if err := sub.SetSubscribe(s.cfg.Topic); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	s.openMonitor() // before connecting, so that no connection event is missed
	if s.cfg.Bind {
		err = sub.Bind(s.cfg.Endpoint)
	} else {
		err = sub.Connect(s.cfg.Endpoint)
	}
	if err != nil {
		return fmt.Errorf("sub %s: %w", s.cfg.Endpoint, err)
	}
	return nil
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
}

func (s *Subscriber) closeSockets() {
	s.closeDealer()
	if s.sub != nil {
		s.sub.Close()
		s.sub = nil
	}
	s.closeMonitor() // after the SUB: its monitor stops with it
}

// pollInterval bounds how long the socket goroutine waits before noticing ctx or a restart mark.
const pollInterval = 50 * time.Millisecond

func (s *Subscriber) session(ctx context.Context) error {
	// haveSeq/last survive a reconnect: the join replay asks for last+1 onwards (replaying
	// from 0 would apply batches twice).
	s.join = joinState{}
	if err := s.openSockets(); err != nil {
		return err
	}
	if s.join.mon == nil {
		s.join.connected = true // no monitor: trust the connection and join at once
		s.join.due = true
	}
	s.setState(s.connState())
	poller := zmq.NewPoller()
	poller.Add(s.sub, zmq.POLLIN)
	if s.join.mon != nil {
		poller.Add(s.join.mon, zmq.POLLIN)
	}
	for ctx.Err() == nil {
		s.checkRestart()
		if err := s.joinIfDue(ctx); err != nil {
			return err
		}
		polled, err := poller.Poll(s.join.pollWait())
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			return fmt.Errorf("poll: %w", err)
		}
		for _, p := range polled {
			if p.Socket != s.sub {
				s.onMonitor()
				continue
			}
			frames, err := s.sub.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				continue
			}
			if err := s.onLive(ctx, frames); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkRestart applies a MarkRestarted: reset, then rebuild from whatever the worker's replay
// ring holds (a restarted engine's ring starts at seq 0), without waiting for its next batch.
func (s *Subscriber) checkRestart() {
	if !s.restart.Swap(false) {
		return
	}
	s.resetTarget(ResetHealth)
	s.haveSeq = false
	s.join.due = true // joinIfDue replays from 0 once the SUB is connected
	s.join.confirmAt = time.Time{}
}

// sawLive records the sequence number of a batch that came over the live socket. A live
// stream only moves forward (one TCP connection, in order), so a later live batch at or below it
// means the publisher's counter restarted, while one above it but at or below the last applied
// seq is a late duplicate of a replayed batch.
func (s *Subscriber) sawLive(seq uint64) { s.liveLast, s.haveLive = seq, true }

func (s *Subscriber) resetTarget(reason string) {
	s.ix.Reset(s.cfg.Target)
	s.haveLive = false // the next stream is judged on its own
	switch reason {
	case ResetGap:
		s.stats.resetsGap.Add(1)
	case ResetRestart:
		s.stats.resetsRestart.Add(1)
	case ResetHealth:
		s.stats.resetsHealth.Add(1)
	}
	s.log.Warn("kv-events: index state of target reset", "reason", reason)
}

// onLive handles one live message: sequence tracking, gap recovery, application.
func (s *Subscriber) onLive(ctx context.Context, frames [][]byte) error {
	msg, err := ParseLive(frames)
	if err != nil {
		s.stats.parseFrames.Add(1)
		s.limiter.log(s.log, "frames", err)
		return nil
	}
	// A batch arrived, so the PUB has our subscription: from here on anything missed shows up
	// as a gap, and the join's second look is not needed.
	s.join.confirmAt = time.Time{}
	if !s.join.connected {
		s.join.connected = true
		s.setState(StateLive)
	}
	return s.onMessage(ctx, msg)
}

// onMessage tracks the sequence of one live batch, recovers gaps and applies it.
func (s *Subscriber) onMessage(ctx context.Context, msg LiveMessage) error {
	prevLive, hadLive := s.liveLast, s.haveLive
	s.sawLive(msg.Seq)
	switch {
	case !s.haveSeq && msg.Seq == 0:
	case !s.haveSeq:
		// Joined mid-stream (or reconnected): earlier batches may still be in the replay ring
		// (spec §8.5: replay from 0). What the ring no longer has is accepted as unknown.
		s.stats.midStream.Add(1)
		return s.recover(ctx, 0, msg, false)
	case msg.Seq == s.last+1:
	case msg.Seq <= s.last && (!hadLive || msg.Seq > prevLive):
		// Not a step back of the live stream: the live copy of a batch a replay already
		// delivered (replies and live batches travel on different connections, so it can
		// arrive after the replay ended).
		s.stats.lateDuplicates.Add(1)
		return nil
	case msg.Seq <= s.last:
		// The publisher's counter went back: the engine restarted (spec §8.6).
		s.resetTarget(ResetRestart)
		s.haveSeq = false
		if msg.Seq > 0 {
			return s.recover(ctx, 0, msg, false)
		}
	default:
		s.stats.gaps.Add(1)
		s.log.Warn("kv-events: sequence gap", "expected", s.last+1, "got", msg.Seq)
		return s.recover(ctx, s.last+1, msg, true)
	}
	s.apply(msg.Seq, msg.Payload)
	return nil
}

// apply decodes and applies one batch and advances the sequence.
func (s *Subscriber) apply(seq uint64, payload []byte) {
	s.haveSeq, s.last = true, seq
	// Published once the batch is in the index, so that an observer of last_seq (the debug
	// endpoint, tests) finds the index at least that far.
	defer func() {
		s.stats.batches.Add(1)
		s.stats.lastEvent.Store(time.Now().UnixNano())
		s.stats.lastSeq.Store(int64(seq))
	}()
	b, st, err := DecodeBatchStats(payload)
	if err != nil {
		s.stats.parsePayload.Add(1)
		s.limiter.log(s.log, "payload", err)
		return
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
	if err := s.ix.Apply(s.cfg.Target, b); err != nil {
		s.limiter.log(s.log, "apply", err)
	}
}

// recover asks the replay ROUTER for batches from `from` while buffering live messages, then
// applies them in order. If the replay cannot cover the range and mustCover is set (a gap in a
// stream we were following), the target is reset and continues from what is available.
func (s *Subscriber) recover(ctx context.Context, from uint64, trigger LiveMessage, mustCover bool) error {
	pending := []LiveMessage{trigger}
	covered := false
	var replayed []ReplayReply
	if s.cfg.ReplayEndpoint != "" {
		s.setState(StateReplaying)
		var err error
		replayed, pending, err = s.replay(ctx, from, pending)
		s.setState(s.connState())
		switch {
		case err != nil:
			s.stats.replaysFailed.Add(1)
			s.log.Warn("kv-events: replay failed", "from", from, "err", err)
			replayed = nil
		case len(replayed) > 0 && replayed[0].Seq == from:
			covered = true
			s.stats.replaysOK.Add(1)
			s.log.Info("kv-events: replay recovered", "from", from, "batches", len(replayed), "buffered_live", len(pending))
		case len(replayed) == 0 && from == trigger.Seq:
			covered = true
			s.stats.replaysOK.Add(1)
		default:
			s.stats.replaysFailed.Add(1)
			s.log.Warn("kv-events: replay does not reach back far enough", "from", from, "replayed", len(replayed))
		}
	}
	if !covered {
		if mustCover {
			s.resetTarget(ResetGap)
		}
		s.haveSeq = false
	}
	// Apply the replayed batches, then the buffered live ones, each at most once and in order.
	next := from
	if !covered && len(replayed) > 0 {
		next = replayed[0].Seq
	}
	apply := func(seq uint64, payload []byte) {
		if s.haveSeq && seq < next {
			return
		}
		s.apply(seq, payload)
		next = seq + 1
	}
	for _, r := range replayed {
		s.stats.replayedBatches.Add(1)
		apply(r.Seq, r.Payload)
	}
	for i, m := range pending {
		if i > 0 { // pending[0] is the trigger, seen by onMessage
			s.sawLive(m.Seq)
		}
		if s.haveSeq && m.Seq > next {
			// A new hole after the replay: recover again from the remaining messages.
			return s.recoverRest(ctx, pending[i:])
		}
		if !s.haveSeq {
			next = m.Seq
		}
		apply(m.Seq, m.Payload)
	}
	return nil
}

// recoverRest re-enters the live path for buffered messages after a further gap.
func (s *Subscriber) recoverRest(ctx context.Context, rest []LiveMessage) error {
	for _, m := range rest {
		if err := s.onMessage(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// replay performs one replay exchange on the DEALER, buffering live messages meanwhile.
func (s *Subscriber) replay(ctx context.Context, from uint64, pending []LiveMessage) ([]ReplayReply, []LiveMessage, error) {
	if err := s.openDealer(); err != nil {
		return nil, pending, err
	}
	if _, err := s.dealer.SendMessage(ReplayRequestFrames(from)); err != nil {
		s.closeDealer()
		return nil, pending, fmt.Errorf("replay request: %w", err)
	}
	poller := zmq.NewPoller()
	poller.Add(s.dealer, zmq.POLLIN)
	poller.Add(s.sub, zmq.POLLIN)
	deadline := time.Now().Add(s.cfg.ReplayTimeout)
	var out []ReplayReply
	for {
		wait := time.Until(deadline)
		if wait <= 0 || ctx.Err() != nil {
			s.closeDealer() // late replies must not leak into the next exchange
			return nil, pending, fmt.Errorf("replay from %d: timeout after %d batches", from, len(out))
		}
		polled, err := poller.Poll(min(wait, pollInterval))
		if err != nil {
			continue
		}
		for _, p := range polled {
			frames, err := p.Socket.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				continue
			}
			if p.Socket == s.sub {
				m, err := ParseLive(frames)
				if err != nil {
					s.stats.parseFrames.Add(1)
					continue
				}
				if len(pending) >= s.cfg.MaxPending {
					s.stats.pendingOverflow.Add(1)
					s.closeDealer()
					return nil, pending, fmt.Errorf("replay from %d: more than %d live batches buffered", from, s.cfg.MaxPending)
				}
				pending = append(pending, m)
				continue
			}
			rep, err := ParseReplayReply(frames)
			if err != nil {
				s.stats.parseFrames.Add(1)
				s.limiter.log(s.log, "replay", err)
				continue
			}
			if rep.End {
				return out, pending, nil
			}
			if len(out) > 0 && rep.Seq != out[len(out)-1].Seq+1 {
				// ROUTER dropped replies at its HWM: the range is not contiguous.
				s.closeDealer()
				return nil, pending, fmt.Errorf("replay from %d: non-contiguous (%d after %d)", from, rep.Seq, out[len(out)-1].Seq)
			}
			out = append(out, rep)
		}
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
