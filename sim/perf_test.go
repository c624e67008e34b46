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

// TestCalibratedProfile: the Llama-3.1-8B bf16 H200 profile reproduces the kernel-sum step
// times it was fitted to (AIConfigurator's measured vLLM kernels; see perfProfiles) within
// the stated tolerance, including prefill after a cached prefix and decode over long contexts.
func TestCalibratedProfile(t *testing.T) {
	p, err := PerfProfile("llama3.1-8b-bf16-h200")
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Perf: p}
	decode := func(b, ctx int) step { return step{decodes: b, decodeKV: b * ctx} }
	tests := []struct {
		name   string
		st     step
		wantMS float64
		tol    float64 // relative
	}{
		{"prefill 512", prefillStep(512, 0), 10.1, 0.05},
		{"prefill 2048", prefillStep(2048, 0), 37.5, 0.05},
		{"prefill 8192", prefillStep(8192, 0), 183.6, 0.05},
		{"prefill 16384", prefillStep(16384, 0), 414.5, 0.05},
		{"512 new after 3584 cached", prefillStep(512, 3584), 11.5, 0.10},
		{"1024 new after 7168 cached", prefillStep(1024, 7168), 25.0, 0.10},
		{"512 new after 15872 cached", prefillStep(512, 15872), 16.1, 0.20},
		{"decode 1 x 1024", decode(1, 1024), 4.8, 0.05},
		{"decode 32 x 8192", decode(32, 8192), 13.3, 0.08},
		{"decode 128 x 4096", decode(128, 4096), 20.6, 0.08},
		{"decode 256 x 1024", decode(256, 1024), 14.8, 0.08},
	}
	for _, tc := range tests {
		got := float64(stepDuration(o, tc.st, 0)) / float64(time.Millisecond)
		if rel := got/tc.wantMS - 1; rel < -tc.tol || rel > tc.tol {
			t.Errorf("%s: %.2f ms, measured %.1f ms (off by %+.0f%%, tolerance %.0f%%)", tc.name, got, tc.wantMS, rel*100, tc.tol*100)
		}
	}
	// A mixed step pays the weight read once: 512 prefill tokens plus 8 decodes cost less than
	// the two steps apart.
	mixed := prefillStep(512, 0)
	mixed.decodes, mixed.decodeKV = 8, 8*1024
	if m, apart := stepDuration(o, mixed, 0), stepDuration(o, prefillStep(512, 0), 0)+stepDuration(o, decode(8, 1024), 0); m >= apart {
		t.Errorf("mixed step %v, not cheaper than prefill and decode apart (%v)", m, apart)
	}
}
