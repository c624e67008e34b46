package router

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Usage is what a worker reported about a request's prompt (the OpenAI usage object).
type Usage struct {
	PromptTokens int // usage.prompt_tokens
	// CachedTokens is usage.prompt_tokens_details.cached_tokens; HasCached says whether the
	// worker reported it at all (vLLM needs --enable-prompt-tokens-details).
	CachedTokens int
	HasCached    bool
}

// Observe closes the loop on one routed request: it compares the worker's usage with the
// gateway's own prompt token count (a mismatch means the gateway renders or tokenizes
// differently from that worker) and with the cache the decision predicted on the chosen
// target. Both go to metrics; the first few mismatches are logged with the model name.
func (e *Dispatcher) Observe(model string, req *Request, d Decision, u Usage) {
	e.feedback.observe(model, req, d, u)
}

// feedback holds the dispatcher's metrics and the mismatch log limiter.
type feedback struct {
	log        *slog.Logger
	burst      int
	every      time.Duration
	mu         sync.Mutex
	logged     int
	lastLog    time.Time
	suppressed int

	decisions   *prometheus.HistogramVec
	reports     *prometheus.CounterVec
	mismatches  *prometheus.CounterVec
	tokenDelta  *prometheus.HistogramVec
	predError   *prometheus.HistogramVec
	predicted   *prometheus.CounterVec
	actual      *prometheus.CounterVec
	unpredicted *prometheus.CounterVec
}

// signedBuckets returns symmetric buckets for signed token differences.
func signedBuckets() []float64 {
	return []float64{-4096, -1024, -256, -64, -16, -1, 0, 1, 16, 64, 256, 1024, 4096}
}

func newFeedback(reg prometheus.Registerer, log *slog.Logger, burst int, every time.Duration) (*feedback, error) {
	if burst <= 0 {
		burst = 5
	}
	if every <= 0 {
		every = time.Minute
	}
	f := &feedback{
		log: log, burst: burst, every: every,
		decisions: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_router_decision_seconds",
			Help:    "Time to choose a target (match, score, pick), excluding tokenization.",
			Buckets: []float64{5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2},
		}, []string{"policy"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_router_usage_reports_total",
			Help: "Worker usage reports compared with the gateway's prediction, by model and scoring mode.",
		}, []string{"model", "mode"}),
		mismatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_router_prompt_token_mismatches_total",
			Help: "Requests whose worker-reported prompt_tokens differ from the gateway's own count: the gateway's chat template or tokenizer differs from the worker's.",
		}, []string{"model"}),
		tokenDelta: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_router_prompt_token_delta",
			Help:    "Worker prompt_tokens minus the gateway's count, for mismatched requests.",
			Buckets: signedBuckets(),
		}, []string{"model"}),
		predError: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_router_cached_tokens_prediction_error",
			Help:    "Worker-reported cached_tokens minus the gateway's prediction for the chosen target (negative: the gateway expected more cache than the worker had).",
			Buckets: signedBuckets(),
		}, []string{"model", "mode"}),
		predicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_router_cached_tokens_predicted_total",
			Help: "Cached prompt tokens the gateway predicted on the chosen targets.",
		}, []string{"model", "mode"}),
		actual: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_router_cached_tokens_reported_total",
			Help: "Cached prompt tokens the workers reported (usage.prompt_tokens_details.cached_tokens).",
		}, []string{"model", "mode"}),
		unpredicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_router_usage_without_cached_tokens_total",
			Help: "Worker usage reports without prompt_tokens_details.cached_tokens (enable --enable-prompt-tokens-details on vLLM).",
		}, []string{"model"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{f.decisions, f.reports, f.mismatches, f.tokenDelta,
			f.predError, f.predicted, f.actual, f.unpredicted} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register router metrics: %w", err)
			}
		}
	}
	return f, nil
}

func (f *feedback) decided(policy string, d time.Duration) {
	f.decisions.WithLabelValues(policy).Observe(d.Seconds())
}

// PredictedCachedTokens is what a worker should report as cached_tokens if the prediction is
// right: the chosen target's G1 blocks in tokens, capped because vLLM always recomputes at
// least the prompt's last token, so at most the full blocks within the first prompt−1 tokens
// count as hits.
func PredictedCachedTokens(g1Blocks, blockSize, promptTokens int) int {
	if blockSize <= 0 || promptTokens <= 0 {
		return 0
	}
	return min(g1Blocks*blockSize, (promptTokens-1)/blockSize*blockSize)
}

func (f *feedback) observe(model string, req *Request, d Decision, u Usage) {
	if u.PromptTokens > 0 && req.PromptTokens > 0 && u.PromptTokens != req.PromptTokens {
		f.mismatches.WithLabelValues(model).Inc()
		f.tokenDelta.WithLabelValues(model).Observe(float64(u.PromptTokens - req.PromptTokens))
		f.logMismatch(model, req.PromptTokens, u.PromptTokens)
	}
	if !u.HasCached {
		f.unpredicted.WithLabelValues(model).Inc()
		return
	}
	row, _ := ChosenScore(d)
	mode := row.Mode
	if mode == "" {
		mode = "none"
	}
	pred := PredictedCachedTokens(row.G1Blocks, blockSizeOf(req), req.PromptTokens)
	f.reports.WithLabelValues(model, mode).Inc()
	f.predicted.WithLabelValues(model, mode).Add(float64(pred))
	f.actual.WithLabelValues(model, mode).Add(float64(u.CachedTokens))
	f.predError.WithLabelValues(model, mode).Observe(float64(u.CachedTokens - pred))
}

// logMismatch logs the first burst mismatches, then at most one line per interval carrying the
// number suppressed in between.
func (f *feedback) logMismatch(model string, gateway, worker int) {
	f.mu.Lock()
	now := time.Now()
	logIt := f.logged < f.burst || now.Sub(f.lastLog) >= f.every
	suppressed := 0
	if logIt {
		f.logged++
		f.lastLog = now
		suppressed, f.suppressed = f.suppressed, 0
	} else {
		f.suppressed++
	}
	f.mu.Unlock()
	if logIt {
		f.log.Warn("router: worker counted a different number of prompt tokens than the gateway; the gateway's chat template or tokenizer differs from the worker's",
			"model", model, "gateway_prompt_tokens", gateway, "worker_prompt_tokens", worker,
			"suppressed_since_last", suppressed)
	}
}
