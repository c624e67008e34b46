package indexers

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// in is one input of a sequencer table: op live|rb (replay batch)|end|fail|hint|join|clear|tick.
// Payloads are "<eng><seq>" so that a restarted engine's batch differs from the old one's.
type in struct {
	op  string
	seq uint64
	eng string // "" = "a"
	at  time.Duration
}

func L(seq uint64) in                 { return in{op: "live", seq: seq} }
func LB(seq uint64) in                { return in{op: "live", seq: seq, eng: "b"} }
func R(seq uint64) in                 { return in{op: "rb", seq: seq} }
func RB(seq uint64) in                { return in{op: "rb", seq: seq, eng: "b"} }
func op(o string) in                  { return in{op: o} }
func at(o string, d time.Duration) in { return in{op: o, at: d} }

// liveRun feeds seqs from..to (inclusive) as live batches.
func liveRun(from, to uint64) []in {
	var out []in
	for s := from; s != to+1; s++ {
		out = append(out, L(s))
	}
	return out
}

func replayRun(from, to uint64, eng string) []in {
	var out []in
	for s := from; s != to+1; s++ {
		out = append(out, in{op: "rb", seq: s, eng: eng})
	}
	return append(out, op("end"))
}

func cat(parts ...[]in) []in {
	var out []in
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

type seqResult struct {
	applied []string // "<eng><seq>"
	replays []uint64
	resets  []string
	drops   map[string]int
	mode    string
}

func runSeq(cfg SeqConfig, ins []in) seqResult { return runSeqWith(cfg, ins, nil) }

// runSeqWith is runSeq calling done with the sequencer at the end (nil: not called).
func runSeqWith(cfg SeqConfig, ins []in, done func(*Sequencer)) seqResult {
	q := NewSequencer(cfg)
	t0 := time.Unix(1_000_000, 0)
	res := seqResult{drops: map[string]int{}}
	for _, i := range ins {
		eng := i.eng
		if eng == "" {
			eng = "a"
		}
		p := []byte(fmt.Sprintf("%s%d", eng, i.seq))
		now := t0.Add(i.at)
		var acts []Action
		switch i.op {
		case "live":
			acts = q.Live(LiveMessage{Seq: i.seq, Payload: p}, now)
		case "rb":
			acts = q.ReplayBatch(i.seq, p, now)
		case "end":
			acts = q.ReplayEnd(now)
		case "fail":
			acts = q.ReplayFailed(now)
		case "hint":
			acts = q.RestartHint(now)
		case "join":
			acts = q.Join()
		case "clear":
			acts = q.Cleared(now)
		case "tick":
			acts = q.Tick(now)
		case "seed":
			acts, _ = q.Seed(i.seq, digest(p), now)
		case "abandon":
			q.Abandon()
		}
		for _, a := range acts {
			switch a.Kind {
			case ActApply:
				res.applied = append(res.applied, string(a.Payload))
			case ActReplay:
				res.replays = append(res.replays, a.Seq)
			case ActReset:
				res.resets = append(res.resets, a.Reason)
			case ActDrop:
				res.drops[a.Reason]++
			case ActOverflow:
				res.drops["overflow"]++
			}
		}
	}
	res.mode, _ = q.Mode()
	if done != nil {
		done(q)
	}
	return res
}

func names(eng string, from, to uint64) []string {
	var out []string
	for s := from; s != to+1; s++ {
		out = append(out, fmt.Sprintf("%s%d", eng, s))
	}
	return out
}

func TestSequencer(t *testing.T) {
	withReplay := SeqConfig{Replay: true, RingSize: 100, MaxPending: 5}
	noReplay := SeqConfig{RingSize: 100, JumpMargin: 10}
	near := ^uint64(0) - 2 // wrap-around: ..., 2^64-3, 2^64-2, 2^64-1, 0, 1
	tests := []struct {
		name    string
		cfg     SeqConfig
		ins     []in
		applied []string
		replays []uint64
		resets  []string
		drops   map[string]int
		mode    string
	}{
		{name: "in order from 0", cfg: withReplay, ins: liveRun(0, 4), applied: names("a", 0, 4)},
		{name: "first seq 1 is a start (llm-d simulator)", cfg: noReplay, ins: liveRun(1, 3), applied: names("a", 1, 3)},
		{name: "first seq 1 with replay: ring from 1 is complete",
			cfg: withReplay, ins: cat([]in{op("join")}, replayRun(1, 3, "a"), liveRun(4, 5)),
			applied: names("a", 1, 5), replays: []uint64{0}},
		{name: "gap filled by replay, live copies dropped",
			cfg: withReplay, ins: cat(liveRun(0, 2), []in{L(6), L(7)}, replayRun(3, 7, "a"), liveRun(8, 8)),
			applied: names("a", 0, 8), replays: []uint64{2}, drops: map[string]int{DropLateDuplicate: 2}},
		{name: "duplicates and reordering after a replay",
			cfg: withReplay, ins: cat(liveRun(0, 1), []in{L(4)}, replayRun(2, 5, "a"), []in{L(5), L(6), L(5), R(6), op("end")}),
			applied: names("a", 0, 6), replays: []uint64{1, 6},
			drops: map[string]int{DropLateDuplicate: 2, DropStale: 1}},
		{name: "replay with a hole: contiguous part applied, rest asked again",
			cfg: withReplay, ins: cat(liveRun(0, 1), []in{L(7), R(2), R(3), R(5), R(6), R(7), op("end")}, replayRun(4, 7, "a")),
			applied: names("a", 0, 7), replays: []uint64{1, 3}, drops: map[string]int{DropLateDuplicate: 1}},
		{name: "holes on every attempt: reset, rebuilt from the ring's start (exact)",
			cfg: withReplay, ins: cat(liveRun(0, 1), []in{L(6), R(2), R(4), op("end"), R(4), op("end"), R(4), op("end")}, replayRun(0, 6, "a")),
			applied: append(names("a", 0, 2), names("a", 0, 6)...), replays: []uint64{1, 2, 2, 0},
			resets: []string{ResetGap}, drops: map[string]int{DropLateDuplicate: 1}},
		{name: "holes on every attempt, ring not reaching back: approximate",
			cfg: withReplay, ins: cat(liveRun(0, 1), []in{L(6), R(2), R(4), op("end"), R(4), op("end"), R(4), op("end")}, replayRun(2, 6, "a")),
			applied: append(names("a", 0, 2), names("a", 2, 6)...), replays: []uint64{1, 2, 2, 0},
			resets: []string{ResetGap}, drops: map[string]int{DropLateDuplicate: 1}, mode: ModeApproximate},
		{name: "ring shorter than the gap: reset, rebuilt from what the ring has, approximate",
			cfg: withReplay, ins: cat(liveRun(0, 1), []in{L(50)}, replayRun(48, 50, "a"), liveRun(51, 51)),
			applied: append(names("a", 0, 1), names("a", 48, 51)...), replays: []uint64{1},
			resets: []string{ResetGap}, drops: map[string]int{DropLateDuplicate: 1}, mode: ModeApproximate},
		{name: "approximate until the settle window passed",
			cfg: withReplay, ins: cat(liveRun(0, 1), []in{L(50)}, replayRun(48, 50, "a"), []in{at("tick", time.Minute), at("tick", 3*time.Minute)}),
			applied: append(names("a", 0, 1), names("a", 48, 50)...), replays: []uint64{1},
			resets: []string{ResetGap}, drops: map[string]int{DropLateDuplicate: 1}, mode: ModeExact},
		{name: "approximate until AllBlocksCleared",
			cfg: withReplay, ins: cat(liveRun(0, 1), []in{L(50)}, replayRun(48, 50, "a"), []in{op("clear")}),
			applied: append(names("a", 0, 1), names("a", 48, 50)...), replays: []uint64{1},
			resets: []string{ResetGap}, drops: map[string]int{DropLateDuplicate: 1}, mode: ModeExact},
		{name: "one bogus seq does not poison the stream (ring refutes it)",
			cfg: withReplay, ins: cat(liveRun(0, 2), []in{L(1_000_000_000_000), op("end"), L(3), op("end"), op("end")}, liveRun(4, 6)),
			applied: names("a", 0, 6), replays: []uint64{2, 2, 2}, drops: map[string]int{DropImplausible: 1}},
		{name: "big jump confirmed by the ring is followed",
			cfg: withReplay, ins: cat(liveRun(0, 2), []in{L(5000)}, replayRun(4990, 5000, "a")),
			applied: append(names("a", 0, 2), names("a", 4990, 5000)...), replays: []uint64{2},
			resets: []string{ResetGap}, drops: map[string]int{DropLateDuplicate: 1}, mode: ModeApproximate},
		{name: "bogus jump without replay dropped when the next batch continues the old stream",
			cfg: noReplay, ins: cat(liveRun(0, 2), []in{L(1_000_000_000_000)}, liveRun(3, 5)),
			applied: names("a", 0, 5), drops: map[string]int{DropImplausible: 1}},
		{name: "big jump without replay followed once confirmed",
			cfg: noReplay, ins: cat(liveRun(0, 2), liveRun(500, 502)),
			applied: append(names("a", 0, 2), names("a", 500, 502)...), resets: []string{ResetGap}, mode: ModeApproximate},
		{name: "plausible gap without replay: reset, approximate",
			cfg: noReplay, ins: cat(liveRun(0, 2), liveRun(6, 7)),
			applied: append(names("a", 0, 2), names("a", 6, 7)...), resets: []string{ResetGap}, mode: ModeApproximate},
		{name: "wrap-around near 2^64 is in order",
			cfg: noReplay, ins: cat([]in{op("tick")}, liveRun(near, near+4)),
			applied: names("a", near, near+4), mode: ModeApproximate},
		{name: "restart after a join replay (no live seq yet) is verified and rebuilt",
			cfg: withReplay, ins: cat([]in{op("join")}, replayRun(0, 20, "a"), []in{LB(0), op("end"), RB(0), op("end")}, []in{LB(1)}),
			applied: append(names("a", 0, 20), names("b", 0, 1)...), replays: []uint64{0, 20, 0},
			resets: []string{ResetRestart}, drops: map[string]int{DropLateDuplicate: 1}},
		{name: "restarted engine ahead of last: different bytes at seq last",
			cfg: withReplay, ins: cat(liveRun(0, 3), []in{LB(2), RB(3), RB(4), op("end")}, replayRun(0, 4, "b")),
			applied: append(names("a", 0, 3), names("b", 0, 4)...), replays: []uint64{3, 0},
			resets: []string{ResetRestart}, drops: map[string]int{DropLateDuplicate: 1}},
		{name: "one step back of the same engine is stale, not a restart",
			cfg: withReplay, ins: cat(liveRun(0, 5), []in{L(3), R(5), op("end")}, liveRun(6, 6)),
			applied: names("a", 0, 6), replays: []uint64{5}, drops: map[string]int{DropStale: 1}},
		{name: "health flap while the stream is intact keeps the index",
			cfg: withReplay, ins: cat(liveRun(0, 5), []in{op("hint"), R(5), op("end")}, liveRun(6, 6)),
			applied: names("a", 0, 6), replays: []uint64{5}},
		{name: "health flap of a restarted, quiet engine resets and rebuilds",
			cfg: withReplay, ins: cat(liveRun(0, 5), []in{op("hint"), op("end")}, replayRun(0, 1, "b"), []in{LB(2)}),
			applied: append(names("a", 0, 5), names("b", 0, 2)...), replays: []uint64{5, 0}, resets: []string{ResetHealth}},
		{name: "without replay a step back needs the next batch",
			cfg: noReplay, ins: cat(liveRun(0, 5), []in{LB(0), LB(1), LB(2)}),
			applied: append(names("a", 0, 5), names("b", 0, 2)...), resets: []string{ResetRestart}},
		{name: "without replay an odd step back is dropped",
			cfg: noReplay, ins: cat(liveRun(0, 5), []in{L(2)}, liveRun(6, 6)),
			applied: names("a", 0, 6), drops: map[string]int{DropUnconfirmed: 1}},
		{name: "without replay a flap plus a step back is a restart",
			cfg: noReplay, ins: cat(liveRun(0, 5), []in{op("hint"), LB(0)}),
			applied: append(names("a", 0, 5), names("b", 0, 0)...), resets: []string{ResetRestart}},
		{name: "replay timeouts: retried, then the buffer goes on without the ring",
			cfg: withReplay, ins: cat(liveRun(0, 1), []in{L(4), op("fail"), op("fail"), op("fail")}, liveRun(5, 5)),
			applied: append(names("a", 0, 1), names("a", 4, 5)...), replays: []uint64{1, 1, 1},
			resets: []string{ResetGap}, mode: ModeApproximate},
		{name: "a number no batch ever had (the ring jumps over it twice) is followed, exact",
			cfg: withReplay, ins: cat(liveRun(0, 3), []in{L(5), R(3), R(5), op("end"), R(3), R(5), op("end")}, liveRun(6, 6)),
			applied: append(names("a", 0, 3), names("a", 5, 6)...), replays: []uint64{3, 3},
			drops: map[string]int{DropSkipped: 1, DropLateDuplicate: 1}},
		{name: "a reply lost once is asked again, not taken for a skipped number",
			cfg: withReplay, ins: cat(liveRun(0, 2), []in{L(5), R(2), R(4), R(5), op("end"), R(2), R(3), R(4), R(5), op("end")}, liveRun(6, 6)),
			applied: names("a", 0, 6), replays: []uint64{2, 2}, drops: map[string]int{DropLateDuplicate: 1}},
		{name: "a fill whose first reply is another engine's batch under the same number: restart",
			cfg: withReplay, ins: cat(liveRun(0, 3), []in{LB(5), RB(3), RB(4), RB(5), op("end")}, replayRun(0, 5, "b"), []in{LB(6)}),
			applied: append(names("a", 0, 3), names("b", 0, 6)...), replays: []uint64{3, 0},
			resets: []string{ResetRestart}, drops: map[string]int{DropLateDuplicate: 1}},
		{name: "pending overflow abandons the replay",
			cfg: withReplay, ins: cat(liveRun(0, 1), liveRun(4, 10)),
			applied: append(names("a", 0, 1), names("a", 4, 10)...), replays: []uint64{1},
			resets: []string{ResetGap}, drops: map[string]int{"overflow": 1}, mode: ModeApproximate},
		{name: "mid-stream join with a ring that reaches back: exact",
			cfg: withReplay, ins: cat([]in{L(5)}, replayRun(0, 5, "a"), liveRun(6, 6)),
			applied: names("a", 0, 6), replays: []uint64{0}, drops: map[string]int{DropLateDuplicate: 1}},
		{name: "probe timeout: the step back waits for a second witness",
			cfg: withReplay, ins: cat(liveRun(0, 5), []in{LB(0), op("fail"), LB(1), LB(2)}),
			applied: append(names("a", 0, 5), names("b", 0, 2)...), replays: []uint64{5}, resets: []string{ResetRestart}},
		{name: "gap across the 2^64 wrap filled by replay",
			cfg: withReplay, ins: cat([]in{op("join")}, replayRun(near-2, near-1, "a"), []in{L(near + 4), R(near), R(near + 1), R(near + 2), R(near + 3), R(near + 4), op("end")}),
			applied: names("a", near-2, near+4), replays: []uint64{0, near - 1}, drops: map[string]int{DropLateDuplicate: 1}, mode: ModeApproximate},
		{name: "live batch older than the join replay is stale, not a restart",
			cfg: withReplay, ins: cat([]in{op("join"), L(3)}, replayRun(5, 8, "a"), liveRun(9, 9)),
			applied: names("a", 5, 9), replays: []uint64{0}, drops: map[string]int{DropStale: 1}, mode: ModeApproximate},
		{name: "mid-stream join with a short ring: approximate",
			cfg: withReplay, ins: cat([]in{L(500)}, replayRun(498, 500, "a")),
			applied: names("a", 498, 500), replays: []uint64{0}, drops: map[string]int{DropLateDuplicate: 1}, mode: ModeApproximate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := runSeq(tc.cfg, tc.ins)
			want := seqResult{applied: tc.applied, replays: tc.replays, resets: tc.resets, drops: tc.drops, mode: tc.mode}
			if want.drops == nil {
				want.drops = map[string]int{}
			}
			if want.mode == "" {
				want.mode = ModeExact
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got\n  applied %s\n  replays %v resets %v drops %v mode %s\nwant\n  applied %s\n  replays %v resets %v drops %v mode %s",
					strings.Join(got.applied, " "), got.replays, got.resets, got.drops, got.mode,
					strings.Join(want.applied, " "), want.replays, want.resets, want.drops, want.mode)
			}
		})
	}
}

func TestBatchDPRank(t *testing.T) {
	enc := func(layout Layout, rank Opt[int64]) []byte {
		p, err := EncodeBatch(&EventBatch{TS: 1, DPRank: rank, Events: []Event{&AllBlocksCleared{}}}, EncodeOptions{Layout: layout})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name    string
		payload []byte
		want    Opt[int64]
		wantErr bool
	}{
		{"map events, rank 3", enc(LayoutMap, Some[int64](3)), Some[int64](3), false},
		{"array events, rank 1", enc(LayoutArray, Some[int64](1)), Some[int64](1), false},
		{"rank nil", enc(LayoutMap, Opt[int64]{}), Opt[int64]{}, false},
		{"map-shaped batch", mp(t, mapv("ts", 1.0, "events", arr(), "data_parallel_rank", 2)), Some[int64](2), false},
		{"2-element batch", mp(t, arr(1.0, arr())), Opt[int64]{}, false},
		{"not a batch", []byte{0xc1}, Opt[int64]{}, true},
		{"truncated", []byte{0x93, 0xcb, 0x41}, Opt[int64]{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := BatchDPRank(tc.payload)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestCollectorTargets(t *testing.T) {
	got, err := CollectorTargets("http://w:8000", 2, "tcp://w:5558", "kv@w:8000@m")
	if err != nil {
		t.Fatal(err)
	}
	want := []SubscriberConfig{
		{Target: kvkey.Target{Worker: "http://w:8000", DPRank: 0}, ReplayEndpoint: "tcp://w:5558", Topic: "kv@w:8000@m"},
		{Target: kvkey.Target{Worker: "http://w:8000", DPRank: 1}, ReplayEndpoint: "tcp://w:5559", Topic: "kv@w:8000@m"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v", got)
	}
	if _, err := CollectorTargets("http://w:8000", 1, "tcp://w:*", "t"); err == nil {
		t.Fatal("ephemeral replay port accepted")
	}
}

// Seeded starts: a state installed from a peer's snapshot after batch S is confirmed by the
// ring holding batch S with the same bytes, then continues from S+1; anything else rejects it
// and the target is rebuilt as on a first join.
func TestSequencerSeed(t *testing.T) {
	withReplay := SeqConfig{Replay: true, RingSize: 100, MaxPending: 5}
	seed := func(seq uint64, eng string) in { return in{op: "seed", seq: seq, eng: eng} }
	tests := []struct {
		name    string
		cfg     SeqConfig
		ins     []in
		applied []string
		replays []uint64
		resets  []string
		drops   map[string]int
		mode    string
		reason  string
	}{
		{name: "confirmed: the ring holds S, the rest follows",
			cfg: withReplay, ins: cat([]in{seed(100, "a")}, replayRun(100, 103, "a"), liveRun(104, 105)),
			applied: names("a", 101, 105), replays: []uint64{100}, reason: ReasonWarmStartVerified},
		{name: "confirmed: ring is exactly S, live continues",
			cfg: withReplay, ins: cat([]in{seed(100, "a")}, replayRun(100, 100, "a"), liveRun(101, 102)),
			applied: names("a", 101, 102), replays: []uint64{100}, reason: ReasonWarmStartVerified},
		{name: "live batches buffered meanwhile: copies of replies dropped, the rest applied",
			cfg:     withReplay,
			ins:     cat([]in{seed(100, "a"), L(102), L(103)}, replayRun(100, 102, "a"), liveRun(104, 104)),
			applied: names("a", 101, 104), replays: []uint64{100}, drops: map[string]int{DropLateDuplicate: 1},
			reason: ReasonWarmStartVerified},
		{name: "a restarted engine: batch S has other bytes, rebuilt from 0",
			cfg:     withReplay,
			ins:     cat([]in{seed(100, "a")}, replayRun(100, 101, "b"), replayRun(0, 101, "b")),
			applied: names("b", 0, 101), replays: []uint64{100, 0}, resets: []string{ResetWarmStart},
			reason: "rebuilt_from_engine_start"},
		{name: "the ring moved past S: rejected, what it holds is all there is",
			cfg:     withReplay,
			ins:     cat([]in{seed(100, "a")}, replayRun(150, 160, "a"), replayRun(150, 160, "a")),
			applied: names("a", 150, 160), replays: []uint64{100, 0}, resets: []string{ResetWarmStart},
			mode: ModeApproximate, reason: "ring_does_not_reach_back"},
		{name: "the ring starts right after S: cannot confirm, rejected",
			cfg:     withReplay,
			ins:     cat([]in{seed(100, "a")}, replayRun(101, 102, "a"), replayRun(101, 102, "a")),
			applied: names("a", 101, 102), replays: []uint64{100, 0}, resets: []string{ResetWarmStart},
			mode: ModeApproximate, reason: "ring_does_not_reach_back"},
		{name: "an empty ring: rejected",
			cfg:     withReplay,
			ins:     cat([]in{seed(100, "a"), op("end")}, replayRun(0, 2, "a")),
			applied: names("a", 0, 2), replays: []uint64{100, 0}, resets: []string{ResetWarmStart},
			reason: "rebuilt_from_engine_start"},
		{name: "a lost reply is asked for again from S",
			cfg:     withReplay,
			ins:     cat([]in{seed(100, "a"), op("fail")}, replayRun(100, 101, "a")),
			applied: names("a", 101, 101), replays: []uint64{100, 100}, reason: ReasonWarmStartVerified},
		{name: "the ring never answers: rejected, live batches judged alone",
			cfg:     withReplay,
			ins:     []in{seed(100, "a"), L(105), op("fail"), op("fail"), op("fail"), L(106)},
			applied: names("a", 105, 106), replays: []uint64{100, 100, 100}, resets: []string{ResetWarmStart},
			mode: ModeApproximate, reason: "batches_lost"},
		{name: "abandoned after a lossy reset, then seeded: continues from the seed",
			cfg:     withReplay,
			ins:     cat(liveRun(0, 2), []in{L(10), R(8), op("abandon"), seed(10, "a")}, replayRun(10, 10, "a"), liveRun(11, 11)),
			applied: []string{"a0", "a1", "a2", "a8", "a11"}, replays: []uint64{2, 10}, resets: []string{ResetGap},
			drops: map[string]int{DropLateDuplicate: 1}, reason: ReasonWarmStartVerified},
		{name: "abandoned after a lossy reset, then joined: rebuilt from what the ring holds",
			cfg:     withReplay,
			ins:     cat(liveRun(0, 2), []in{L(10), R(8), op("abandon"), op("join")}, replayRun(8, 10, "a")),
			applied: []string{"a0", "a1", "a2", "a8", "a8", "a9", "a10"}, replays: []uint64{2, 0}, resets: []string{ResetGap},
			drops: map[string]int{DropLateDuplicate: 1}, mode: ModeApproximate, reason: "ring_does_not_reach_back"},
		{name: "not taken once a batch was applied",
			cfg: withReplay, ins: cat(liveRun(0, 1), []in{seed(100, "a")}, liveRun(2, 2)),
			applied: names("a", 0, 2)},
		{name: "not taken without a replay socket",
			cfg: SeqConfig{RingSize: 100}, ins: cat([]in{seed(100, "a")}, liveRun(0, 1)),
			applied: names("a", 0, 1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := runSeq(tc.cfg, tc.ins)
			want := seqResult{applied: tc.applied, replays: tc.replays, resets: tc.resets, drops: tc.drops, mode: tc.mode}
			if want.drops == nil {
				want.drops = map[string]int{}
			}
			if want.mode == "" {
				want.mode = ModeExact
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got\n  applied %s\n  replays %v resets %v drops %v mode %s\nwant\n  applied %s\n  replays %v resets %v drops %v mode %s",
					strings.Join(got.applied, " "), got.replays, got.resets, got.drops, got.mode,
					strings.Join(want.applied, " "), want.replays, want.resets, want.drops, want.mode)
			}
			if r := seqReason(tc.cfg, tc.ins); tc.reason != "" && r != tc.reason {
				t.Fatalf("mode reason %q, want %q", r, tc.reason)
			}
		})
	}
}

// seqReason runs ins and returns the final mode reason.
func seqReason(cfg SeqConfig, ins []in) string {
	var reason string
	runSeqWith(cfg, ins, func(q *Sequencer) { _, reason = q.Mode() })
	return reason
}
