package indexers

import (
	"context"
	"errors"
	"fmt"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/kvkey"
)

// A peer's snapshot is checked against the worker's own replay ring before it is installed,
// beyond its cursor batch: the ring's last warmCheckBatches batches up to the cursor are read,
// the blocks they stored (and did not remove again) on the GPU are gathered, and at least
// warmCheckShare of them must be in the snapshot (as resident worker hashes, or among its
// recently removed ones). A snapshot that carries a stolen cursor with made-up content fails
// (its blocks are not the worker's recent ones: none of them, in the test of it). An honest
// one holds them all except the stores its index dropped (a parent it never learned, a full
// index): the share is a half, not all, because the tests' adversarial streams drop about a
// quarter (TestLiveWarmStart); a snapshot refused wrongly costs a start from the ring. The
// check costs one replay exchange of at most warmCheckBatches batches.
const (
	warmCheckBatches = 16
	warmCheckShare   = 0.5
)

// errContent is a snapshot whose content the ring contradicts.
var errContent = errors.New("the snapshot lacks the blocks the worker's ring stored last")

// checkSnapshotContent reads the ring up to the snapshot's cursor and checks data's content
// against it, within ctx.
func (s *Subscriber) checkSnapshotContent(ctx context.Context, data []byte) error {
	d, err := decodeSnapshot(data, 0)
	if err != nil {
		return err
	}
	from := uint64(0)
	if d.cur.Seq >= warmCheckBatches {
		from = d.cur.Seq - (warmCheckBatches - 1)
	}
	batches, err := s.ringBatches(ctx, from, d.cur.Seq)
	if n := len(batches); err != nil || n == 0 || batches[n-1].Seq != d.cur.Seq || digest(batches[n-1].Payload) != d.cur.Digest {
		// The ring unreachable, past the cursor or of another incarnation: the sequencer's own
		// cursor check (Seed) rejects such a snapshot and counts it; nothing to add here.
		return nil
	}
	recent := make(map[kvkey.EngineHash]bool, len(d.recent))
	for _, r := range d.recent {
		recent[r.ext] = true
	}
	inSnapshot := func(h kvkey.EngineHash) bool {
		_, ok := d.ext[h]
		return ok || recent[h]
	}
	stored := map[kvkey.EngineHash]bool{}
	for _, b := range batches {
		eb, err := DecodeBatch(b.Payload)
		if err != nil {
			continue // counted when the stream applies it; says nothing about the snapshot
		}
		for _, ev := range eb.Events {
			switch e := ev.(type) {
			case *BlockStored:
				if !gpu(e.Medium) {
					continue
				}
				for _, h := range e.BlockHashes {
					stored[h.Engine()] = true
				}
			case *BlockRemoved:
				if gpu(e.Medium) {
					for _, h := range e.BlockHashes {
						delete(stored, h.Engine())
					}
				}
			case *AllBlocksCleared:
				clear(stored)
			}
		}
	}
	if len(stored) == 0 {
		return nil // nothing stored lately: nothing to check
	}
	have := 0
	for h := range stored {
		if inSnapshot(h) {
			have++
		}
	}
	if float64(have) < warmCheckShare*float64(len(stored)) {
		return fmt.Errorf("%w: %d of the %d blocks stored in batches %d-%d", errContent, have, len(stored), from, d.cur.Seq)
	}
	return nil
}

// gpu reports whether a medium is the GPU tier (no medium: pre-0.10 events).
func gpu(m Opt[string]) bool { return !m.Set || m.V == MediumGPU }

// ringBatches asks the replay socket for the batches from `from` and returns those up to `to`
// (in order), over a DEALER of its own, within ctx.
func (s *Subscriber) ringBatches(ctx context.Context, from, to uint64) ([]ReplayReply, error) {
	d, err := s.zctx.NewSocket(zmq.DEALER)
	if err != nil {
		return nil, fmt.Errorf("dealer socket: %w", err)
	}
	defer d.Close()
	_ = d.SetLinger(0)
	_ = d.SetMaxmsgsize(s.cfg.MaxMsgSize)
	if err := d.Connect(s.cfg.ReplayEndpoint); err != nil {
		return nil, fmt.Errorf("dealer %s: %w", s.cfg.ReplayEndpoint, err)
	}
	if _, err := d.SendMessage(ReplayRequestFrames(from)); err != nil {
		return nil, fmt.Errorf("replay request: %w", err)
	}
	var out []ReplayReply
	poller := zmq.NewPoller()
	poller.Add(d, zmq.POLLIN)
	for {
		wait := pollInterval
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl))
		}
		if err := ctx.Err(); err != nil || wait <= 0 {
			return nil, context.DeadlineExceeded
		}
		polled, err := poller.Poll(wait)
		if err != nil {
			return nil, fmt.Errorf("poll: %w", err)
		}
		if len(polled) == 0 {
			continue
		}
		frames, err := d.RecvMessageBytes(0)
		if err != nil {
			return nil, fmt.Errorf("replay reply: %w", err)
		}
		rep, err := ParseReplayReply(frames)
		if err != nil {
			return nil, err
		}
		if rep.End || after(rep.Seq, to) {
			return out, nil
		}
		if !after(from, rep.Seq) {
			rep.Payload = append([]byte(nil), rep.Payload...)
			out = append(out, rep)
		}
		if rep.Seq == to {
			return out, nil
		}
	}
}
