package sim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/zeebo/xxh3"

	"github.com/kvgate/kvgate/indexers"
)

// publisher is vLLM's ZmqEventPublisher for one DP rank (vllm/distributed/kv_events.py): a PUB socket
// sending [topic, seq, payload] per engine step with events, a ring of the last buffer_steps
// payloads, and a ROUTER socket answering replay requests. One goroutine owns both sockets,
// so replies are consistent with the live order, as in vLLM's publisher thread.
type publisher struct {
	rank           int
	topic          string
	enc            indexers.EncodeOptions
	replayFormat   indexers.ReplayFormat
	faults         Faults
	ids            hashIDs
	endpoint       string // effective PUB endpoint (port 0 resolved)
	replayEndpoint string // effective ROUTER endpoint, "" without replay

	zctx     *zmq.Context
	pub      *zmq.Socket
	router   *zmq.Socket
	buf      *indexers.ReplayBuffer
	bufSteps int

	queue     chan pubItem
	done      chan struct{}
	closeOnce sync.Once

	now   func() time.Time // batch timestamps (tests pin it)
	seq   uint64           // next sequence number (socket goroutine only)
	count int              // messages since start, for SkipSeqEvery
	rng   *rand.Rand

	batches, events, dropped atomic.Int64
}

// pubItem is one queued batch, or a restart marker.
type pubItem struct {
	ts      float64
	events  []kvEvent
	restart bool
}

// offsetEndpoint applies vLLM's offset_endpoint_port for DP rank r, shared with the
// gateway: port 0 stays 0 on every rank (OS-assigned, vLLM #55844), libzmq's "*" port is
// accepted on rank 0 only, as vLLM does.
func offsetEndpoint(ep string, rank int) (string, error) { return indexers.OffsetEndpoint(ep, rank) }

// shouldBind is vLLM's heuristic: bind wildcard, IPv6-any, ipc and inproc endpoints, connect
// to anything else (a collector that binds).
func shouldBind(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") ||
		strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
}

// zmqEndpoint maps vLLM's port 0 to libzmq's ephemeral-port syntax.
func zmqEndpoint(ep string) string {
	if strings.HasPrefix(ep, "tcp://") && strings.HasSuffix(ep, ":0") {
		return strings.TrimSuffix(ep, "0") + "*"
	}
	return ep
}

func newPublisher(o Options, rank int) (*publisher, error) {
	kv := o.KVEvents
	p := &publisher{
		rank:         rank,
		topic:        kv.Topic,
		enc:          indexers.EncodeOptions{Layout: o.Encoding.Layout, BytesHashes: o.Encoding.BytesHashes},
		replayFormat: o.Encoding.Replay,
		faults:       o.Faults,
		buf:          indexers.NewReplayBuffer(kv.BufferSteps),
		bufSteps:     kv.BufferSteps,
		queue:        make(chan pubItem, kv.MaxQueueSize),
		done:         make(chan struct{}),
		rng:          rand.New(rand.NewPCG(uint64(o.Faults.Seed)+7, uint64(rank))),
		now:          time.Now,
		ids:          hashIDs{opaque: o.Encoding.OpaqueHashes},
	}
	binary.LittleEndian.PutUint64(p.ids.key[:], o.Encoding.HashSeed+uint64(rank)*0x9e3779b97f4a7c15)
	ep, err := offsetEndpoint(kv.Endpoint, rank)
	if err != nil {
		return nil, err
	}
	rep, err := offsetEndpoint(kv.ReplayEndpoint, rank)
	if err != nil {
		return nil, err
	}
	if err := p.open(ep, rep, kv.HWM); err != nil {
		p.closeSockets()
		return nil, err
	}
	go p.loop()
	return p, nil
}

func (p *publisher) open(ep, rep string, hwm int) error {
	var err error
	if p.zctx, err = zmq.NewContext(); err != nil {
		return fmt.Errorf("zmq context: %w", err)
	}
	if p.pub, err = p.zctx.NewSocket(zmq.PUB); err != nil {
		return fmt.Errorf("zmq pub socket: %w", err)
	}
	if err := errors.Join(p.pub.SetSndhwm(hwm), p.pub.SetRcvhwm(hwm), p.pub.SetLinger(0)); err != nil {
		return fmt.Errorf("zmq pub options: %w", err)
	}
	if shouldBind(ep) {
		if err := p.pub.Bind(zmqEndpoint(ep)); err != nil {
			return fmt.Errorf("bind %s: %w", ep, err)
		}
		p.endpoint, _ = p.pub.GetLastEndpoint()
	} else {
		if err := p.pub.Connect(ep); err != nil {
			return fmt.Errorf("connect %s: %w", ep, err)
		}
		p.endpoint = ep
	}
	if rep == "" {
		return nil
	}
	if p.router, err = p.zctx.NewSocket(zmq.ROUTER); err != nil {
		return fmt.Errorf("zmq router socket: %w", err)
	}
	if err := p.router.SetLinger(0); err != nil {
		return fmt.Errorf("zmq router options: %w", err)
	}
	if err := p.router.Bind(zmqEndpoint(rep)); err != nil { // vLLM always binds the replay socket
		return fmt.Errorf("bind replay %s: %w", rep, err)
	}
	p.replayEndpoint, _ = p.router.GetLastEndpoint()
	return nil
}

// publish queues one engine step's events; like vLLM it blocks when the queue is full
// (back-pressure on the scheduler) rather than dropping.
func (p *publisher) publish(ctx context.Context, ev []kvEvent) {
	select {
	case <-ctx.Done():
	case p.queue <- pubItem{ts: unixSeconds(p.now()), events: ev}:
	case <-p.done:
	}
}

// unixSeconds is Python's time.time() for t.
func unixSeconds(t time.Time) float64 { return float64(t.Unix()) + float64(t.Nanosecond())/1e9 }

// restart makes the publisher start over at seq 0 with an empty replay buffer.
func (p *publisher) restart(ctx context.Context) {
	select {
	case <-ctx.Done():
	case p.queue <- pubItem{restart: true}:
	case <-p.done:
	}
}

func (p *publisher) close() error {
	p.closeOnce.Do(func() { close(p.done) })
	return nil
}

func (p *publisher) loop() {
	defer p.closeSockets()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var payload []byte
	var batch indexers.EventBatch
	for {
		select {
		case <-p.done:
			return
		case it := <-p.queue:
			if it.restart {
				p.seq, p.count = 0, 0
				p.buf = indexers.NewReplayBuffer(p.bufSteps)
				continue
			}
			toWire(&batch, it, p.rank, p.ids)
			var err error
			payload, err = indexers.EncodeBatch(&batch, p.enc)
			if err != nil {
				continue // cannot happen for the values the simulator produces
			}
			p.send(payload, len(it.events))
		case <-tick.C:
		}
		p.serviceReplay()
	}
}

func (p *publisher) send(payload []byte, nEvents int) {
	seq := p.seq
	p.seq++
	p.count++
	if n := p.faults.SkipSeqEvery; n > 0 && p.count%n == 0 {
		p.seq++ // a sequence number that never exists: an unrecoverable gap
	}
	p.buf.Add(seq, payload)
	p.batches.Add(1)
	p.events.Add(int64(nEvents))
	if p.faults.DropEventRate > 0 && p.rng.Float64() < p.faults.DropEventRate {
		p.dropped.Add(1)
		return // lost on the wire (HWM); still replayable
	}
	_, _ = p.pub.SendMessage(indexers.LiveFrames(p.topic, seq, payload))
}

// serviceReplay answers every pending replay request without blocking.
func (p *publisher) serviceReplay() {
	if p.router == nil {
		return
	}
	for {
		frames, err := p.router.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			return // EAGAIN: nothing pending
		}
		id, start, err := indexers.ParseReplayRequest(frames)
		if err != nil {
			continue // vLLM logs "Invalid replay request" and sends nothing
		}
		p.buf.Since(start, func(seq uint64, payload []byte) {
			_, _ = p.router.SendMessage(indexers.ReplayReplyFrames(id, p.replayFormat, p.topic, seq, payload))
		})
		_, _ = p.router.SendMessage(indexers.ReplayEndFrames(id, p.replayFormat))
	}
}

func (p *publisher) closeSockets() {
	for _, s := range []*zmq.Socket{p.pub, p.router} {
		if s != nil {
			_ = s.Close()
		}
	}
	if p.zctx != nil {
		_ = p.zctx.Term()
	}
}

// toWire converts the simulator's events into the wire encoder's structs.
func toWire(b *indexers.EventBatch, it pubItem, rank int, ids hashIDs) {
	b.TS = it.ts
	b.DPRank = indexers.Some(int64(rank))
	b.Events = b.Events[:0]
	for _, e := range it.events {
		switch e.kind {
		case evStored:
			s := &indexers.BlockStored{
				BlockHashes: ids.wire(e.hashes),
				TokenIDs:    e.tokens,
				BlockSize:   int64(e.blockSize),
				Medium:      indexers.Some(e.medium),
			}
			if s.TokenIDs == nil {
				s.TokenIDs = []uint32{}
			}
			if e.hasParent {
				s.ParentBlockHash = indexers.Some(indexers.IntHash(ids.id(e.parent)))
			}
			if e.loraName != "" {
				s.LoRAID = indexers.Some(int64(e.loraID))
				s.LoRAName = indexers.Some(e.loraName)
			}
			if !e.placeholder {
				s.ExtraKeys = make([][]any, len(e.extra))
				for i, keys := range e.extra {
					if keys == nil {
						continue
					}
					k := make([]any, len(keys))
					for j, v := range keys {
						k[j] = v
					}
					s.ExtraKeys[i] = k
				}
				if e.medium == mediumGPU {
					s.GroupIdx = indexers.Some(int64(0))
					s.KVCacheSpecKind = indexers.Some("full_attention")
				}
			}
			if e.sessionID != "" {
				s.SessionID = indexers.Some(e.sessionID)
			}
			b.Events = append(b.Events, s)
		case evRemoved:
			r := &indexers.BlockRemoved{BlockHashes: ids.wire(e.hashes), Medium: indexers.Some(e.medium)}
			if e.medium == mediumGPU {
				r.GroupIdx = indexers.Some(int64(0))
			}
			b.Events = append(b.Events, r)
		case evCleared:
			b.Events = append(b.Events, &indexers.AllBlocksCleared{})
		}
	}
}

// hashIDs maps the simulator's block hashes (kvgate's content keys) to the ids put on the wire:
// the same values, or with OpaqueHashes a keyed mix that differs per engine, as vLLM's
// sha256-over-random-NONE_HASH ids do. Parent links stay consistent either way.
type hashIDs struct {
	opaque bool
	key    [8]byte
}

func (h hashIDs) id(x uint64) uint64 {
	if !h.opaque {
		return x
	}
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], x)
	copy(b[8:], h.key[:])
	return xxh3.Hash(b[:])
}

func (h hashIDs) wire(hs []uint64) []indexers.WireHash {
	out := make([]indexers.WireHash, len(hs))
	for i, x := range hs {
		out[i] = indexers.IntHash(h.id(x))
	}
	return out
}
