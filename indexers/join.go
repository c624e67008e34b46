package indexers

import (
	"context"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// joinState is one target's view of its SUB's connection and of the join replay.
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
	connected bool      // the SUB has a peer (handshake done, or a batch arrived)
	due       bool      // a join replay runs as soon as connected
	watching  bool      // a join replay is under way: plan the second look when it ends
	sawLive   bool      // a live batch arrived since the join replay started
	confirmAt time.Time // when to ask the replay socket once more; zero = not planned
	settle    time.Duration
	// dropped is set when the SUB's connection to the worker dropped: the next handshake is a
	// reconnect, which may be a restarted worker (a fast restart need not flap /health).
	dropped bool
}

// replayDone is called when an exchange ends: after a join replay with no live batch seen,
// the second look is planned.
func (j *joinState) replayDone() {
	if j.watching {
		j.watching = false
		if !j.sawLive {
			j.confirmAt = time.Now().Add(j.settle)
		}
	}
}

// connState is the subscription state outside a replay.
func (s *Subscriber) connState() string {
	switch {
	case s.seq.Replaying():
		return StateReplaying
	case s.join.connected:
		return StateLive
	}
	return StateConnecting
}

// joinIfDue runs the join replay once connected, and its second look when JoinSettle passed
// without a live batch.
func (s *Subscriber) joinIfDue(now time.Time) {
	if s.cfg.ReplayEndpoint == "" {
		s.join.due = false
		return
	}
	switch {
	case s.join.due && s.join.connected && !s.seq.Replaying():
		s.join.due = false
		s.join.watching, s.join.sawLive = true, false
		s.join.settle = s.cfg.JoinSettle
		s.stats.joinReplays.Add(1)
		s.exec(s.seq.Join())
	case !s.join.confirmAt.IsZero() && !now.Before(s.join.confirmAt) && !s.seq.Replaying():
		s.join.confirmAt = time.Time{}
		s.exec(s.seq.Join())
	}
}

// pollWait is how long the loop may block before a target's next timed step is due.
func (s *Subscriber) pollWait(now time.Time) time.Duration {
	w := pollInterval
	for _, t := range []time.Time{s.join.confirmAt, s.replayDeadline} {
		if !t.IsZero() {
			w = min(w, max(0, t.Sub(now)))
		}
	}
	return w
}

// openMonitor watches a SUB's connections (before it connects or binds, so that no event is
// missed). It returns nil when monitoring is unavailable: the targets then join at once.
func openMonitor(zctx *zmq.Context, sub *zmq.Socket, addr string, log *slog.Logger) *zmq.Socket {
	if err := sub.Monitor(addr, zmq.EVENT_HANDSHAKE_SUCCEEDED|zmq.EVENT_DISCONNECTED|zmq.EVENT_CONNECT_RETRIED); err != nil {
		log.Warn("kv-events: socket monitor unavailable; joining without waiting for the connection", "err", err)
		return nil
	}
	mon, err := zctx.NewSocket(zmq.PAIR)
	if err != nil {
		log.Warn("kv-events: socket monitor unavailable", "err", err)
		return nil
	}
	_ = mon.SetLinger(0)
	if err := mon.Connect(addr); err != nil {
		mon.Close()
		log.Warn("kv-events: socket monitor unavailable", "err", err)
		return nil
	}
	return mon
}

// feed is one SUB socket and the targets whose batches arrive on it: one target for a
// subscription to a worker's PUB, every collector target for the collector's bound SUB. It owns
// the sockets' goroutine: the SUB, its monitor and each target's replay DEALER are polled
// together.
type feed struct {
	sub, mon *zmq.Socket
	streams  []*Subscriber
	// route attributes a live batch to its target (nil: dropped, counted by route).
	route func(LiveMessage) *Subscriber
	// shared is set for the collector: a disconnect of one publisher says nothing about the
	// others, so only handshakes are acted on.
	shared bool
	// sender, when set (a guarded collector), checks a routed message's sender (its
	// Peer-Address property) against its target's worker; false drops the message.
	sender func(s *Subscriber, peer string) bool
	// lostWait, when > 0 (a SUB that connects), is how long after a disconnect libzmq may take
	// to retry before the socket is given up and recreated: libzmq does not reconnect after a
	// protocol error, such as a message above ZMQ_MAXMSGSIZE.
	lostWait time.Duration
	lostAt   time.Time
}

func (f *feed) closeMonitor() {
	if f.mon != nil {
		// Stop the monitor before closing either end: libzmq keeps a monitored socket's
		// internal monitor socket (and its eventfd) alive otherwise, one per session, which
		// leaks a descriptor each time a worker's subscription ends (measured with discovery
		// churn: docs/benchmarks/2026-12-05-discovery-churn.md).
		_ = f.sub.Monitor("", 0)
		f.mon.Close()
		f.mon = nil
	}
}

// run follows the SUB until ctx ends or a socket fails.
func (f *feed) run(ctx context.Context) error {
	for _, s := range f.streams {
		s.join = joinState{}
		if f.mon == nil {
			s.join.connected, s.join.due = true, true // no monitor: trust the connection
		}
		s.setState(s.connState())
	}
	for ctx.Err() == nil {
		now := time.Now()
		if !f.lostAt.IsZero() && now.Sub(f.lostAt) > f.lostWait {
			return fmt.Errorf("connection dropped and not retried (a message above max_msg_size?)")
		}
		wait := pollInterval
		poller := zmq.NewPoller()
		poller.Add(f.sub, zmq.POLLIN)
		if f.mon != nil {
			poller.Add(f.mon, zmq.POLLIN)
		}
		dealers := map[*zmq.Socket]*Subscriber{}
		for _, s := range f.streams {
			s.step(ctx, now)
			wait = min(wait, s.pollWait(now))
			if s.dealer != nil {
				poller.Add(s.dealer, zmq.POLLIN)
				dealers[s.dealer] = s
			}
		}
		polled, err := poller.Poll(wait)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			return fmt.Errorf("poll: %w", err)
		}
		for _, p := range polled {
			switch {
			case p.Socket == f.sub:
				f.onSub()
			case p.Socket == f.mon:
				f.onMonitor()
			default:
				if s := dealers[p.Socket]; s != nil {
					s.onDealer()
				}
			}
		}
	}
	return nil
}

// onSub drains the SUB socket.
func (f *feed) onSub() {
	for range 1000 { // bounded, so that replies and timers are not starved
		var frames [][]byte
		var peer string
		var err error
		if f.sender != nil {
			var md map[string]string
			frames, md, err = f.sub.RecvMessageBytesWithMetadata(zmq.DONTWAIT, "Peer-Address")
			peer = md["Peer-Address"]
		} else {
			frames, err = f.sub.RecvMessageBytes(zmq.DONTWAIT)
		}
		if err != nil {
			return
		}
		m, err := ParseLive(frames)
		if err != nil {
			if s := f.frameErrTarget(); s != nil {
				s.stats.parseFrames.Add(1)
				s.limiter.log(s.log, "frames", err)
			}
			continue
		}
		if s := f.route(m); s != nil && (f.sender == nil || f.sender(s, peer)) {
			s.onLive(m)
		}
	}
}

// frameErrTarget is the target a malformed message is counted on: the only one of a
// per-worker SUB; none for the collector (it cannot be attributed).
func (f *feed) frameErrTarget() *Subscriber {
	if f.shared || len(f.streams) != 1 {
		return nil
	}
	return f.streams[0]
}

// onMonitor drains the SUB's connection events.
func (f *feed) onMonitor() {
	for {
		ev, _, _, err := f.mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			return
		}
		switch {
		case ev == zmq.EVENT_DISCONNECTED && f.lostWait > 0:
			f.lostAt = time.Now()
		case ev == zmq.EVENT_CONNECT_RETRIED || ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
			f.lostAt = time.Time{}
		}
		if ev == zmq.EVENT_CONNECT_RETRIED {
			continue
		}
		for _, s := range f.streams {
			switch {
			case ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
				// A new connection: whatever was published while we had none is only in the ring.
				s.join.connected, s.join.due = true, true
				if s.join.dropped {
					// A reconnect: the worker may have restarted (a new process re-binds the
					// same port). Ask its ring, as for a health flap, before any new batch.
					s.join.dropped = false
					s.stats.reconnectChecks.Add(1)
					s.MarkRestarted()
				}
			case ev == zmq.EVENT_DISCONNECTED && !f.shared:
				// libzmq reconnects by itself; until then the stream is not trustworthy.
				s.join.connected, s.join.dropped = false, true
				s.join.confirmAt = time.Time{}
			}
			s.setState(s.connState())
		}
	}
}
