package indexers

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/kvgate/kvgate/kvkey"
)

// compareTarget fails unless a and b give target tg the same overlaps, orphan and residency
// counts for every doc prefix.
func compareTarget(t *testing.T, w *modelWorld, a, b *Index, tg kvkey.Target, what string) {
	t.Helper()
	for d, hs := range w.hashes {
		for n := 1; n <= len(hs); n++ {
			q := typed(hs[:n])
			if oa, ob := overlapOf(a, tg, q), overlapOf(b, tg, q); oa != ob {
				t.Fatalf("%s: doc %d prefix %d: original %+v, installed %+v", what, d, n, oa, ob)
			}
		}
	}
	ta, tb := a.reg.Load().byTarget[tg], b.reg.Load().byTarget[tg]
	for k := range numTiers {
		if x, y := ta.orphans[k].Load(), tb.orphans[k].Load(); x != y {
			t.Fatalf("%s: orphans[%d] original %d, installed %d", what, k, x, y)
		}
		if x, y := ta.resident[k].Load(), tb.resident[k].Load(); x != y {
			t.Fatalf("%s: resident[%d] original %d, installed %d", what, k, x, y)
		}
	}
}

// A snapshot taken mid-stream and installed on another index, then fed the same later events
// as the original, matches the original (and the model) at every step: the state it carries is
// all the apply path reads (worker hashes, references, parents, groups, recently removed).
func TestSnapshotRoundTrip(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			w := newModelWorld(r, 3)
			a := NewIndex(Options{BlockSize: modelBS})
			b := NewIndex(Options{BlockSize: modelBS})
			// b holds another target first, so the installed target gets another slot.
			if err := b.AddTarget(kvkey.Target{Worker: "http://other"}); err != nil {
				t.Fatal(err)
			}
			step := func(ti int) Event {
				ev := w.step(r, ti)
				if ev == nil {
					a.Reset(w.targets[ti])
				} else if err := a.Apply(w.targets[ti], &EventBatch{Events: []Event{ev}}); err != nil {
					t.Fatal(err)
				}
				return ev
			}
			for range 300 {
				step(r.IntN(len(w.targets)))
			}
			tg := w.targets[0]
			cur := SnapshotCursor{Seq: 41, Digest: 0xfeed}
			snap, err := a.EncodeSnapshot(tg, cur)
			if err != nil {
				t.Fatal(err)
			}
			var cs ChangeSet
			got, err := b.InstallSnapshot(tg, snap, &cs)
			if err != nil {
				t.Fatal(err)
			}
			if got != cur {
				t.Fatalf("cursor %+v, want %+v", got, cur)
			}
			if len(cs.Changes) == 0 || cs.Changes[0].Kind != ChangeCleared || !cs.Changes[0].AllTiers {
				t.Fatalf("install recorded %+v, want a reset first", cs.Changes)
			}
			again, err := b.EncodeSnapshot(tg, cur)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again, snap) {
				t.Fatalf("re-encoding the installed state differs (%d vs %d bytes)", len(again), len(snap))
			}
			compareTarget(t, w, a, b, tg, "after install")
			for i := range 300 {
				ev := step(0)
				if ev == nil {
					b.Reset(tg)
				} else if err := b.Apply(tg, &EventBatch{Events: []Event{ev}}); err != nil {
					t.Fatal(err)
				}
				compareTarget(t, w, a, b, tg, fmt.Sprintf("step %d after install (%T)", i, ev))
			}
		})
	}
}

func TestSnapshotRejects(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	w := newModelWorld(r, 1)
	src := NewIndex(Options{BlockSize: modelBS})
	tg := w.targets[0]
	for range 200 {
		if ev := w.step(r, 0); ev != nil {
			if err := src.Apply(tg, &EventBatch{Events: []Event{ev}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	snap, err := src.EncodeSnapshot(tg, SnapshotCursor{Seq: 9})
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(snap)
	flipped[len(flipped)/2] ^= 0x40
	tests := []struct {
		name   string
		data   []byte
		target kvkey.Target
		opt    Options
		want   error
	}{
		{"empty", nil, tg, Options{BlockSize: modelBS}, ErrSnapshotCorrupt},
		{"truncated", snap[:len(snap)-9], tg, Options{BlockSize: modelBS}, ErrSnapshotCorrupt},
		{"bit flipped", flipped, tg, Options{BlockSize: modelBS}, ErrSnapshotCorrupt},
		{"other target", snap, kvkey.Target{Worker: tg.Worker, DPRank: 5}, Options{BlockSize: modelBS}, ErrSnapshotMismatch},
		{"other block size", snap, tg, Options{BlockSize: 16}, ErrSnapshotMismatch},
		{"too many blocks", snap, tg, Options{BlockSize: modelBS, MaxBlocksPerTarget: 1}, ErrSnapshotMismatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := NewIndex(tc.opt)
			// The target's state before the failed install must survive it.
			apply(t, ix, tc.target, &BlockStored{BlockHashes: exts(1), TokenIDs: seqTokens(ix.opt.BlockSize, 1),
				BlockSize: int64(ix.opt.BlockSize)})
			before := ix.reg.Load().byTarget[tc.target].resident[G1].Load()
			if _, err := ix.InstallSnapshot(tc.target, tc.data, nil); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if after := ix.reg.Load().byTarget[tc.target].resident[G1].Load(); after != before || before != 1 {
				t.Fatalf("a rejected install changed the state: %d resident blocks, had %d", after, before)
			}
		})
	}
}

// BenchmarkSnapshot: encoding and installing one target of 32,768 G1 blocks (2,048 prompts of
// 16 blocks), the size of a large GPU's prefix cache; bytes/block is the wire cost.
func BenchmarkSnapshot(b *testing.B) {
	const prompts, per = 2048, 16
	tg := kvkey.Target{Worker: "http://w"}
	src := NewIndex(Options{})
	for p := range prompts {
		toks := seqTokens(per*src.opt.BlockSize, uint32(p*100_000))
		var hs []uint64
		for i := range per {
			hs = append(hs, uint64(p*per+i+1))
		}
		if err := src.Apply(tg, &EventBatch{Events: []Event{&BlockStored{BlockHashes: exts(hs...), TokenIDs: toks,
			BlockSize: int64(src.opt.BlockSize)}}}); err != nil {
			b.Fatal(err)
		}
	}
	snap, err := src.EncodeSnapshot(tg, SnapshotCursor{Seq: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encode", func(b *testing.B) {
		for b.Loop() {
			if _, err := src.EncodeSnapshot(tg, SnapshotCursor{Seq: 1}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(snap))/(prompts*per), "bytes/block")
	})
	b.Run("install", func(b *testing.B) {
		dst := NewIndex(Options{})
		for b.Loop() {
			if _, err := dst.InstallSnapshot(tg, snap, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FuzzInstallSnapshot: no snapshot body (given a valid checksum, so that the fuzzer reaches
// the structure) panics the decoder or leaves an index that panics when events and queries
// follow; a rejected one leaves the target's state alone.
func FuzzInstallSnapshot(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	w := newModelWorld(r, 1)
	src := NewIndex(Options{BlockSize: modelBS})
	tg := w.targets[0]
	var later []Event
	for i := range 160 {
		ev := w.step(r, 0)
		if ev == nil {
			continue
		}
		if i >= 120 {
			later = append(later, ev)
			continue
		}
		if err := src.Apply(tg, &EventBatch{Events: []Event{ev}}); err != nil {
			f.Fatal(err)
		}
	}
	snap, err := src.EncodeSnapshot(tg, SnapshotCursor{Seq: 3})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(snap[:len(snap)-8])
	f.Add([]byte(snapMagic + "\x01"))
	f.Fuzz(func(t *testing.T, body []byte) {
		data := binary.LittleEndian.AppendUint64(bytes.Clone(body), xxh3.Hash(body))
		ix := NewIndex(Options{BlockSize: modelBS, MaxBlocksPerTarget: 4096})
		if _, err := ix.InstallSnapshot(tg, data, nil); err != nil {
			if ts := ix.reg.Load().byTarget[tg]; ts != nil && ts.blocks() != 0 {
				t.Fatalf("a rejected snapshot left %d blocks", ts.blocks())
			}
			return
		}
		for _, ev := range later {
			_ = ix.Apply(tg, &EventBatch{Events: []Event{ev}})
		}
		for _, hs := range w.hashes {
			o := overlapOf(ix, tg, typed(hs))
			if o.G1 < 0 || o.G2 < 0 || o.G3 < 0 || o.G1+o.G2+o.G3 > len(hs) {
				t.Fatalf("malformed overlap %+v", o)
			}
		}
		if _, err := ix.EncodeSnapshot(tg, SnapshotCursor{}); err != nil {
			t.Fatal(err)
		}
	})
}
