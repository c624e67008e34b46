package indexers

import (
	"context"
	"fmt"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// joinState is the socket goroutine's view of the SUB's connection and of the join replay.
//
// A worker publishes whether or not anyone listens, so batches published before the SUB
// connected (or while it was away) are only in the worker's replay ring. Rather than wait for a
// later live batch to reveal them as a gap, the subscriber asks for them as soon as the SUB has a
// peer (the ZMTP handshake, seen through a socket monitor): from seq 0 on a first join or after
// a reset, from last+1 after a reconnect. Even after the handshake the PUB may not yet have
// processed the subscription (ZMQ's slow joiner), so a batch published right after the join
// replay can reach nobody; unless a live batch arrives within JoinSettle (after which any loss
// shows up as a gap), the subscriber asks once more.
type joinState struct {
	mon       *zmq.Socket // PAIR reading the SUB's monitor events; nil if monitoring failed
	connected bool        // the SUB has a peer (handshake done, or a batch arrived)
	due       bool        // a join replay runs as soon as connected
	confirmAt time.Time   // when to ask the replay socket once more; zero = not planned
}

// openMonitor watches the SUB's connections. Without it the subscriber joins at once.
func (s *Subscriber) openMonitor() {
	s.monitors++
	addr := fmt.Sprintf("inproc://kvgate-kv-monitor-%p-%d", s, s.monitors)
	if err := s.sub.Monitor(addr, zmq.EVENT_HANDSHAKE_SUCCEEDED|zmq.EVENT_DISCONNECTED); err != nil {
		s.log.Warn("kv-events: socket monitor unavailable; joining without waiting for the connection", "err", err)
		return
	}
	mon, err := s.zctx.NewSocket(zmq.PAIR)
	if err != nil {
		s.log.Warn("kv-events: socket monitor unavailable", "err", err)
		return
	}
	_ = mon.SetLinger(0)
	if err := mon.Connect(addr); err != nil {
		mon.Close()
		s.log.Warn("kv-events: socket monitor unavailable", "err", err)
		return
	}
	s.join.mon = mon
}

func (s *Subscriber) closeMonitor() {
	if s.join.mon != nil {
		s.join.mon.Close()
		s.join.mon = nil
	}
}

// connState is the subscription state outside a replay.
func (s *Subscriber) connState() string {
	if s.join.connected {
		return StateLive
	}
	return StateConnecting
}

// onMonitor drains the SUB's connection events.
func (s *Subscriber) onMonitor() {
	for {
		ev, _, _, err := s.join.mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			return
		}
		switch ev {
		case zmq.EVENT_HANDSHAKE_SUCCEEDED:
			// A new connection: whatever was published while we had none is only in the ring.
			s.join.connected, s.join.due = true, true
			s.setState(StateLive)
		case zmq.EVENT_DISCONNECTED:
			// libzmq reconnects by itself; until then the stream is not trustworthy.
			s.join.connected = false
			s.join.confirmAt = time.Time{}
			s.setState(StateConnecting)
		}
	}
}

// pollWait is how long the socket goroutine may block before the next join step is due.
func (j *joinState) pollWait() time.Duration {
	if j.confirmAt.IsZero() {
		return pollInterval
	}
	return max(0, min(time.Until(j.confirmAt), pollInterval))
}

// joinIfDue runs the join replay once connected, and its second look when JoinSettle passed
// without a live batch.
func (s *Subscriber) joinIfDue(ctx context.Context) error {
	if s.cfg.ReplayEndpoint == "" {
		s.join.due = false
		return nil
	}
	switch {
	case s.join.due && s.join.connected:
		s.join.due = false
		s.stats.joinReplays.Add(1)
		sawLive, err := s.catchUp(ctx)
		if err != nil {
			return err
		}
		if !sawLive {
			s.join.confirmAt = time.Now().Add(s.cfg.JoinSettle)
		}
	case !s.join.confirmAt.IsZero() && !time.Now().Before(s.join.confirmAt):
		s.join.confirmAt = time.Time{}
		_, err := s.catchUp(ctx)
		return err
	}
	return nil
}

// catchUp asks the replay socket for every batch after the last applied one (from seq 0 when
// none is) instead of waiting for a live batch to reveal what was missed. Live batches arriving
// meanwhile are buffered: those the replay delivered too are dropped, the rest take the live
// path, where a hole is recovered like any gap. It reports whether live batches arrived.
func (s *Subscriber) catchUp(ctx context.Context) (bool, error) {
	from := uint64(0)
	if s.haveSeq {
		from = s.last + 1
	}
	s.setState(StateReplaying)
	replayed, pending, err := s.replay(ctx, from, nil)
	s.setState(s.connState())
	switch {
	case err != nil && ctx.Err() != nil:
		return false, nil // shutting down
	case err != nil:
		s.stats.replaysFailed.Add(1)
		s.log.Warn("kv-events: join replay failed; relying on the live stream", "from", from, "err", err)
		replayed = nil
	case len(replayed) > 0 && replayed[0].Seq != from && s.haveSeq:
		// The ring no longer reaches back to what the index holds: batches are lost for good.
		s.stats.gaps.Add(1)
		s.stats.replaysFailed.Add(1)
		s.log.Warn("kv-events: replay does not reach back far enough", "from", from, "first", replayed[0].Seq)
		s.resetTarget(ResetGap)
		s.haveSeq = false
	case len(replayed) > 0 && replayed[0].Seq != from:
		// First join after the ring wrapped: partial knowledge is accepted (spec §8.7).
		s.stats.midStream.Add(1)
		s.stats.replaysOK.Add(1)
	default:
		s.stats.replaysOK.Add(1)
	}
	if len(replayed) > 0 {
		s.log.Info("kv-events: caught up through replay", "from", from, "batches", len(replayed), "buffered_live", len(pending))
	}
	for _, r := range replayed {
		s.stats.replayedBatches.Add(1)
		s.apply(r.Seq, r.Payload)
	}
	for _, m := range pending {
		if len(replayed) > 0 && m.Seq >= replayed[0].Seq && m.Seq <= replayed[len(replayed)-1].Seq {
			s.sawLive(m.Seq)
			continue // delivered by the replay as well
		}
		if err := s.onMessage(ctx, m); err != nil {
			return true, err
		}
	}
	return len(pending) > 0, nil
}
