package indexers

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// EndSeq is the replay end marker's sequence number (-1 as signed 8-byte big-endian).
const EndSeq = ^uint64(0)

// DefaultReplayBufferSteps is vLLM's replay ring size in batches (buffer_steps).
const DefaultReplayBufferSteps = 10_000

// ErrFrames reports a multipart message of the wrong shape.
var ErrFrames = errors.New("kv-event: malformed multipart message")

// SeqFrame encodes a sequence number as the 8-byte big-endian frame vLLM sends.
func SeqFrame(seq uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq) }

// LiveMessage is one PUB message: [topic, seq, payload].
type LiveMessage struct {
	Topic   string
	Seq     uint64
	Payload []byte
}

// LiveFrames builds the 3 frames a vLLM PUB socket sends for one batch
// (vllm/distributed/kv_events.py ZmqEventPublisher); the topic frame is present even when empty.
func LiveFrames(topic string, seq uint64, payload []byte) [][]byte {
	return [][]byte{[]byte(topic), SeqFrame(seq), payload}
}

// ParseLive checks and splits a live message: exactly 3 frames and an 8-byte seq.
func ParseLive(frames [][]byte) (LiveMessage, error) {
	if len(frames) != 3 {
		return LiveMessage{}, fmt.Errorf("%w: %d frames, want 3", ErrFrames, len(frames))
	}
	if len(frames[1]) != 8 {
		return LiveMessage{}, fmt.Errorf("%w: seq frame of %d bytes", ErrFrames, len(frames[1]))
	}
	return LiveMessage{Topic: string(frames[0]), Seq: be64(frames[1]), Payload: frames[2]}, nil
}

// ReplayFormat selects the replay reply shape (vLLM ≥ 0.26 added the topic frame, vllm-project/vllm#45177).
type ReplayFormat int

const (
	// ReplayWithTopic is vLLM ≥ 0.26: [topic, seq, payload] per batch, end [b"", ff*8, b""].
	ReplayWithTopic ReplayFormat = iota
	// ReplayNoTopic is older vLLM: [seq, payload] per batch, end [ff*8, b""].
	ReplayNoTopic
)

// ReplayRequestFrames is what a DEALER client sends to ask for every buffered batch with
// seq ≥ start: [b"", seq8] (the empty delimiter is mandatory).
func ReplayRequestFrames(start uint64) [][]byte { return [][]byte{{}, SeqFrame(start)} }

// ParseReplayRequest parses what a ROUTER receives: [identity, b"", seq8]. vLLM ignores any
// other shape, and so should a simulated worker.
func ParseReplayRequest(frames [][]byte) (identity []byte, start uint64, err error) {
	if len(frames) != 3 || len(frames[1]) != 0 || len(frames[2]) != 8 {
		return nil, 0, fmt.Errorf("%w: invalid replay request (%d frames)", ErrFrames, len(frames))
	}
	return frames[0], be64(frames[2]), nil
}

// ReplayReplyFrames is what a ROUTER sends for one buffered batch, identity first.
func ReplayReplyFrames(identity []byte, f ReplayFormat, topic string, seq uint64, payload []byte) [][]byte {
	if f == ReplayNoTopic {
		return [][]byte{identity, {}, SeqFrame(seq), payload}
	}
	return [][]byte{identity, {}, []byte(topic), SeqFrame(seq), payload}
}

// ReplayEndFrames is the ROUTER's end marker after the last replayed batch.
func ReplayEndFrames(identity []byte, f ReplayFormat) [][]byte {
	if f == ReplayNoTopic {
		return [][]byte{identity, {}, SeqFrame(EndSeq), {}}
	}
	return [][]byte{identity, {}, {}, SeqFrame(EndSeq), {}}
}

// ReplayReply is one reply as a DEALER sees it.
type ReplayReply struct {
	Seq     uint64
	Payload []byte
	// End is set for the end marker (empty payload or seq == EndSeq).
	End bool
	// Topic is the topic frame of the ≥0.26 format ("" for the old format).
	Topic string
}

// ParseReplayReply accepts both formats as a DEALER receives them: [b"", seq, payload] or
// [b"", topic, seq, payload] (a missing leading delimiter is tolerated).
func ParseReplayReply(frames [][]byte) (ReplayReply, error) {
	if len(frames) > 0 && len(frames[0]) == 0 && len(frames) >= 3 {
		frames = frames[1:]
	}
	var rep ReplayReply
	switch len(frames) {
	case 2:
	case 3:
		rep.Topic = string(frames[0])
		frames = frames[1:]
	default:
		return rep, fmt.Errorf("%w: replay reply with %d frames", ErrFrames, len(frames))
	}
	if len(frames[0]) != 8 {
		return rep, fmt.Errorf("%w: replay seq frame of %d bytes", ErrFrames, len(frames[0]))
	}
	rep.Seq = be64(frames[0])
	rep.Payload = frames[1]
	rep.End = len(rep.Payload) == 0 || rep.Seq == EndSeq
	return rep, nil
}

// ReplayBuffer is the publisher's ring of recent (seq, payload) batches (vLLM's deque of
// buffer_steps). It is not safe for concurrent use: the publisher's socket goroutine owns it.
type ReplayBuffer struct {
	seqs     []uint64
	payloads [][]byte
	start, n int
}

// NewReplayBuffer returns a ring holding the last capacity batches (≥1).
func NewReplayBuffer(capacity int) *ReplayBuffer {
	capacity = max(capacity, 1)
	return &ReplayBuffer{seqs: make([]uint64, capacity), payloads: make([][]byte, capacity)}
}

// Add appends a batch, evicting the oldest when full.
func (b *ReplayBuffer) Add(seq uint64, payload []byte) {
	c := len(b.seqs)
	i := (b.start + b.n) % c
	if b.n == c {
		b.start = (b.start + 1) % c
	} else {
		b.n++
	}
	b.seqs[i], b.payloads[i] = seq, payload
}

// Since calls fn, in order, for every buffered batch with seq ≥ start.
func (b *ReplayBuffer) Since(start uint64, fn func(seq uint64, payload []byte)) {
	c := len(b.seqs)
	for k := range b.n {
		i := (b.start + k) % c
		if b.seqs[i] >= start {
			fn(b.seqs[i], b.payloads[i])
		}
	}
}

// Len returns the number of buffered batches.
func (b *ReplayBuffer) Len() int { return b.n }

// BatchDPRank reads only the data_parallel_rank of an encoded EventBatch (array or map form),
// skipping the events: the collector uses it to attribute a batch to a rank before the
// target's sequencer sees it. A 2-element (v0.9.0) batch has no rank (unset).
func BatchDPRank(payload []byte) (Opt[int64], error) {
	r := &reader{b: payload}
	switch r.kind() {
	case kArray:
		n, err := r.arrayLen()
		if err != nil {
			return Opt[int64]{}, err
		}
		if n < 2 {
			return Opt[int64]{}, fmt.Errorf("%w: %d elements", ErrNotBatch, n)
		}
		for range 2 {
			if err := r.skip(1); err != nil {
				return Opt[int64]{}, err
			}
		}
		if n < 3 {
			return Opt[int64]{}, nil
		}
		return r.optInt()
	case kMap:
		n, err := r.mapLen()
		if err != nil {
			return Opt[int64]{}, err
		}
		for range n {
			k, err := r.key()
			if err != nil {
				return Opt[int64]{}, err
			}
			if k == "data_parallel_rank" {
				return r.optInt()
			}
			if err := r.skip(1); err != nil {
				return Opt[int64]{}, err
			}
		}
		return Opt[int64]{}, nil
	}
	return Opt[int64]{}, ErrNotBatch
}
