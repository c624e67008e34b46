package sim

import (
	"slices"
	"testing"
	"time"
)

// firstStepTime admits a request for prompt into e and returns the modelled duration of the
// step that schedules it, with the prompt tokens it found cached.
func firstStepTime(t *testing.T, e *engineCore, prompt []uint32) (time.Duration, int) {
	t.Helper()
	r := mkReq("probe", prompt, 1)
	e.admit(r)
	st := e.schedule()
	if len(st.reqs) != 1 {
		t.Fatalf("step schedules %d requests, want 1", len(st.reqs))
	}
	return e.stepTime(st), r.cached
}

// TestPrefillPaysForCachedContext: the same number of new prompt tokens costs more after a
// longer cached prefix, because their attention reads the whole cached context (a 100-token
// suffix after a 50k-token hit is not a 100-token prompt).
func TestPrefillPaysForCachedContext(t *testing.T) {
	const newTokens = 256
	tests := []struct {
		name   string
		cached int
	}{
		{"no prefix", 0},
		{"1k cached", 1024},
		{"4k cached", 4096},
		{"12k cached", 12288},
	}
	var prev time.Duration
	for i, tc := range tests {
		e := syncEngine(t, Options{ServedModelName: "m"})
		prefix := seqTokens(1, tc.cached)
		if tc.cached > 0 {
			runSync(t, e, prefix, 1, "", "")
		}
		prompt := append(slices.Clone(prefix), seqTokens(1_000_000, newTokens)...)
		d, cached := firstStepTime(t, e, prompt)
		if cached != tc.cached {
			t.Fatalf("%s: %d tokens cached, want %d", tc.name, cached, tc.cached)
		}
		if i > 0 && d <= prev {
			t.Errorf("%s: step %v, not longer than %v with the shorter prefix %q", tc.name, d, prev, tests[i-1].name)
		}
		prev = d
	}
}

// TestStepCostTerms: each term of the step model moves the step time the way it should.
func TestStepCostTerms(t *testing.T) {
	perf := PerfModel{PrefillB: 0.02, PrefillC: 1, PrefillAttn: 1e-6, DecodeC: 5, DecodePerKVToken: 3e-5, DecodePerSeq: 0.01}
	o := Options{Perf: perf}
	ms := func(st step) float64 { return float64(stepDuration(o, st, 0.5)) / float64(time.Millisecond) }
	decode := func(b, ctx int) step { return step{decodes: b, decodeKV: b * ctx} }
	tests := []struct {
		name          string
		short, longer step
	}{
		{"prefill: same new tokens, longer cached prefix", prefillStep(512, 0), prefillStep(512, 8192)},
		{"prefill: more new tokens", prefillStep(512, 0), prefillStep(1024, 0)},
		{"decode: same batch, longer contexts", decode(8, 1024), decode(8, 8192)},
		{"decode: bigger batch, same contexts", decode(8, 1024), decode(64, 1024)},
	}
	for _, tc := range tests {
		if a, b := ms(tc.short), ms(tc.longer); b <= a {
			t.Errorf("%s: %v ms, not more than %v ms", tc.name, b, a)
		}
	}
	// Attention pairs: 512·(8192 + 256) more pairs at 1e-6 ms each.
	if got, want := ms(prefillStep(512, 8192))-ms(prefillStep(512, 0)), 1e-6*512*8192; got < want*0.999 || got > want*1.001 {
		t.Errorf("cached-context attention costs %v ms, want %v", got, want)
	}
	// KV read: 64·1024 tokens at 3e-5 ms each, plus the per-sequence term, over the floor.
	if got, want := ms(decode(64, 1024)), 5+3e-5*64*1024+0.01*64; got < want*0.999 || got > want*1.001 {
		t.Errorf("decode step %v ms, want %v", got, want)
	}
}
