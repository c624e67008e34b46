package indexers

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/kvkey"
)

func seqTokens(n int, base uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = base + uint32(i)
	}
	return t
}

func exts(vs ...uint64) []WireHash {
	out := make([]WireHash, len(vs))
	for i, v := range vs {
		out[i] = IntHash(v)
	}
	return out
}

func apply(t *testing.T, ix *Index, tg kvkey.Target, evs ...Event) {
	t.Helper()
	if err := ix.Apply(tg, &EventBatch{Events: evs}); err != nil {
		t.Fatal(err)
	}
}

// raw returns block hashes as bare uint64s, as the reference model keys them.
func raw(q []kvkey.BlockHash) []uint64 {
	out := make([]uint64, len(q))
	for i, h := range q {
		out[i] = uint64(h)
	}
	return out
}

// typed returns bare uint64 hashes as the block hashes Match takes.
func typed(q []uint64) []kvkey.BlockHash {
	out := make([]kvkey.BlockHash, len(q))
	for i, h := range q {
		out[i] = kvkey.BlockHash(h)
	}
	return out
}

func overlapOf(ix *Index, tg kvkey.Target, q []kvkey.BlockHash) Overlap {
	for _, o := range ix.Match(q) {
		if o.Target == tg {
			return o
		}
	}
	return Overlap{Target: tg}
}

// Event-side hashes must equal request-side kvkey.BlockHashes for the same request options
// (docs/ARCHITECTURE.md, "Block hashes"): LoRA via the seed (its name also leads extra_keys,
// vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys), cache_salt as an
// extra key of block 0, multimodal identifiers as extra keys of the blocks they cover.
func TestEventHashesMeetRequestHashes(t *testing.T) {
	toks := seqTokens(4*16, 100)
	salt := strings.Repeat("ab", 32) // 64 hex digits
	tests := []struct {
		name  string
		opt   kvkey.HashOptions
		lora  Opt[string]
		extra [][]any
	}{
		{"plain text", kvkey.HashOptions{}, Opt[string]{}, [][]any{nil, nil, nil, nil}},
		{"no extra_keys field", kvkey.HashOptions{}, Opt[string]{}, nil},
		{"cache salt", kvkey.HashOptions{CacheSalt: "tenant-a"}, Opt[string]{}, [][]any{{"tenant-a"}, nil, nil, nil}},
		{"hex salt", kvkey.HashOptions{CacheSalt: salt}, Opt[string]{}, [][]any{{salt}, nil, nil, nil}},
		{"lora + salt", kvkey.HashOptions{LoRAName: "sql-lora", CacheSalt: "tenant-a"}, Some("sql-lora"),
			[][]any{{"sql-lora", "tenant-a"}, {"sql-lora"}, {"sql-lora"}, {"sql-lora"}}},
		{"multimodal (id, offset) on blocks 1-2", kvkey.HashOptions{ExtraKeys: map[int][]uint64{
			1: {kvkey.ExtraKeyHash("mm-hash-abc")}, 2: {kvkey.ExtraKeyHash("mm-hash-abc")}}}, Opt[string]{},
			[][]any{nil, {[]any{"mm-hash-abc", int64(5)}}, {[]any{"mm-hash-abc", int64(-11)}}, nil}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := NewIndex(Options{BlockSize: 16})
			tg := kvkey.Target{Worker: "w"}
			apply(t, ix, tg, &BlockStored{BlockHashes: exts(11, 12), TokenIDs: toks[:32], BlockSize: 16,
				LoRAName: tc.lora, ExtraKeys: sliceOrNil(tc.extra, 0, 2), Medium: Some(MediumGPU)})
			apply(t, ix, tg, &BlockStored{BlockHashes: exts(13, 14), ParentBlockHash: Some(IntHash(12)),
				TokenIDs: toks[32:], BlockSize: 16, LoRAName: tc.lora, ExtraKeys: sliceOrNil(tc.extra, 2, 4),
				Medium: Some(MediumGPU)})
			want := kvkey.BlockHashes(toks, 16, tc.opt)
			if got := overlapOf(ix, tg, want); got.G1 != 4 {
				t.Fatalf("request-side hashes matched %d of 4 blocks", got.G1)
			}
			other := kvkey.BlockHashes(toks, 16, kvkey.HashOptions{CacheSalt: "someone-else"})
			if got := overlapOf(ix, tg, other); got.G1 != 0 {
				t.Fatalf("a differently salted request matched %d blocks", got.G1)
			}
		})
	}
}

func sliceOrNil(x [][]any, a, b int) [][]any {
	if x == nil {
		return nil
	}
	return x[a:b]
}

// recChanges records the change sets of the index calls it makes, one line per change (runs
// only as attrRun).
type recChanges struct {
	log  []string
	runs []attrRun
	cs   ChangeSet
}

// attrRun is one ChangeStoredRun.
type attrRun struct {
	hashes    []kvkey.BlockHash
	parent    kvkey.BlockHash
	hasParent bool
	session   string
}

func (r *recChanges) IndexChanged(cs *ChangeSet) {
	for _, c := range cs.Changes {
		switch c.Kind {
		case ChangeStored:
			r.log = append(r.log, "stored "+c.Tier.String()+" "+itoa(len(c.Hashes)))
		case ChangeRemoved:
			r.log = append(r.log, "removed "+c.Tier.String()+" "+itoa(len(c.Hashes)))
		case ChangeCleared:
			r.log = append(r.log, map[bool]string{true: "reset", false: "cleared G1"}[c.AllTiers])
		case ChangeStoredRun:
			r.runs = append(r.runs, attrRun{append([]kvkey.BlockHash(nil), c.Hashes...), c.Parent, c.HasParent, c.SessionID})
		}
	}
}

// apply applies evs through ApplyTo and records the change set.
func (r *recChanges) apply(t *testing.T, ix *Index, tg kvkey.Target, evs ...Event) {
	t.Helper()
	if err := ix.ApplyTo(tg, &EventBatch{Events: evs}, &r.cs); err != nil {
		t.Fatal(err)
	}
	r.IndexChanged(&r.cs)
}

// reset resets tg through ResetTo and records the change set.
func (r *recChanges) reset(ix *Index, tg kvkey.Target) {
	ix.ResetTo(tg, &r.cs)
	r.IndexChanged(&r.cs)
}

func itoa(n int) string { return string(rune('0' + n)) }

func TestTiersAndLifecycle(t *testing.T) {
	rec := &recChanges{}
	ix := NewIndex(Options{BlockSize: 4})
	a, b := kvkey.Target{Worker: "a"}, kvkey.Target{Worker: "b", DPRank: 1}
	toks := seqTokens(16, 1)
	q := kvkey.BlockHashes(toks, 4, kvkey.HashOptions{})
	gpu := func(tg kvkey.Target, hs ...uint64) Event {
		return &BlockStored{BlockHashes: exts(hs...), TokenIDs: toks[:4*len(hs)], BlockSize: 4, Medium: Some(MediumGPU)}
	}
	// a: blocks 0-3 on GPU; b: the same prefix with its own opaque hashes.
	rec.apply(t, ix, a, gpu(a, 1, 2, 3, 4))
	rec.apply(t, ix, b, gpu(b, 91, 92))
	// a offloads blocks 2,3 to CPU (token-less placeholders resolved through the GPU stores)
	// and then evicts them from GPU; block 3 also goes to disk.
	rec.apply(t, ix, a, &BlockStored{BlockHashes: exts(3, 4), TokenIDs: []uint32{}, Medium: Some(MediumCPU)},
		&BlockRemoved{BlockHashes: exts(4), Medium: Some(MediumGPU)},
		&BlockRemoved{BlockHashes: exts(3), Medium: Some(MediumGPU)},
		&BlockStored{BlockHashes: exts(4), TokenIDs: []uint32{}, Medium: Some(MediumDisk)},
		&BlockRemoved{BlockHashes: exts(4), Medium: Some(MediumCPU)})
	if o := overlapOf(ix, a, q); o.G1 != 2 || o.G2 != 1 || o.G3 != 1 {
		t.Fatalf("a: %+v, want G1 2, G2 1, G3 1", o)
	}
	if o := overlapOf(ix, b, q); o.G1 != 2 || o.G2 != 0 {
		t.Fatalf("b: %+v", o)
	}
	// Unknown media and remote locality are dropped (fail closed).
	rec.apply(t, ix, b, &BlockStored{BlockHashes: exts(93), ParentBlockHash: Some(IntHash(92)), TokenIDs: toks[8:12],
		BlockSize: 4, Medium: Some("OBJ")})
	rec.apply(t, ix, b, &BlockStored{BlockHashes: exts(93), ParentBlockHash: Some(IntHash(92)), TokenIDs: toks[8:12],
		BlockSize: 4, Medium: Some(MediumDisk), Locality: Some("REMOTE")})
	// Duplicate store of the same hash: one removal keeps it resident.
	rec.apply(t, ix, b, gpu(b, 91))
	rec.apply(t, ix, b, &BlockRemoved{BlockHashes: exts(91), Medium: Some(MediumGPU)})
	if !ix.IsResidentG1(b, q[0]) {
		t.Fatal("ref-counted block dropped after one of two removals")
	}
	// A store whose parent was never seen is dropped and counted.
	rec.apply(t, ix, b, &BlockStored{BlockHashes: exts(99), ParentBlockHash: Some(IntHash(4242)), TokenIDs: toks[:4],
		BlockSize: 4, Medium: Some(MediumGPU)})
	// Sliding-window group stores are ignored, and so are that group's removals.
	rec.apply(t, ix, b, &BlockStored{BlockHashes: exts(91), TokenIDs: toks[:4], BlockSize: 4, Medium: Some(MediumGPU),
		GroupIdx: Some[int64](1), KVCacheSpecKind: Some("sliding_window")})
	rec.apply(t, ix, b, &BlockRemoved{BlockHashes: exts(91), Medium: Some(MediumGPU), GroupIdx: Some[int64](1)})
	if !ix.IsResidentG1(b, q[0]) {
		t.Fatal("a sliding-window removal evicted an attention block")
	}
	tsB := ix.reg.Load().byTarget[b]
	for reason, want := range map[int]int64{dropMedium: 1, dropRemote: 1, dropParentNotFound: 1, dropKind: 2} {
		if got := tsB.stats.drops[reason].Load(); got != want {
			t.Errorf("drops[%s] = %d, want %d", dropNames[reason], got, want)
		}
	}
	// AllBlocksCleared drops a's GPU tier only; b is untouched.
	v := ix.ResidencyVersion(a)
	rec.apply(t, ix, a, &AllBlocksCleared{})
	if o := overlapOf(ix, a, q); o.G1 != 0 || o.G2 != 0 || o.G3 != 0 {
		// block 0 left GPU, so nothing leads from block 0 any more
		t.Fatalf("a after clear: %+v", o)
	}
	if !ix.IsResidentG1(b, q[1]) || ix.ResidencyVersion(a) <= v {
		t.Fatal("clear leaked to b or did not bump a's version")
	}
	tsA := ix.reg.Load().byTarget[a]
	if tsA.resident[G2].Load() != 1 || tsA.resident[G3].Load() != 1 || tsA.resident[G1].Load() != 0 {
		t.Fatalf("a resident per tier after clear: %d %d %d", tsA.resident[G1].Load(), tsA.resident[G2].Load(), tsA.resident[G3].Load())
	}
	rec.reset(ix, a)
	if tsA.blocks() != 0 || len(tsA.ext) != 0 {
		t.Fatal("reset left state behind")
	}
	// Removing b frees its slot; a new target reusing the slot starts empty.
	ix.RemoveTargetTo(b, &rec.cs)
	rec.IndexChanged(&rec.cs)
	c := kvkey.Target{Worker: "c"}
	if err := ix.AddTarget(c); err != nil {
		t.Fatal(err)
	}
	if got := ix.Match(q); len(got) != 0 || ix.IsResidentG1(c, q[0]) || ix.IsResidentG1(b, q[0]) {
		t.Fatalf("stale residency after RemoveTarget: %+v", got)
	}
	want := []string{"stored G1 4", "stored G1 2", "stored G2 2", "removed G1 1", "removed G1 1", "stored G3 1",
		"removed G2 1", "cleared G1", "reset", "reset"}
	if !slices.Equal(rec.log, want) {
		t.Fatalf("change sets held %q\nwant %q", rec.log, want)
	}
}

func TestMetricsAndSnapshot(t *testing.T) {
	ix := NewIndex(Options{BlockSize: 4})
	m, err := NewSubscribers(ix, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tg := kvkey.Target{Worker: "http://w:8000", DPRank: 0}
	apply(t, ix, tg, &BlockStored{BlockHashes: exts(1, 2), TokenIDs: seqTokens(8, 1), BlockSize: 4, Medium: Some(MediumGPU)},
		&BlockStored{BlockHashes: exts(7), TokenIDs: []uint32{}, Medium: Some("NVME_REMOTE")})
	reg := prometheus.NewPedanticRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_kv_index_resident_blocks" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == "tier" {
					got[lp.GetValue()] = mt.GetGauge().GetValue()
				}
			}
		}
	}
	if got["G1"] != 2 || got["G2"] != 0 || len(got) != 3 {
		t.Fatalf("resident gauge %v", got)
	}
	snap := m.Snapshot()
	if len(snap) != 1 || snap[0].IndexBlocks != 2 || snap[0].DroppedBlocks["unknown_medium"] != 1 || snap[0].State != "unsubscribed" {
		t.Fatalf("snapshot %+v", snap)
	}
}

// TestOffsetEndpoint pins vLLM's offset_endpoint_port (vllm/distributed/kv_events.py): base+rank,
// port 0 unchanged on every rank (vLLM #55844), and libzmq's wildcard port taken like port 0 (vLLM
// accepts it on rank 0 only; see OffsetEndpoint).
func TestOffsetEndpoint(t *testing.T) {
	tests := []struct {
		ep   string
		rank int
		want string
		err  bool
	}{
		{"tcp://*:5557", 0, "tcp://*:5557", false},
		{"tcp://*:5557", 1, "tcp://*:5558", false},
		{"tcp://10.0.0.1:5558", 3, "tcp://10.0.0.1:5561", false},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558", false},
		{"tcp://*:0", 2, "tcp://*:0", false},
		{"tcp://127.0.0.1:*", 0, "tcp://127.0.0.1:*", false},
		{"tcp://127.0.0.1:*", 1, "tcp://127.0.0.1:*", false},
		{"tcp://*:*", 3, "tcp://*:*", false},
		{"tcp://*:65535", 1, "", true},
		{"tcp://host", 1, "", true},
		{"tcp://host:x", 1, "", true},
		{"inproc://kv", 1, "inproc://kv_dp1", false},
		{"ipc:///tmp/kv", 0, "ipc:///tmp/kv", false},
		{"ipc:///tmp/kv", 1, "", true},
	}
	for _, tc := range tests {
		got, err := OffsetEndpoint(tc.ep, tc.rank)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("OffsetEndpoint(%q, %d) = %q, %v", tc.ep, tc.rank, got, err)
		}
	}
	if got := ConnectEndpoint("tcp://*:5557", "10.1.2.3"); got != "tcp://10.1.2.3:5557" {
		t.Errorf("ConnectEndpoint = %q", got)
	}
}

// TestTargetConfigs: one subscription per rank with vLLM's offsets on both endpoints; ports the
// worker picks at bind time cannot be connected to and are refused up front.
func TestTargetConfigs(t *testing.T) {
	got, err := TargetConfigs("http://w", 2, "tcp://w:5557", "tcp://w:5560", "kv")
	if err != nil {
		t.Fatal(err)
	}
	want := []SubscriberConfig{
		{Target: kvkey.Target{Worker: "http://w", DPRank: 0}, Endpoint: "tcp://w:5557", ReplayEndpoint: "tcp://w:5560", Topic: "kv"},
		{Target: kvkey.Target{Worker: "http://w", DPRank: 1}, Endpoint: "tcp://w:5558", ReplayEndpoint: "tcp://w:5561", Topic: "kv"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("TargetConfigs = %+v", got)
	}
	for _, eps := range [][2]string{{"tcp://w:*", ""}, {"tcp://w:5557", "tcp://w:0"}, {"tcp://w:0", ""}} {
		if _, err := TargetConfigs("http://w", 1, eps[0], eps[1], ""); !errors.Is(err, ErrEphemeralPort) {
			t.Errorf("TargetConfigs(%q, %q): %v, want ErrEphemeralPort", eps[0], eps[1], err)
		}
	}
}

// TestPlaceholderAfterEviction: vLLM's CPU offload announces a host copy with a token-less
// BlockStored (vLLM's offloading connector) that may arrive after the GPU copy's BlockRemoved. Once
// a worker has shown a lower tier, the index remembers its recently removed hashes (bounded), so
// such stores still resolve, in chain position; beyond the bound, after a reset, or before the
// worker's first lower-tier store, they are dropped as unresolved_hash.
func TestPlaceholderAfterEviction(t *testing.T) {
	toks := seqTokens(4*16, 500)
	q := kvkey.BlockHashes(toks, 16, kvkey.HashOptions{})
	cpu := func(hs ...uint64) *BlockStored {
		return &BlockStored{BlockHashes: exts(hs...), TokenIDs: []uint32{}, Medium: Some(MediumCPU)}
	}
	gpuRemoved := func(hs ...uint64) *BlockRemoved {
		return &BlockRemoved{BlockHashes: exts(hs...), Medium: Some(MediumGPU)}
	}
	tests := []struct {
		name       string
		remember   int
		evs        []Event
		want       Overlap
		unresolved int64
	}{
		{"tail evicted, then offloaded", 0, []Event{gpuRemoved(4), cpu(4)}, Overlap{G1: 3, G2: 1}, 0},
		{"whole chain evicted, then offloaded", 0, []Event{gpuRemoved(4, 3, 2, 1), cpu(1, 2, 3, 4)}, Overlap{G2: 4}, 0},
		{"middle evicted, then offloaded", 0, []Event{gpuRemoved(2), cpu(2)}, Overlap{G1: 1, G2: 3}, 0},
		{"cleared, then offloaded", 0, []Event{&AllBlocksCleared{}, cpu(1, 2)}, Overlap{G2: 2}, 0},
		{"bound of 2: the oldest removal is forgotten", 2, []Event{gpuRemoved(4, 3, 2), cpu(2, 3, 4)}, Overlap{G1: 1, G2: 2}, 1},
		{"disabled", -1, []Event{gpuRemoved(4), cpu(4)}, Overlap{G1: 3}, 1},
		{"reset forgets", 0, []Event{gpuRemoved(4), nil, cpu(4)}, Overlap{}, 1},
		{"no lower tier seen yet", 0, []Event{gpuRemoved(4), cpu(4), gpuRemoved(3), cpu(3)}, Overlap{G1: 2, G2: 1}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := NewIndex(Options{BlockSize: 16, RecentlyRemoved: tc.remember})
			tg := kvkey.Target{Worker: "w"}
			apply(t, ix, tg, &BlockStored{BlockHashes: exts(1, 2, 3, 4), TokenIDs: toks, BlockSize: 16, Medium: Some(MediumGPU)})
			if tc.name != "no lower tier seen yet" {
				// The worker offloads: an unrelated block on disk shows it.
				apply(t, ix, tg, &BlockStored{BlockHashes: exts(99), TokenIDs: seqTokens(16, 9000), BlockSize: 16, Medium: Some(MediumDisk)})
			}
			for _, ev := range tc.evs {
				if ev == nil {
					ix.Reset(tg)
					continue
				}
				apply(t, ix, tg, ev)
			}
			got := overlapOf(ix, tg, q)
			got.Target = kvkey.Target{}
			if got != tc.want {
				t.Fatalf("overlap %+v, want %+v", got, tc.want)
			}
			ts := ix.reg.Load().byTarget[tg]
			if n := ts.stats.drops[dropUnresolved].Load(); n != tc.unresolved {
				t.Fatalf("unresolved_hash drops %d, want %d", n, tc.unresolved)
			}
			// Resolved blocks sit in their chain: the orphan count (which lets Match bisect)
			// matches a scan of the query.
			ts.mu.Lock()
			defer ts.mu.Unlock()
			for k := range numTiers {
				want := int64(0)
				for i := 1; i < len(q); i++ {
					if ix.lookup(q[i]).in[k].has(ts.slot) && !ix.lookup(q[i-1]).in[k].has(ts.slot) {
						want++
					}
				}
				if got := ts.orphans[k].Load(); got != want {
					t.Fatalf("set %d: %d orphans, a scan finds %d", k, got, want)
				}
			}
		})
	}
}

// Every token-carrying store reaches the change set as its whole run in our chained hashes,
// with our parent hash and the worker's session_id — also when the blocks were already
// resident (a second session storing the same prefix still advances its own frontier).
func TestStoredRuns(t *testing.T) {
	rec := &recChanges{}
	ix := NewIndex(Options{BlockSize: 4})
	a := kvkey.Target{Worker: "a"}
	toks := seqTokens(16, 1)
	q := kvkey.BlockHashes(toks, 4, kvkey.HashOptions{})
	rec.apply(t, ix, a,
		&BlockStored{BlockHashes: exts(1, 2), TokenIDs: toks[:8], BlockSize: 4, Medium: Some(MediumGPU), SessionID: Some("root")},
		&BlockStored{BlockHashes: exts(3, 4), ParentBlockHash: Some(IntHash(2)), TokenIDs: toks[8:16], BlockSize: 4,
			Medium: Some(MediumGPU), SessionID: Some("kid")},
		&BlockStored{BlockHashes: exts(1), TokenIDs: toks[:4], BlockSize: 4, Medium: Some(MediumGPU)})
	want := []attrRun{
		{q[:2], 0, false, "root"},
		{q[2:4], q[1], true, "kid"},
		{q[:1], 0, false, ""},
	}
	if len(rec.runs) != len(want) {
		t.Fatalf("got %d runs, want %d", len(rec.runs), len(want))
	}
	for i, w := range want {
		g := rec.runs[i]
		if !slices.Equal(g.hashes, w.hashes) || g.parent != w.parent || g.hasParent != w.hasParent || g.session != w.session {
			t.Errorf("run %d = %+v, want %+v", i, g, w)
		}
	}
}
