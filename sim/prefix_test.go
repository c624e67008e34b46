package sim

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/tokenize"
)

// syncEngine builds an engine that tests step by hand (no goroutine, no sleeping).
func syncEngine(t *testing.T, o Options) *engineCore {
	t.Helper()
	o.OutputLen = -1
	o, err := o.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	w := &Worker{opts: o, filler: newFiller(wordTokenizer{}), rankLabels: []string{"0"}}
	e := newEngineCore(w, 0)
	w.engines = []*engineCore{e}
	w.metrics = newSimMetrics(w)
	return e
}

// runSync submits one request and steps the engine until it finishes; it returns the request
// and the events of every step, rendered as strings.
func runSync(t *testing.T, e *engineCore, tokens []uint32, maxTokens int, salt, lora string) (*simRequest, []kvEvent) {
	t.Helper()
	r := newSimRequest(fmt.Sprint(len(tokens)))
	r.seq = seqState{tokens: slices.Clone(tokens), salt: salt, loraName: lora}
	if lora != "" {
		r.seq.loraID = 1
	}
	r.promptLen, r.maxTokens = len(tokens), maxTokens
	e.admit(r)
	var events []kvEvent
	for range 1000 {
		st := e.schedule()
		if len(st.reqs) == 0 {
			break
		}
		e.update(st, stepDuration(e.o, st, e.kv.pool.usage()))
		events = append(events, e.kv.takeEvents()...)
	}
	if _, finished, _, _ := r.snapshot(); !finished {
		t.Fatal("request did not finish")
	}
	return r, events
}

func seqTokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// bare returns kvgate's block hashes as the bare uint64s the simulator publishes as its own.
func bare(hs []kvkey.BlockHash) []uint64 {
	out := make([]uint64, len(hs))
	for i, h := range hs {
		out[i] = uint64(h)
	}
	return out
}

// names maps hashes to readable labels for event assertions.
type names map[uint64]string

func (n names) add(tokens []uint32, bs int, opt tokenize.HashOptions, prefix string) {
	for i, h := range tokenize.BlockHashes(tokens, bs, opt) {
		if _, ok := n[uint64(h)]; !ok {
			n[uint64(h)] = fmt.Sprintf("%s%d", prefix, i)
		}
	}
}

// render turns events into readable lines, naming hashes by n.
func (n names) render(evs []kvEvent) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, n.renderEvent(ev))
	}
	return out
}

func (n names) renderEvent(ev kvEvent) string {
	label := func(h uint64) string {
		if s, ok := n[h]; ok {
			return s
		}
		return fmt.Sprintf("%#x", h)
	}
	var hs []string
	for _, h := range ev.hashes {
		hs = append(hs, label(h))
	}
	switch ev.kind {
	case evStored:
		parent := "-"
		if ev.hasParent {
			parent = label(ev.parent)
		}
		return fmt.Sprintf("%s stored [%s] parent %s tokens %v", ev.medium, strings.Join(hs, " "), parent, ev.tokens)
	case evRemoved:
		return fmt.Sprintf("%s removed [%s]", ev.medium, strings.Join(hs, " "))
	}
	return "cleared"
}

// TestPrefixCacheModel drives a 6-block pool (block size 4) through requests with known overlaps
// and checks cached_tokens and the exact event stream: lazy eviction in LRU order (tail blocks of a
// freed request first), the last prompt token never hit, a full-prompt hit storing the same hash
// twice, and both copies removed (vllm/v1/core/block_pool.py: the prefix cache does not
// deduplicate).
func TestPrefixCacheModel(t *testing.T) {
	const bs = 4
	e := syncEngine(t, Options{BlockSize: bs, NumGPUBlocks: 7, TTFT: time.Millisecond, ITL: time.Millisecond})
	a := seqTokens(1, 10)
	d := seqTokens(1, 8)
	c := seqTokens(100, 20)
	b := append(seqTokens(1, 8), seqTokens(20, 6)...)
	hashNames := names{}
	hashNames.add(a, bs, tokenize.HashOptions{}, "a")
	hashNames.add(c, bs, tokenize.HashOptions{}, "c")
	hashNames.add(b, bs, tokenize.HashOptions{}, "b")

	steps := []struct {
		name      string
		tokens    []uint32
		maxTokens int
		cached    int
		events    []string
	}{
		{"A cold", a, 2, 0, []string{"GPU stored [a0 a1] parent - tokens [1 2 3 4 5 6 7 8]"}},
		// D = A's first two blocks exactly: only block 0 may hit, block 1 is recomputed into a
		// new physical block and stored again under the same hash.
		{"D full-prompt hit", d, 1, 4, []string{"GPU stored [a1] parent a0 tokens [5 6 7 8]"}},
		// C needs 5 of the 6 free blocks: the free queue evicts D's and A's tail copies of a1
		// (both copies, one BlockRemoved each) but keeps a0, freed last.
		{"C evicts", c, 1, 0, []string{"GPU removed [a1]", "GPU removed [a1]",
			"GPU stored [c0 c1 c2 c3 c4] parent - tokens [100 101 102 103 104 105 106 107 108 109 110 111 112 113 114 115 116 117 118 119]"}},
		// B shares a0 (still cached) but not a1 (evicted); its new blocks reuse C's blocks
		// tail first.
		{"B partial hit", b, 1, 4, []string{"GPU removed [c4]", "GPU removed [c3]", "GPU removed [c2]",
			"GPU stored [a1 b2] parent a0 tokens [5 6 7 8 20 21 22 23]"}},
	}
	for _, st := range steps {
		r, evs := runSync(t, e, st.tokens, st.maxTokens, "", "")
		events := hashNames.render(evs)
		if r.cached != st.cached {
			t.Errorf("%s: cached_tokens = %d, want %d", st.name, r.cached, st.cached)
		}
		if !slices.Equal(events, st.events) {
			t.Errorf("%s: events\n got %q\nwant %q", st.name, events, st.events)
		}
	}
	if got := e.kv.pool.numFree(); got != 6 {
		t.Errorf("free blocks after all requests = %d, want 6", got)
	}
}

// TestDecodeBlocksAnnounced checks that blocks filled by generated tokens are announced one at
// a time with the prompt tail and output tokens, and the partial tail never is.
func TestDecodeBlocksAnnounced(t *testing.T) {
	const bs = 4
	e := syncEngine(t, Options{BlockSize: bs, NumGPUBlocks: 16, TTFT: time.Millisecond, ITL: time.Millisecond})
	prompt := seqTokens(1, 6)
	r, evs := runSync(t, e, prompt, 7, "", "")
	all := r.seq.tokens
	hashNames := names{}
	hashNames.add(all, bs, tokenize.HashOptions{}, "x")
	events := hashNames.render(evs)
	// 6 prompt + 7 output = 13 tokens; the 13th token is sampled but never computed, so
	// blocks 0..2 (12 tokens) are announced: block 0 at prefill, blocks 1 and 2 in decode.
	want := []string{
		fmt.Sprintf("GPU stored [x0] parent - tokens %v", all[0:4]),
		fmt.Sprintf("GPU stored [x1] parent x0 tokens %v", all[4:8]),
		fmt.Sprintf("GPU stored [x2] parent x1 tokens %v", all[8:12]),
	}
	got := events
	if !slices.Equal(got, want) {
		t.Errorf("events\n got %q\nwant %q", got, want)
	}
	if len(all) != 13 {
		t.Errorf("sequence has %d tokens, want 13", len(all))
	}
}

// TestSaltAndLoRASeparateCaches: the same tokens under another cache_salt or LoRA adapter never
// hit, and their events carry the extra keys (vllm/v1/core/kv_cache_utils.py,
// generate_block_hash_extra_keys).
func TestSaltAndLoRASeparateCaches(t *testing.T) {
	const bs = 4
	e := syncEngine(t, Options{BlockSize: bs, NumGPUBlocks: 64, TTFT: time.Millisecond, ITL: time.Millisecond})
	p := seqTokens(1, 9)
	tests := []struct {
		name, salt, lora string
		cached           int
		extra0           []string
	}{
		{"plain cold", "", "", 0, nil},
		{"plain warm", "", "", 8, nil},
		{"salted cold", "tenant-a", "", 0, []string{"tenant-a"}},
		{"salted warm", "tenant-a", "", 8, nil},
		{"other salt", "tenant-b", "", 0, []string{"tenant-b"}},
		{"lora cold", "", "sql-lora", 0, []string{"sql-lora"}},
		{"lora+salt cold", "tenant-a", "sql-lora", 0, []string{"sql-lora", "tenant-a"}},
		{"lora warm", "", "sql-lora", 8, nil},
	}
	for _, tc := range tests {
		r, _ := runSync(t, e, p, 1, tc.salt, tc.lora)
		if r.cached != tc.cached {
			t.Errorf("%s: cached = %d, want %d", tc.name, r.cached, tc.cached)
		}
		want := bare(tokenize.BlockHashes(p, bs, tokenize.HashOptions{CacheSalt: tc.salt, LoRAName: tc.lora}))
		if !slices.Equal(r.seq.hashes[:2], want) {
			t.Errorf("%s: hashes %x, want %x", tc.name, r.seq.hashes[:2], want)
		}
		if tc.cached == 0 {
			if got := r.seq.extraKeys(0); !slices.Equal(got, tc.extra0) {
				t.Errorf("%s: block 0 extra keys %q, want %q", tc.name, got, tc.extra0)
			}
		}
	}
}

// TestHostTier: every computed block is also written to the host LRU (CPU events after the
// GPU events of the step, like vLLM's offloading connector); blocks the GPU later evicts are
// loaded back from the host on a hit (counted as cached, charged the load cost, re-announced on
// the GPU), and the host LRU evicts its oldest blocks when full.
func TestHostTier(t *testing.T) {
	const bs = 4
	for _, full := range []bool{false, true} {
		t.Run(fmt.Sprintf("full=%v", full), func(t *testing.T) {
			e := syncEngine(t, Options{BlockSize: bs, NumGPUBlocks: 4, NumCPUBlocks: 4, CPUEventsFull: full,
				TTFT: time.Millisecond, ITL: time.Millisecond})
			a := seqTokens(1, 9)  // 2 full blocks + 1
			c := seqTokens(50, 9) // needs all 3 GPU blocks: evicts A's
			d := seqTokens(90, 9) // overflows the 4-block host tier
			n := names{}
			n.add(a, bs, tokenize.HashOptions{}, "a")
			n.add(c, bs, tokenize.HashOptions{}, "c")
			n.add(d, bs, tokenize.HashOptions{}, "d")
			cpu := func(hs, parent, tokens string) string {
				if !full {
					return "CPU stored [" + hs + "] parent - tokens []"
				}
				return "CPU stored [" + hs + "] parent " + parent + " tokens " + tokens
			}
			tests := []struct {
				name   string
				tokens []uint32
				cached int
				events []string
			}{
				{"A cold", a, 0, []string{"GPU stored [a0 a1] parent - tokens [1 2 3 4 5 6 7 8]", cpu("a0 a1", "-", "[1 2 3 4 5 6 7 8]")}},
				// A's GPU blocks are evicted tail first; their host copies stay.
				{"C evicts A from GPU", c, 0, []string{"GPU removed [a1]", "GPU removed [a0]",
					"GPU stored [c0 c1] parent - tokens [50 51 52 53 54 55 56 57]", cpu("c0 c1", "-", "[50 51 52 53 54 55 56 57]")}},
				// A loads back from the host: cached, re-announced on the GPU, no new CPU store.
				{"A from host", a, 8, []string{"GPU removed [c1]", "GPU removed [c0]",
					"GPU stored [a0 a1] parent - tokens [1 2 3 4 5 6 7 8]"}},
				// D overflows the host LRU: C's copies are the least recently used.
				{"D overflows host", d, 0, []string{"GPU removed [a1]", "GPU removed [a0]",
					"GPU stored [d0 d1] parent - tokens [90 91 92 93 94 95 96 97]", "CPU removed [c0 c1]",
					cpu("d0 d1", "-", "[90 91 92 93 94 95 96 97]")}},
			}
			for _, tc := range tests {
				r, evs := runSync(t, e, tc.tokens, 1, "", "")
				if r.cached != tc.cached {
					t.Errorf("%s: cached %d, want %d", tc.name, r.cached, tc.cached)
				}
				if got := n.render(evs); !slices.Equal(got, tc.events) {
					t.Errorf("%s: events\n got %q\nwant %q", tc.name, got, tc.events)
				}
			}
		})
	}
}

// TestHostLoadCost: a prefix loaded from the host tier costs CPULoadPerToken per token instead
// of prefill.
func TestHostLoadCost(t *testing.T) {
	const bs = 4
	e := syncEngine(t, Options{BlockSize: bs, NumGPUBlocks: 4, NumCPUBlocks: 8})
	a := seqTokens(1, 9)
	runSync(t, e, a, 1, "", "")
	runSync(t, e, seqTokens(50, 9), 1, "", "")
	r, _ := runSync(t, e, a, 1, "", "")
	st := prefillStep(1, 8)
	st.loadTokens = 8
	want := stepDuration(e.o, st, 0)
	if r.cached != 8 || r.simTTFT != want {
		t.Errorf("cached %d TTFT %v, want 8 and %v", r.cached, r.simTTFT, want)
	}
	if cold := stepDuration(e.o, prefillStep(9, 0), 0); want >= cold {
		t.Errorf("host load %v is not cheaper than recompute %v", want, cold)
	}
}

// TestResetPrefixCache: AllBlocksCleared without per-block removals, refused while blocks are
// in use (vllm/v1/core/block_pool.py, reset_prefix_cache).
func TestResetPrefixCache(t *testing.T) {
	e := syncEngine(t, Options{BlockSize: 4, NumGPUBlocks: 8, TTFT: time.Millisecond, ITL: time.Millisecond})
	runSync(t, e, seqTokens(1, 9), 1, "", "")
	if !e.kv.pool.reset() {
		t.Fatal("reset refused with no request running")
	}
	if ev := e.kv.takeEvents(); len(ev) != 1 || ev[0].kind != evCleared {
		t.Fatalf("events %v, want one AllBlocksCleared", ev)
	}
	r, _ := runSync(t, e, seqTokens(1, 9), 1, "", "")
	if r.cached != 0 {
		t.Errorf("cached after reset = %d, want 0", r.cached)
	}
	held := e.kv.pool.getNew(1)
	if e.kv.pool.reset() {
		t.Error("reset succeeded while a block is in use")
	}
	e.kv.pool.freeBlocks(held)
}

// stepAll admits requests and steps the engine until all finish, returning the events and
// the largest running/waiting counts seen after a schedule.
func stepAll(t *testing.T, e *engineCore, reqs []*simRequest) (events []kvEvent, maxRunning, maxWaiting int) {
	t.Helper()
	for _, r := range reqs {
		e.admit(r)
	}
	for range 10000 {
		st := e.schedule()
		if len(st.reqs) == 0 {
			break
		}
		maxRunning = max(maxRunning, len(e.running))
		maxWaiting = max(maxWaiting, len(e.waiting))
		e.update(st, stepDuration(e.o, st, e.kv.pool.usage()))
		events = append(events, e.kv.takeEvents()...)
	}
	for _, r := range reqs {
		if _, finished, _, _ := r.snapshot(); !finished {
			t.Fatalf("request %s did not finish", r.id)
		}
	}
	return events, maxRunning, maxWaiting
}

// prefillStep is a step holding one prefill chunk of n new tokens at context offset c.
func prefillStep(n, c int) step {
	return step{prefillTokens: n, prefillPairs: attentionPairs(n, c)}
}

func mkReq(id string, tokens []uint32, maxTokens int) *simRequest {
	r := newSimRequest(id)
	r.seq = seqState{tokens: slices.Clone(tokens)}
	r.promptLen, r.maxTokens = len(tokens), maxTokens
	return r
}

// TestChunkedPrefill: a prompt longer than --max-num-batched-tokens is prefilled in chunks,
// each announcing the blocks it completes, and its TTFT is the sum of the chunk steps.
func TestChunkedPrefill(t *testing.T) {
	const bs = 4
	e := syncEngine(t, Options{BlockSize: bs, NumGPUBlocks: 32, MaxNumBatchedTokens: 8})
	p := seqTokens(1, 20)
	r := mkReq("long", p, 1)
	evs, _, _ := stepAll(t, e, []*simRequest{r})
	n := names{}
	n.add(p, bs, tokenize.HashOptions{}, "x")
	want := []string{
		"GPU stored [x0 x1] parent - tokens [1 2 3 4 5 6 7 8]",
		"GPU stored [x2 x3] parent x1 tokens [9 10 11 12 13 14 15 16]",
		"GPU stored [x4] parent x3 tokens [17 18 19 20]",
	}
	if got := n.render(evs); !slices.Equal(got, want) {
		t.Errorf("events\n got %q\nwant %q", got, want)
	}
	prefill := func(n, c int) time.Duration { return stepDuration(e.o, prefillStep(n, c), 0) }
	if want := prefill(8, 0) + prefill(8, 8) + prefill(4, 16); r.simTTFT != want {
		t.Errorf("TTFT %v, want %v (three chunks)", r.simTTFT, want)
	}
}

// TestBatchingAndPreemption: --max-num-seqs caps the running batch (the rest waits), and when
// decode runs out of KV blocks the newest running request is preempted, recomputed later
// (hitting its own cached prefix), and everything still finishes.
func TestBatchingAndPreemption(t *testing.T) {
	t.Run("max-num-seqs", func(t *testing.T) {
		e := syncEngine(t, Options{BlockSize: 4, NumGPUBlocks: 64, MaxNumSeqs: 2})
		reqs := []*simRequest{mkReq("a", seqTokens(1, 5), 3), mkReq("b", seqTokens(10, 5), 3), mkReq("c", seqTokens(20, 5), 3)}
		_, running, waiting := stepAll(t, e, reqs)
		if running != 2 || waiting != 1 {
			t.Errorf("max running %d waiting %d, want 2 and 1", running, waiting)
		}
	})
	t.Run("preemption", func(t *testing.T) {
		e := syncEngine(t, Options{BlockSize: 4, NumGPUBlocks: 5})
		a, b := mkReq("a", seqTokens(1, 7), 6), mkReq("b", seqTokens(50, 7), 6)
		stepAll(t, e, []*simRequest{a, b})
		checkPreemptedAndFinished(t, e, 6, 4, a, b)
	})
}

// checkPreemptedAndFinished: e preempted at least once, every request still finished with all
// its tokens (a preempted one is recomputed, not cut short), and the pool is back to free
// blocks free.
func checkPreemptedAndFinished(t *testing.T, e *engineCore, tokens, free int, reqs ...*simRequest) {
	t.Helper()
	if got := testCounter(t, e.w.metrics.preemptions); got < 1 {
		t.Errorf("preemptions = %v, want >= 1", got)
	}
	for _, r := range reqs {
		if out, _, finish, _ := r.snapshot(); len(out) != tokens || finish != "length" {
			t.Errorf("%s: %d tokens, finish %q", r.id, len(out), finish)
		}
	}
	if e.kv.pool.numFree() != free {
		t.Errorf("free blocks %d, want %d", e.kv.pool.numFree(), free)
	}
}

// TestReportModeFull: kv_cache_report_mode "full" re-announces the prefix hit from block 0 with no
// parent before the newly computed blocks (vllm/v1/core/block_pool.py, emit_cached_block_events).
func TestReportModeFull(t *testing.T) {
	const bs = 4
	e := syncEngine(t, Options{BlockSize: bs, NumGPUBlocks: 32})
	p := seqTokens(1, 13)
	n := names{}
	n.add(p, bs, tokenize.HashOptions{}, "x")
	stepAll(t, e, []*simRequest{mkReq("a", p, 1)})
	r := mkReq("b", p, 1)
	r.reportFull = true
	evs, _, _ := stepAll(t, e, []*simRequest{r})
	want := []string{"GPU stored [x0 x1 x2] parent - tokens [1 2 3 4 5 6 7 8 9 10 11 12]"}
	if got := n.render(evs); !slices.Equal(got, want) {
		t.Errorf("events\n got %q\nwant %q", got, want)
	}
}
