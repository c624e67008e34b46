package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// TestCapturedCacheFraction: captured = cached tokens reported / the prompt tokens an
// infinite single-worker cache would have served (theoretical hit blocks × block size, capped
// at the prompt), over the successful requests that have both usage and trace blocks.
func TestCapturedCacheFraction(t *testing.T) {
	ok := func(hit, blocks, prompt, cached int) Record {
		return Record{Status: 200, HasUsage: true, PromptTokens: prompt, CachedTokens: cached, TheoreticalHit: hit, TraceBlocks: blocks}
	}
	tests := []struct {
		name      string
		blockSize int
		recs      []Record
		wantTheo  int
		want      float64
	}{
		{"half captured", 64, []Record{ok(0, 4, 256, 0), ok(3, 4, 256, 96)}, 192, 0.5},
		{"all captured", 64, []Record{ok(3, 4, 256, 192)}, 192, 1},
		{"hit capped at the prompt", 64, []Record{ok(4, 4, 200, 150)}, 200, 0.75},
		{"failed, usage-less and blockless requests do not count", 64, []Record{
			ok(3, 4, 256, 96),
			{ErrorKind: "http_503", Status: 503, TheoreticalHit: 3, TraceBlocks: 4},
			{Status: 200, TheoreticalHit: 3, TraceBlocks: 4},
			ok(0, 0, 256, 200),
		}, 192, 0.5},
		{"nothing cacheable", 64, []Record{ok(0, 4, 256, 16)}, 0, 0},
		{"unknown block size", 0, []Record{ok(3, 4, 256, 96)}, 0, 0},
	}
	for _, tc := range tests {
		s := Summarize("x", InputConfig{BlockSize: tc.blockSize}, &Result{Records: tc.recs})
		if s.TheoreticalCacheableTokens != tc.wantTheo || math.Abs(s.CapturedCacheFraction-tc.want) > 1e-9 {
			t.Errorf("%s: theoretical %d captured %v, want %d and %v", tc.name, s.TheoreticalCacheableTokens, s.CapturedCacheFraction, tc.wantTheo, tc.want)
		}
	}
}

// TestCapturedOfCapacity: the pooled-LRU and clairvoyant references sum like the theoretical
// one, over the same requests, and the captured fraction of either can exceed 1 (the fleet did
// better than one cache of its size).
func TestCapturedOfCapacity(t *testing.T) {
	rec := func(capHit, optHit, prompt, cached int) Record {
		return Record{Status: 200, HasUsage: true, PromptTokens: prompt, CachedTokens: cached,
			TheoreticalHit: 4, TraceBlocks: 4, CapacityHit: capHit, OptimalHit: optHit}
	}
	tests := []struct {
		name             string
		recs             []Record
		wantCap, wantOpt int
		want, wantOfOpt  float64
	}{
		{"capacity lost half, LRU a quarter", []Record{rec(2, 4, 256, 64), rec(4, 4, 256, 256)}, 384, 512, 320.0 / 384, 320.0 / 512},
		{"beat the pooled LRU", []Record{rec(1, 3, 256, 128)}, 64, 192, 2, 128.0 / 192},
		{"capped at the prompt", []Record{rec(4, 4, 200, 100)}, 200, 200, 0.5, 0.5},
		{"no capacity given", []Record{rec(0, 0, 256, 64)}, 0, 0, 0, 0},
	}
	for _, tc := range tests {
		s := Summarize("x", InputConfig{BlockSize: 64}, &Result{Records: tc.recs})
		if s.CapacityCacheableTokens != tc.wantCap || math.Abs(s.CapturedOfCapacity-tc.want) > 1e-9 {
			t.Errorf("%s: capacity %d captured %v, want %d and %v", tc.name, s.CapacityCacheableTokens, s.CapturedOfCapacity, tc.wantCap, tc.want)
		}
		if s.OptimalCacheableTokens != tc.wantOpt || math.Abs(s.CapturedOfOptimal-tc.wantOfOpt) > 1e-9 {
			t.Errorf("%s: optimal %d captured %v, want %d and %v", tc.name, s.OptimalCacheableTokens, s.CapturedOfOptimal, tc.wantOpt, tc.wantOfOpt)
		}
	}
}

// TestCapturedInReports: the captured fraction appears in the JSON summary, the text table,
// the CSV and the HTML report.
func TestCapturedInReports(t *testing.T) {
	res := fakeResult(10, 1, []string{"w1", "w2"}) // 3 of 4 blocks hit, 1000-token prompts
	s := Summarize("rr", InputConfig{Model: "m", BlockSize: 64}, res)
	const want = 500.0 * 5 / (192 * 10) // 5 of 10 requests cache 500 tokens; 192 cacheable each
	if math.Abs(s.CapturedCacheFraction-want) > 1e-9 {
		t.Fatalf("captured %v, want %v", s.CapturedCacheFraction, want)
	}
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if v, _ := back["captured_cache_fraction"].(float64); math.Abs(v-want) > 1e-9 {
		t.Errorf("JSON captured_cache_fraction = %v, want %v", back["captured_cache_fraction"], want)
	}
	if v, _ := back["theoretical_cacheable_tokens"].(float64); v != 1920 {
		t.Errorf("JSON theoretical_cacheable_tokens = %v, want 1920", back["theoretical_cacheable_tokens"])
	}
	run := &Run{Summary: s}
	var text, csv, html bytes.Buffer
	if err := WriteCompare(&text, []*Run{run}); err != nil {
		t.Fatal(err)
	}
	if err := WriteCSV(&csv, s); err != nil {
		t.Fatal(err)
	}
	if err := WriteReport(&html, "t", []*Run{run}); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, out, want string }{
		{"text", text.String(), "captured of theoretical    " + formatNum(want)},
		{"csv", csv.String(), "Captured Cache Fraction,1.302"},
		{"html", html.String(), "captured of theoretical"},
		{"text, missed split", text.String(), "missed: same worker"},
		{"csv, missed split", csv.String(), "Missed Same Worker Tokens,"},
		{"json, missed split", string(raw), `"missed_cache":{"same_worker_tokens":`},
	}
	for _, tc := range tests {
		if !strings.Contains(tc.out, tc.want) {
			t.Errorf("%s report lacks %q:\n%s", tc.name, tc.want, tc.out)
		}
	}
}

// TestMissedCache: the theoretical hit a run missed is split by where each request went
// against its conversation's previous turn: the same worker, another one, or none (a first
// turn); the three fractions and the captured one add up to 1; a request without a worker
// leaves the split out.
func TestMissedCache(t *testing.T) {
	rec := func(conv string, turn int, worker string, hit, prompt, cached int) Record {
		return Record{Status: 200, HasUsage: true, ConversationID: conv, TurnIndex: turn, Worker: worker,
			PromptTokens: prompt, CachedTokens: cached, TheoreticalHit: hit, TraceBlocks: prompt / 64}
	}
	tests := []struct {
		name                    string
		recs                    []Record
		same, moved, first, all int  // missed tokens, and the theoretical cacheable ones
		none                    bool // no split
		over                    bool // a request reused more than its theoretical hit: captured + missed > 1
	}{
		{"stayed and evicted", []Record{rec("a", 0, "w1", 0, 256, 0), rec("a", 1, "w1", 4, 512, 128)}, 128, 0, 0, 256, false, false},
		{"moved", []Record{rec("a", 0, "w1", 0, 256, 0), rec("a", 1, "w2", 4, 512, 0)}, 0, 256, 0, 256, false, false},
		{"first turn missed its shared prefix", []Record{rec("a", 0, "w1", 0, 256, 0), rec("b", 0, "w2", 2, 256, 64)}, 0, 0, 64, 128, false, false},
		{"turns out of order are put in order", []Record{rec("a", 1, "w2", 4, 512, 0), rec("a", 0, "w1", 0, 256, 0)}, 0, 256, 0, 256, false, false},
		{"reusing more than the theoretical hit misses nothing", []Record{rec("a", 0, "w1", 0, 256, 0), rec("a", 1, "w1", 2, 512, 192)}, 0, 0, 0, 128, false, true},
		{"a failed turn does not count, nor break the chain", []Record{
			rec("a", 0, "w1", 0, 256, 0),
			{ErrorKind: "http_503", Status: 503, ConversationID: "a", TurnIndex: 1, Worker: "w2", TheoreticalHit: 4, TraceBlocks: 8},
			rec("a", 2, "w1", 4, 512, 128),
		}, 128, 0, 0, 256, false, false},
		{"a request without a worker", []Record{rec("a", 0, "", 0, 256, 0), rec("a", 1, "w1", 4, 512, 0)}, 0, 0, 0, 256, true, false},
	}
	for _, tc := range tests {
		s := Summarize("x", InputConfig{BlockSize: 64}, &Result{Records: tc.recs})
		if s.TheoreticalCacheableTokens != tc.all {
			t.Fatalf("%s: theoretical %d, want %d", tc.name, s.TheoreticalCacheableTokens, tc.all)
		}
		m := s.Missed
		if tc.none {
			if m != nil {
				t.Errorf("%s: split %+v, want none", tc.name, *m)
			}
			continue
		}
		if m == nil {
			t.Fatalf("%s: no split", tc.name)
		}
		if m.SameWorkerTokens != tc.same || m.MovedTokens != tc.moved || m.FirstTurnTokens != tc.first {
			t.Errorf("%s: missed same/moved/first %d/%d/%d, want %d/%d/%d", tc.name, m.SameWorkerTokens, m.MovedTokens, m.FirstTurnTokens, tc.same, tc.moved, tc.first)
		}
		if sum := s.CapturedCacheFraction + m.SameWorkerFraction + m.MovedFraction + m.FirstTurnFraction; !tc.over && math.Abs(sum-1) > 1e-9 {
			t.Errorf("%s: captured + missed fractions = %v, want 1", tc.name, sum)
		}
	}
}
