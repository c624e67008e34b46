package sim

import (
	"math"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// pyBool renders a bool as Python's str(bool) does in vLLM's info labels.
func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

// simMetrics are the vLLM metrics a gateway scrapes, with vLLM's names and labels
// (model_name, engine = DP rank), on a registry owned by the worker.
type simMetrics struct {
	reg           *prometheus.Registry
	prefixQueries *prometheus.CounterVec
	prefixHits    *prometheus.CounterVec
	promptTokens  *prometheus.CounterVec
	genTokens     *prometheus.CounterVec
	preemptions   *prometheus.CounterVec
	success       *prometheus.CounterVec
	ttft          *prometheus.HistogramVec
	e2e           *prometheus.HistogramVec

	// engine-side intervals and sizes, observed per request at finish or per step
	queueTime, prefillTime, decodeTime, inferenceTime *prometheus.HistogramVec
	itl, tpot                                         *prometheus.HistogramVec
	iterationTokens, prefillKVComputed                *prometheus.HistogramVec
}

// buckets125 is vLLM's build_1_2_5_buckets(max): 1, 2, 5, 10, 20, 50, ... up to max.
func buckets125(limit int) []float64 {
	var out []float64
	for exp := 1.0; ; exp *= 10 {
		for _, m := range []float64{1, 2, 5} {
			v := m * exp
			if v > float64(limit) {
				return out
			}
			out = append(out, v)
		}
	}
}

func newSimMetrics(w *Worker) *simMetrics {
	labels := []string{"model_name", "engine"}
	histogram := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	}
	// vLLM's histogram buckets (vllm/v1/metrics/loggers.py, PrometheusStatLogger).
	ttftBuckets := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
		20, 40, 80, 160, 640, 2560}
	requestLatencyBuckets := []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60,
		120, 240, 480, 960, 1920, 7680}
	tokenLatencyBuckets := []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	iterationBuckets := []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}
	m := &simMetrics{
		reg: prometheus.NewRegistry(),
		prefixQueries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:prefix_cache_queries_total",
			Help: "Prefix cache queries, in terms of number of queried tokens."}, labels),
		prefixHits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:prefix_cache_hits_total",
			Help: "Prefix cache hits, in terms of number of cached tokens."}, labels),
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:prompt_tokens_total",
			Help: "Number of prefill tokens processed."}, labels),
		genTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:generation_tokens_total",
			Help: "Number of generation tokens processed."}, labels),
		preemptions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:num_preemptions_total",
			Help: "Cumulative number of preemption from the engine."}, labels),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
			Help: "Count of successfully processed requests."}, append(labels, "finished_reason")),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds",
			Help:    "Histogram of time to first token in seconds.",
			Buckets: ttftBuckets}, labels),
		e2e:           histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", requestLatencyBuckets),
		queueTime:     histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", requestLatencyBuckets),
		prefillTime:   histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", requestLatencyBuckets),
		decodeTime:    histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", requestLatencyBuckets),
		inferenceTime: histogram("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", requestLatencyBuckets),
		itl:           histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tokenLatencyBuckets),
		tpot: histogram("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
			tokenLatencyBuckets),
		iterationTokens: histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", iterationBuckets),
		prefillKVComputed: histogram("vllm:request_prefill_kv_computed_tokens",
			"Histogram of new KV tokens computed during prefill (excluding cached tokens).", buckets125(w.opts.MaxModelLen)),
	}
	m.reg.MustRegister(m.prefixQueries, m.prefixHits, m.promptTokens, m.genTokens, m.preemptions,
		m.success, m.ttft, m.e2e, m.queueTime, m.prefillTime, m.decodeTime, m.inferenceTime, m.itl, m.tpot,
		m.iterationTokens, m.prefillKVComputed)
	m.reg.MustRegister(cacheConfigInfo(w))
	// prometheus_client's process collector, which vLLM's /metrics includes: the gateway reads
	// a change of it as a restart.
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "process_start_time_seconds",
		Help: "Start time of the process since unix epoch in seconds."},
		func() float64 { return math.Float64frombits(w.started.Load()) }))
	for rank, e := range w.engines {
		cl := prometheus.Labels{"model_name": w.opts.ServedModelName, "engine": w.rankLabels[rank]}
		m.reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:num_requests_running", ConstLabels: cl,
				Help: "Number of requests in model execution batches."}, func() float64 { return float64(e.numRunning.Load()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:num_requests_waiting", ConstLabels: cl,
				Help: "Number of requests waiting to be processed."}, func() float64 { return float64(e.numWaiting.Load()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:kv_cache_usage_perc", ConstLabels: cl,
				Help: "KV-cache usage. 1 means 100 percent usage."}, e.usage),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:gpu_cache_usage_perc", ConstLabels: cl,
				Help: "GPU KV-cache usage (deprecated name). 1 means 100 percent usage."}, e.usage),
		)
		// Pre-create the counters so a scrape shows them at zero, as vLLM does.
		for _, c := range []*prometheus.CounterVec{m.prefixQueries, m.prefixHits, m.promptTokens, m.genTokens, m.preemptions} {
			c.With(cl)
		}
	}
	return m
}

// cacheConfigInfo is vLLM's vllm:cache_config_info: an info-style gauge fixed at 1 whose labels
// are the engine's CacheConfig fields rendered with Python's str() (CacheConfig.metrics_info()),
// plus "engine", one series per engine (DP rank) and no model_name label (vLLM's
// PrometheusStatLogger.log_metrics_info). Only the fields the simulator models are exported.
func cacheConfigInfo(w *Worker) *prometheus.GaugeVec {
	o := w.opts
	cpuBlocks := "None" // vLLM leaves num_cpu_blocks unset without a host tier
	if o.NumCPUBlocks > 0 {
		cpuBlocks = strconv.Itoa(o.NumCPUBlocks)
	}
	labels := prometheus.Labels{
		"block_size":            strconv.Itoa(o.BlockSize),
		"cache_dtype":           "auto",
		"enable_prefix_caching": pyBool(!o.DisablePrefixCaching),
		"is_attention_free":     pyBool(false),
		"num_cpu_blocks":        cpuBlocks,
		"num_gpu_blocks":        strconv.Itoa(o.NumGPUBlocks),
		"sliding_window":        "None",
	}
	names := make([]string, 0, len(labels)+1)
	for k := range labels {
		names = append(names, k)
	}
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:cache_config_info",
		Help: "Information of the LLMEngine CacheConfig"}, append(names, "engine"))
	for _, rank := range w.rankLabels {
		labels["engine"] = rank
		info.With(labels).Set(1)
	}
	return info
}
