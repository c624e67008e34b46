package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
)

// The load-sync wire (kvgate.v1.<fleet>.load.<replica> and .approx.<replica>), version 1. All
// integers are varints (encoding/binary; signed ones zigzag) except the epoch, 8 bytes little
// endian:
//
//	version=1, kind, len(replica) replica, epoch, seq, n, n × entry
//	load entry:   len(worker) worker, dp_rank, requests, prefill_requests, prefill_tokens,
//	              blocks, ahead_tokens, ahead_pairs, decodes, decode_kv   (signed)
//	approx entry: len(worker) worker, dp_rank, m, m × block hash (8 bytes little endian)
//
// A delta's entries are signed increments summed over the batch window (one entry per target);
// a snapshot's are the replica's absolute totals; an approx message lists prompts routed to
// targets in approximate mode; a leave message (no entries) says the replica is shutting down.
const wireVersion = 1

// Message kinds.
const (
	kindDelta    byte = 1
	kindSnapshot byte = 2
	kindApprox   byte = 3
	kindLeave    byte = 4
)

// Bounds of one message, checked when decoding (and kept when encoding).
const (
	maxReplicaID     = 128
	maxWorkerURL     = 2048
	maxWireEntries   = 4096 // targets in one load message, prompts in one approx message
	maxApproxHashes  = 2048 // blocks of one prompt in an approx message (a longer prompt: its head)
	maxApproxTotal   = 8192 // blocks in one approx message (64 KiB of hashes)
	maxDeltaEntries  = 512  // a larger batch goes out as several delta messages
	maxWireDPRank    = 1 << 16
	maxWireLoadField = 1 << 50
)

// wireMsg is one decoded load-sync message.
type wireMsg struct {
	kind    byte
	replica string
	epoch   uint64
	seq     uint64
	load    []router.TargetLoadVector
	approx  []approxEntry
}

// approxEntry is one prompt routed to a target in approximate mode.
type approxEntry struct {
	target kvkey.Target
	hashes []kvkey.BlockHash
}

func appendHeader(b []byte, kind byte, replica string, epoch, seq uint64, n int) []byte {
	b = append(b, wireVersion, kind)
	b = binary.AppendUvarint(b, uint64(len(replica)))
	b = append(b, replica...)
	b = binary.LittleEndian.AppendUint64(b, epoch)
	b = binary.AppendUvarint(b, seq)
	return binary.AppendUvarint(b, uint64(n))
}

func appendTarget(b []byte, t kvkey.Target) []byte {
	b = binary.AppendUvarint(b, uint64(len(t.Worker)))
	b = append(b, t.Worker...)
	return binary.AppendUvarint(b, uint64(t.DPRank))
}

// encodeLoad encodes a delta or snapshot message.
func encodeLoad(kind byte, replica string, epoch, seq uint64, entries []router.TargetLoadVector) []byte {
	b := make([]byte, 0, 32+len(replica)+len(entries)*64)
	b = appendHeader(b, kind, replica, epoch, seq, len(entries))
	for _, e := range entries {
		b = appendTarget(b, e.Target)
		v := e.Load
		for _, x := range [...]int64{v.Requests, v.PrefillRequests, v.PrefillTokens, v.Blocks,
			v.AheadTokens, v.AheadPairs, v.Decodes, v.DecodeKV} {
			b = binary.AppendVarint(b, x)
		}
	}
	return b
}

// encodeApprox encodes an approx message.
func encodeApprox(replica string, epoch, seq uint64, entries []approxEntry) []byte {
	n := 0
	for _, e := range entries {
		n += len(e.hashes)
	}
	b := make([]byte, 0, 32+len(replica)+len(entries)*48+n*8)
	b = appendHeader(b, kindApprox, replica, epoch, seq, len(entries))
	for _, e := range entries {
		b = appendTarget(b, e.target)
		b = binary.AppendUvarint(b, uint64(len(e.hashes)))
		for _, h := range e.hashes {
			b = binary.LittleEndian.AppendUint64(b, uint64(h))
		}
	}
	return b
}

// errShort is a message cut short.
var errShort = errors.New("message truncated")

// wireReader reads the fields of one message, remembering the first error.
type wireReader struct {
	b   []byte
	err error
}

func (r *wireReader) uvarint(limit uint64, what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("%s: %w", what, errShort)
		return 0
	}
	r.b = r.b[n:]
	if v > limit {
		r.err = fmt.Errorf("%s %d over the limit %d", what, v, limit)
		return 0
	}
	return v
}

func (r *wireReader) varint(what string) int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("%s: %w", what, errShort)
		return 0
	}
	r.b = r.b[n:]
	if v > maxWireLoadField || v < -maxWireLoadField {
		r.err = fmt.Errorf("%s %d out of range", what, v)
		return 0
	}
	return v
}

func (r *wireReader) u64(what string) uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 8 {
		r.err = fmt.Errorf("%s: %w", what, errShort)
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *wireReader) str(limit uint64, what string) string {
	n := r.uvarint(limit, what+" length")
	if r.err != nil {
		return ""
	}
	if uint64(len(r.b)) < n {
		r.err = fmt.Errorf("%s: %w", what, errShort)
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *wireReader) target() kvkey.Target {
	w := r.str(maxWorkerURL, "worker")
	rank := r.uvarint(maxWireDPRank, "dp_rank")
	return kvkey.Target{Worker: w, DPRank: int(rank)}
}

// decodeMsg decodes one message; anything malformed or over a bound is an error.
func decodeMsg(b []byte) (wireMsg, error) {
	var m wireMsg
	if len(b) < 2 {
		return m, fmt.Errorf("load message: %w", errShort)
	}
	if b[0] != wireVersion {
		return m, fmt.Errorf("load message: version %d, want %d", b[0], wireVersion)
	}
	m.kind = b[1]
	if m.kind < kindDelta || m.kind > kindLeave {
		return m, fmt.Errorf("load message: unknown kind %d", m.kind)
	}
	r := &wireReader{b: b[2:]}
	m.replica = r.str(maxReplicaID, "replica")
	m.epoch = r.u64("epoch")
	m.seq = r.uvarint(^uint64(0), "seq")
	n := r.uvarint(maxWireEntries, "entries")
	total := uint64(0)
	for i := uint64(0); i < n && r.err == nil; i++ {
		t := r.target()
		switch m.kind {
		case kindApprox:
			k := r.uvarint(maxApproxHashes, "hashes")
			if total += k; total > maxApproxTotal {
				return m, fmt.Errorf("load message: %d hashes over the limit %d", total, maxApproxTotal)
			}
			if r.err == nil && uint64(len(r.b)) < 8*k {
				r.err = fmt.Errorf("hashes: %w", errShort)
			}
			if r.err != nil {
				break
			}
			hs := make([]kvkey.BlockHash, k)
			for j := range hs {
				hs[j] = kvkey.BlockHash(r.u64("hash"))
			}
			m.approx = append(m.approx, approxEntry{target: t, hashes: hs})
		default:
			var v router.LoadVector
			v.Requests = r.varint("requests")
			v.PrefillRequests = r.varint("prefill_requests")
			v.PrefillTokens = r.varint("prefill_tokens")
			v.Blocks = r.varint("blocks")
			v.AheadTokens = r.varint("ahead_tokens")
			v.AheadPairs = r.varint("ahead_pairs")
			v.Decodes = r.varint("decodes")
			v.DecodeKV = r.varint("decode_kv")
			m.load = append(m.load, router.TargetLoadVector{Target: t, Load: v})
		}
	}
	if r.err != nil {
		return m, fmt.Errorf("load message: %w", r.err)
	}
	if len(r.b) != 0 {
		return m, fmt.Errorf("load message: %d trailing bytes", len(r.b))
	}
	if m.replica == "" {
		return m, errors.New("load message: empty replica id")
	}
	return m, nil
}
