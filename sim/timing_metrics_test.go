package sim

import (
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads base/metrics and parses it with expfmt.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	return families
}

// TestTimingMetrics: the simulator exports vLLM v1's engine-side timing histograms with
// vLLM's names and buckets (vllm/v1/metrics/loggers.py), observed when a request finishes,
// and per step for inter-token latency and tokens per iteration.
func TestTimingMetrics(t *testing.T) {
	const (
		ttft, itl  = 40 * time.Millisecond, 10 * time.Millisecond
		prompt     = 100
		maxTokens  = 5
		secondHit  = 96 // six full 16-token blocks; the match stops before the last prompt token
		maxModelLn = 2048
	)
	_, base := startWorker(t, Options{ServedModelName: "m", TTFT: ttft, ITL: itl, Speedup: 1, MaxModelLen: maxModelLn})
	ids := make([]string, prompt)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 10)
	}
	body := `{"model":"m","prompt":[` + strings.Join(ids, ",") + `],"max_tokens":` + strconv.Itoa(maxTokens) + `}`
	for range 2 {
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// The per-step histogram is observed when the step ends, which may be just after the
	// last response was written (the finished requests' histograms come before it, see
	// engineCore.finishRequest): wait, bounded, for the last step's sample.
	families := scrape(t, base)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); families = scrape(t, base) {
		if f := families["vllm:iteration_tokens_total"]; f != nil && len(f.GetMetric()) == 1 &&
			f.GetMetric()[0].GetHistogram().GetSampleCount() >= 2*maxTokens {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	const slack = 0.9
	requestLatency := []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
	tokenLatency := []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	tests := []struct {
		name           string
		buckets        []float64
		count          uint64
		minSum, maxSum float64
	}{
		// two requests, each queued ~0, one 40 ms prefill step and four 10 ms decode steps; lower
		// bounds have 10 % slack as the engine's virtual clock pays back timer oversleep
		{"vllm:request_queue_time_seconds", requestLatency, 2, 0, 0.5},
		{"vllm:request_prefill_time_seconds", requestLatency, 2, slack * 2 * ttft.Seconds(), 2},
		{"vllm:request_decode_time_seconds", requestLatency, 2, slack * 2 * 4 * itl.Seconds(), 2},
		{"vllm:request_inference_time_seconds", requestLatency, 2, slack * 2 * (ttft + 4*itl).Seconds(), 2},
		{"vllm:e2e_request_latency_seconds", requestLatency, 2, slack * 2 * (ttft + 4*itl).Seconds(), 2},
		{"vllm:inter_token_latency_seconds", tokenLatency, 2 * (maxTokens - 1), slack * 2 * 4 * itl.Seconds(), 2},
		{"vllm:request_time_per_output_token_seconds", tokenLatency, 2, slack * 2 * itl.Seconds(), 2},
		{"vllm:time_to_first_token_seconds",
			[]float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560},
			2, slack * 2 * ttft.Seconds(), 2},
		// per step: the whole prompt at the step that completes its prefill, plus the sampled tokens
		{"vllm:iteration_tokens_total", []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384},
			2 * maxTokens, 2 * (prompt + maxTokens), 2 * (prompt + maxTokens)},
		// newly computed prompt tokens: all 100 cold, then 100 - 96 after the hit
		{"vllm:request_prefill_kv_computed_tokens", []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000},
			2, prompt + prompt - secondHit, prompt + prompt - secondHit},
	}
	for _, tc := range tests {
		fam := families[tc.name]
		if fam == nil || len(fam.GetMetric()) != 1 {
			t.Errorf("%s: missing or not one series", tc.name)
			continue
		}
		if fam.GetType() != dto.MetricType_HISTOGRAM {
			t.Errorf("%s: type %v, want histogram", tc.name, fam.GetType())
		}
		h := fam.GetMetric()[0].GetHistogram()
		var bounds []float64
		for _, b := range h.GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) { // the text format adds +Inf
				bounds = append(bounds, b.GetUpperBound())
			}
		}
		if !slices.Equal(bounds, tc.buckets) {
			t.Errorf("%s: buckets %v, want vLLM's %v", tc.name, bounds, tc.buckets)
		}
		if h.GetSampleCount() != tc.count {
			t.Errorf("%s: %d samples, want %d", tc.name, h.GetSampleCount(), tc.count)
		}
		if s := h.GetSampleSum(); s < tc.minSum || s > tc.maxSum {
			t.Errorf("%s: sum %v, want in [%v, %v]", tc.name, s, tc.minSum, tc.maxSum)
		}
	}
}

// TestTimingMetricsAtFinish: per-request intervals appear only when the request finishes (as
// in vLLM), while TTFT is observed at the first token and per-step histograms as steps run.
func TestTimingMetricsAtFinish(t *testing.T) {
	_, base := startWorker(t, Options{ServedModelName: "m", TTFT: time.Millisecond, ITL: 50 * time.Millisecond, Speedup: 1})
	done := make(chan error, 1)
	go func() {
		resp, err := http.Post(base+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"m","prompt":[1,2,3,4,5,6,7,8],"max_tokens":6}`))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	count := func(f map[string]*dto.MetricFamily, name string) uint64 {
		if fam := f[name]; fam != nil && len(fam.GetMetric()) == 1 {
			return fam.GetMetric()[0].GetHistogram().GetSampleCount()
		}
		return 0
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		f := scrape(t, base)
		if count(f, "vllm:inter_token_latency_seconds") >= 1 {
			if n := count(f, "vllm:request_prefill_time_seconds"); n != 0 {
				t.Errorf("prefill time observed %d times while the request still decodes, want 0", n)
			}
			if n := count(f, "vllm:time_to_first_token_seconds"); n != 1 {
				t.Errorf("TTFT observed %d times after the first token, want 1 (vLLM observes it then)", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no inter-token latency observed while decoding")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The engine records a finished request's intervals in its own step, which can come just
	// after the HTTP handler has written the last chunk: wait for it, briefly.
	var n uint64
	for wait := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if n = count(scrape(t, base), "vllm:request_prefill_time_seconds"); n != 0 || time.Now().After(wait) {
			break
		}
	}
	if n != 1 {
		t.Errorf("prefill time observed %d times after the request finished, want 1", n)
	}
}
