package router

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/router/latency"
)

// TestKVWorkerTimingWindows: the worker's own TTFT, prefill-time and iteration-token
// histograms become window means in the latency view; a reset of the counters starts over.
func TestKVWorkerTimingWindows(t *testing.T) {
	_, p, _ := timedEngine(t, DefaultKVConfig(), nil)
	p.timed.getOrCreate(tgt(0))
	page := func(ttftSum, ttftN, prefSum, prefN, tokSum, steps float64) string {
		return fmt.Sprintf("vllm:time_to_first_token_seconds_sum{engine=\"0\"} %g\nvllm:time_to_first_token_seconds_count{engine=\"0\"} %g\n"+
			"vllm:request_prefill_time_seconds_sum{engine=\"0\"} %g\nvllm:request_prefill_time_seconds_count{engine=\"0\"} %g\n"+
			"vllm:iteration_tokens_total_sum{engine=\"0\"} %g\nvllm:iteration_tokens_total_count{engine=\"0\"} %g\n",
			ttftSum, ttftN, prefSum, prefN, tokSum, steps)
	}
	deref := func(f *float64) float64 {
		if f == nil {
			return -1
		}
		return *f
	}
	for _, tc := range []struct {
		name                 string
		body                 string
		ttft, prefill, steps float64 // -1: absent
	}{
		{"first reading: no window yet", page(1, 10, 0.5, 10, 1000, 10), -1, -1, -1},
		{"one window", page(3, 20, 1.5, 20, 3000, 20), 200, 100, 200},
		{"smoothed", page(4, 30, 2.5, 30, 4000, 30), 200 + 0.3*(100-200), 100, 200 + 0.3*(100-200)},
		{"counters reset (restart): starts over, keeps the means", page(0.1, 1, 0.1, 1, 10, 1), 170, 100, 170},
	} {
		if err := p.load.FeedMetrics(tgt(0).Worker, []int{0}, strings.NewReader(tc.body)); err != nil {
			t.Fatal(err)
		}
		p.checkRestarts()
		v := p.latencyView(tgt(0))
		got := []float64{deref(v.WorkerTTFTMs), deref(v.WorkerPrefillMs), deref(v.WorkerTokensPerStep)}
		want := []float64{tc.ttft, tc.prefill, tc.steps}
		for i := range got {
			if math.Abs(got[i]-want[i]) > 1e-6 {
				t.Fatalf("%s: worker means %v, want %v", tc.name, got, want)
			}
		}
	}
}

// slowWorker is a fake vLLM worker whose timing histograms follow a profile three times
// slower than the kv policy's prior: each window it finishes some prefills of a window-specific
// size and runs decode steps, and its /metrics page carries the cumulative _sum/_count.
type slowWorker struct {
	th                             latency.Theta
	params                         latency.Params
	prefSum, prefN, compSum, compN float64
	itlSum, itlN, iterSum, iterN   float64
	running                        float64
}

// window runs n prefills of about u uncached tokens each, and steps decode steps with
// decodes running, and returns the page a scrape then reads.
func (w *slowWorker) window(r *rand.Rand, n int, u float64, steps, decodes int) string {
	var computed, pairs float64
	for i := 0; i < n; i++ {
		ui := u * (0.8 + 0.4*r.Float64())
		computed += ui
		pairs += latency.Pairs(ui, 0)
		w.prefSum += latency.Dot(w.th, latency.PrefillFeatures(ui, 0, float64(decodes), 0, w.params)) / 1000
		w.compSum += ui
	}
	w.prefN += float64(n)
	w.compN += float64(n)
	stepMs := latency.StepMs(w.th, computed/float64(steps), pairs/float64(steps), 0)
	w.itlSum += float64(steps*decodes) * stepMs / 1000
	w.itlN += float64(steps * decodes)
	w.iterSum += computed + float64(steps*decodes)
	w.iterN += float64(steps)
	w.running = float64(decodes)
	return w.page()
}

func (w *slowWorker) page() string {
	var b strings.Builder
	for _, kv := range []struct {
		name string
		v    float64
	}{
		{"vllm:num_requests_running", w.running},
		{"vllm:request_prefill_time_seconds_sum", w.prefSum}, {"vllm:request_prefill_time_seconds_count", w.prefN},
		{"vllm:request_prefill_kv_computed_tokens_sum", w.compSum}, {"vllm:request_prefill_kv_computed_tokens_count", w.compN},
		{"vllm:inter_token_latency_seconds_sum", w.itlSum}, {"vllm:inter_token_latency_seconds_count", w.itlN},
		{"vllm:iteration_tokens_total_sum", w.iterSum}, {"vllm:iteration_tokens_total_count", w.iterN},
	} {
		fmt.Fprintf(&b, "%s{engine=\"0\",model_name=\"m\"} %g\n", kv.name, kv.v)
	}
	return b.String()
}

// TestKVLearnsSlowWorkerFromItsHistograms: with no request through the gateway at all, a
// worker three times slower than the prior is learned from its own prefill-time,
// computed-token and inter-token-latency histograms, scrape by scrape; the debug view names
// the sources. A counter reset (the worker restarted, no start time exposed) gives no sample,
// leaves the fit where it was, and the windows after it are learned again.
func TestKVLearnsSlowWorkerFromItsHistograms(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, p, clk := timedEngine(t, allSources(), reg)
	var slow latency.Theta
	for i, v := range p.timed.prior {
		slow[i] = 3 * v
	}
	w := &slowWorker{th: slow, params: p.timed.params}
	r := rand.New(rand.NewPCG(9, 1))
	scrape := func(page string) {
		t.Helper()
		clk.advance(time.Second)
		if err := p.load.FeedMetrics(tgt(0).Worker, []int{0}, strings.NewReader(page)); err != nil {
			t.Fatal(err)
		}
		p.checkRestarts()
	}
	run := func(windows int) {
		for i := 0; i < windows; i++ {
			scrape(w.window(r, 1+r.IntN(4), 200+r.Float64()*6000, 20+r.IntN(60), 1+r.IntN(30)))
		}
	}
	probe := latency.PrefillFeatures(3000, 0, 10, 0, p.timed.params)
	relErr := func() float64 {
		_, th := p.timed.state(tgt(0))
		want := latency.Dot(slow, probe)
		return math.Abs(latency.Dot(th, probe)-want) / want
	}
	before := relErr()
	scrape(w.page()) // the first reading only opens a window
	run(80)
	v := p.latencyView(tgt(0))
	if !v.Ready {
		t.Fatalf("fit not ready from the worker's histograms: %+v", v.Sources)
	}
	if got := relErr(); got > 0.15 {
		t.Fatalf("prefill of 3,000 tokens off by %.0f%% (prior %.0f%%)", 100*got, 100*before)
	}
	if s := v.Sources["worker_prefill"]; s.Samples != 80 || s.Error <= 0 {
		t.Fatalf("worker_prefill source %+v, want 80 samples with an error", s)
	}
	if s := v.Sources["worker_step"]; s.Samples != 80 {
		t.Fatalf("worker_step source %+v, want 80 samples", s)
	}
	if v.Sources["gateway_ttft"].Samples != 0 || v.WorkerITLMs == nil {
		t.Fatalf("view %+v: want no gateway samples and the worker's ITL", v)
	}
	if got := metricValue(t, p.timed.metrics.samples.WithLabelValues(tgt(0).String(), "worker_prefill")); got != 80 {
		t.Fatalf("kvgate_router_latency_fit_samples_total{source=worker_prefill} = %v, want 80", got)
	}

	// The worker restarts: its counters begin again. By the next scrape it has finished more
	// prefills than the old process had (so that count alone went up) but run fewer steps:
	// differences across the restart are no window.
	_, thBefore := p.timed.state(tgt(0))
	samples := v.Samples
	oldPrefills := int(w.prefN)
	*w = slowWorker{th: slow, params: p.timed.params}
	scrape(w.window(r, oldPrefills+50, 3000, 30, 5))
	if _, th := p.timed.state(tgt(0)); th != thBefore || p.latencyView(tgt(0)).Samples != samples {
		t.Fatalf("a counter reset moved the fit: theta %v → %v, samples %d → %d", thBefore, th, samples, p.latencyView(tgt(0)).Samples)
	}
	scrape(w.page()) // counts did not move: no sample
	if got := p.latencyView(tgt(0)).Samples; got != samples {
		t.Fatalf("an unchanged reading gave %d samples", got-samples)
	}
	run(20)
	if got := relErr(); got > 0.15 {
		t.Fatalf("after the reset, prefill of 3,000 tokens off by %.0f%%", 100*got)
	}
	if got := p.latencyView(tgt(0)).Samples; got != samples+40 {
		t.Fatalf("after the reset: %d samples, want %d", got, samples+40)
	}
}
