package router

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// vllmMetrics is shaped like a vLLM v1 /metrics page with two DP engines.
const vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-0.6B"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 2.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-0.6B"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-0.6B"} 0.5
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="4096",prefix_caching_hash_algo="sha256"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",num_gpu_blocks="4096",prefix_caching_hash_algo="sha256"} 1.0
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 1234.0
vllm:num_requests_running{engine="0",model_name="weird \"quoted\", name"} 1
python_gc_objects_collected_total{generation="0"} 5.0
garbage line without value
`

func TestParseWorkerMetrics(t *testing.T) {
	got, err := ParseWorkerMetrics(strings.NewReader(vllmMetrics))
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]WorkerMetrics{
		0: {Running: 4, Waiting: 2, KVUsage: 0.25, NumGPUBlocks: 4096},
		1: {Running: 1, Waiting: 0, KVUsage: 0.5, NumGPUBlocks: 4096},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("engine %d: %+v, want %+v", k, got[k], w)
		}
	}
}

func TestFeedMetricsRanks(t *testing.T) {
	cases := []struct {
		name  string
		body  string
		ranks []int
		want  map[int]WorkerMetrics
	}{
		{"engine labels", vllmMetrics, []int{0, 1},
			map[int]WorkerMetrics{0: {Running: 4, Waiting: 2, KVUsage: 0.25, NumGPUBlocks: 4096}, 1: {Running: 1, KVUsage: 0.5, NumGPUBlocks: 4096}}},
		{"no engine label, one rank", "vllm:num_requests_waiting 7\nvllm:gpu_cache_usage_perc 0.9\n", []int{0},
			map[int]WorkerMetrics{0: {Waiting: 7, KVUsage: 0.9}}},
		{"no engine label, split over ranks", "vllm:num_requests_running{model_name=\"m\"} 4\n", []int{0, 1},
			map[int]WorkerMetrics{0: {Running: 2}, 1: {Running: 2}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lt := NewLoadTracker(time.Hour)
			if err := lt.FeedMetrics("http://w", tc.ranks, strings.NewReader(tc.body)); err != nil {
				t.Fatal(err)
			}
			for r, w := range tc.want {
				got, ok := lt.Metrics(kvkey.Target{Worker: "http://w", DPRank: r}, time.Minute)
				got.At, got.mark = time.Time{}, metricsMark{}
				if !ok || got != w {
					t.Errorf("rank %d: %+v (fresh %v), want %+v", r, got, ok, w)
				}
			}
		})
	}
}

func TestScraper(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(vllmMetrics))
	}))
	defer srv.Close()
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusServiceUnavailable)
	}))
	defer dead.Close()
	lt := NewLoadTracker(time.Hour)
	targets := []kvkey.Target{{Worker: srv.URL, DPRank: 0}, {Worker: srv.URL, DPRank: 1}, {Worker: dead.URL}}
	s := &Scraper{Tracker: lt, Interval: time.Second, Targets: func() []kvkey.Target { return targets }}
	s.ScrapeOnce(context.Background())
	if m, ok := lt.Metrics(targets[0], time.Minute); !ok || m.Waiting != 2 || m.Running != 4 {
		t.Fatalf("rank 0: %+v %v", m, ok)
	}
	if m, ok := lt.Metrics(targets[1], time.Minute); !ok || m.KVUsage != 0.5 {
		t.Fatalf("rank 1: %+v %v", m, ok)
	}
	if _, ok := lt.Metrics(targets[2], time.Minute); ok {
		t.Fatal("a failing worker got metrics")
	}
}

// FuzzParseWorkerMetrics: any /metrics body parses without panicking, and every figure it
// returns is one the body could have said (non-negative ranks or the no-engine key).
func FuzzParseWorkerMetrics(f *testing.F) {
	f.Add(vllmMetrics)
	f.Add("vllm:num_requests_running{engine=\"3\"} 2\n")
	f.Add("vllm:cache_config_info{num_gpu_blocks=\"x\",engine=\"-1\"} 1\n")
	f.Add("vllm:kv_cache_usage_perc{engine=\"0\",a=\"\\\"}\"} NaN\n")
	f.Fuzz(func(t *testing.T, body string) {
		got, err := ParseWorkerMetrics(strings.NewReader(body))
		if err != nil {
			return
		}
		for rank := range got {
			if rank < noEngine {
				t.Fatalf("rank %d", rank)
			}
		}
	})
}

// vllmSampleFile is a hand-written vLLM v1 /metrics page for a data-parallel size of 2 serving
// Qwen/Qwen3-0.6B. Names, labels and histogram buckets follow vLLM's PrometheusStatLogger
// (vllm/v1/metrics/loggers.py) as rendered by prometheus_client: counters as *_total with
// *_created gauges, histograms as *_bucket/_count/_sum, cache_config_info carrying the
// CacheConfig fields as labels, plus the process, python and HTTP families that sit beside them.
const vllmSampleFile = "testdata/vllm_metrics_dp2.txt"

// sampleTiming is each engine's timing histograms' _sum/_count in the vLLM sample.
var sampleTiming = WorkerTiming{TTFTSum: 12.5, TTFTCount: 66, PrefillSum: 12.5, PrefillCount: 66, IterTokensSum: 12.5, Iterations: 42,
	ITLSum: 12.5, ITLCount: 66}

func TestParseWorkerMetricsVLLMSample(t *testing.T) {
	body, err := os.ReadFile(vllmSampleFile)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseWorkerMetrics(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]WorkerMetrics{
		0:        {Running: 3, Waiting: 2, KVUsage: 0.2512, NumGPUBlocks: 27434, Timing: sampleTiming},
		1:        {Running: 1, Waiting: 0, KVUsage: 0.0625, NumGPUBlocks: 27434, Timing: sampleTiming},
		noEngine: {StartTime: 1.76132e+09}, // the process collector's gauge has no engine label
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("engine %d: %+v, want %+v", k, got[k], w)
		}
	}
}

// errReader fails after its data.
type errReader struct{ data *strings.Reader }

func (r errReader) Read(p []byte) (int, error) {
	if r.data.Len() == 0 {
		return 0, errors.New("connection reset")
	}
	return r.data.Read(p)
}

// TestParseWorkerMetricsBadInput: a malformed sample is skipped without hiding the others, a
// body that is not Prometheus text gives no figures, and a body that cannot be read (an
// over-long line, a failing reader) is an error.
func TestParseWorkerMetricsBadInput(t *testing.T) {
	cases := []struct {
		name    string
		body    io.Reader
		want    map[int]WorkerMetrics
		wantErr bool
	}{
		{"empty", strings.NewReader(""), map[int]WorkerMetrics{}, false},
		{"html page", strings.NewReader("<html><body>502 Bad Gateway</body></html>\n"), map[int]WorkerMetrics{}, false},
		{"no value", strings.NewReader("vllm:num_requests_running{engine=\"0\"}\nvllm:num_requests_waiting{engine=\"0\"} 5\n"),
			map[int]WorkerMetrics{0: {Waiting: 5}}, false},
		{"bad value", strings.NewReader("vllm:num_requests_running{engine=\"0\"} lots\nvllm:num_requests_running{engine=\"0\"} 2\n"),
			map[int]WorkerMetrics{0: {Running: 2}}, false},
		{"unterminated labels", strings.NewReader("vllm:num_requests_running{engine=\"0\n" +
			"vllm:num_requests_waiting{engine=\"1\"} 1\n"), map[int]WorkerMetrics{1: {Waiting: 1}}, false},
		{"unterminated label set", strings.NewReader("vllm:num_requests_running{engine=\"0\",\nvllm:num_requests_running 3\n"),
			map[int]WorkerMetrics{noEngine: {Running: 3}}, false},
		{"bad label syntax", strings.NewReader("vllm:num_requests_running{engine=0} 1\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.5\n"),
			map[int]WorkerMetrics{0: {KVUsage: 0.5}}, false},
		{"timestamp, CRLF and indentation", strings.NewReader("  vllm:num_requests_running{engine=\"2\"} 4 1761320123000\r\n"),
			map[int]WorkerMetrics{2: {Running: 4}}, false},
		{"negative and non-numeric engine", strings.NewReader("vllm:num_requests_running{engine=\"-3\"} 1\nvllm:num_requests_running{engine=\"x\"} 2\n"),
			map[int]WorkerMetrics{noEngine: {Running: 3}}, false},
		{"bad num_gpu_blocks", strings.NewReader("vllm:cache_config_info{engine=\"0\",num_gpu_blocks=\"None\"} 1\n"),
			map[int]WorkerMetrics{0: {}}, false},
		{"line over 1 MiB", strings.NewReader("vllm:num_requests_running{model_name=\"" + strings.Repeat("m", 2<<20) + "\"} 1\n"), nil, true},
		{"read error", errReader{strings.NewReader("vllm:num_requests_running 1\n")}, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseWorkerMetrics(tc.body)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for k, w := range tc.want {
				if got[k] != w {
					t.Errorf("engine %d: %+v, want %+v", k, got[k], w)
				}
			}
		})
	}
}

func BenchmarkParseWorkerMetrics(b *testing.B) {
	body, err := os.ReadFile(vllmSampleFile)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseWorkerMetrics(bytes.NewReader(body)); err != nil {
			b.Fatal(err)
		}
	}
}

// A change of a worker's process_start_time_seconds between scrapes is a restart; the first
// sighting, an unchanged value and a scrape without the metric are not.
func TestScraperNoteStart(t *testing.T) {
	s := &Scraper{}
	for i, tc := range []struct {
		worker string
		start  float64
		want   bool
	}{
		{"a", 100, false}, // first sighting
		{"a", 100, false}, // unchanged
		{"a", 0, false},   // not exposed this time
		{"a", 100, false}, // unchanged since the last value
		{"b", 100, false}, // another worker's first sighting
		{"a", 250, true},  // restarted
		{"a", 250, false},
		{"b", 90, true}, // a clock step back is a change too
	} {
		if got := s.noteStart(tc.worker, tc.start); got != tc.want {
			t.Errorf("step %d: noteStart(%s, %v) = %v, want %v", i, tc.worker, tc.start, got, tc.want)
		}
	}
}
