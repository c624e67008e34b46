package router

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/workers"
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
				got, ok := lt.Metrics(workers.Target{Worker: "http://w", DPRank: r}, time.Minute)
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
	targets := []workers.Target{{Worker: srv.URL, DPRank: 0}, {Worker: srv.URL, DPRank: 1}, {Worker: dead.URL}}
	s := &Scraper{Tracker: lt, Interval: time.Second, Targets: func() []workers.Target { return targets }}
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
