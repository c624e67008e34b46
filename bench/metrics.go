package bench

import (
	"math"
	"sort"
	"time"
)

// Stat is one metric's distribution, with aiperf's field names.
type Stat struct {
	Unit  string  `json:"unit"`
	Avg   float64 `json:"avg"`
	Min   float64 `json:"min"`
	Max   float64 `json:"max"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Std   float64 `json:"std"`
	Count int     `json:"count"`
}

// newStat summarises values (linear-interpolated percentiles, as numpy and aiperf compute them).
func newStat(unit string, vals []float64) Stat {
	s := Stat{Unit: unit, Count: len(vals)}
	if len(vals) == 0 {
		return s
	}
	v := append([]float64(nil), vals...)
	sort.Float64s(v)
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	s.Avg = sum / float64(len(v))
	s.Min, s.Max = v[0], v[len(v)-1]
	s.P50, s.P90, s.P99 = percentile(v, 50), percentile(v, 90), percentile(v, 99)
	ss := 0.0
	for _, x := range v {
		ss += (x - s.Avg) * (x - s.Avg)
	}
	if len(v) > 1 {
		s.Std = math.Sqrt(ss / float64(len(v)-1)) // sample standard deviation, as aiperf
	}
	return s
}

// percentile of sorted values with linear interpolation between closest ranks.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 1 {
		return sorted[0]
	}
	pos := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

// Summary is a run's result in aiperf's metric names (profile_export_aiperf.json style) plus
// kvbench's routing metrics.
type Summary struct {
	Schema      string      `json:"schema"`
	Label       string      `json:"label"`
	InputConfig InputConfig `json:"input_config"`

	TimeToFirstToken      Stat `json:"time_to_first_token"`
	InterTokenLatency     Stat `json:"inter_token_latency"`
	RequestLatency        Stat `json:"request_latency"`
	OutputTokenThroughput Stat `json:"output_token_throughput"`
	RequestThroughput     Stat `json:"request_throughput"`
	InputSequenceLength   Stat `json:"input_sequence_length"`
	OutputSequenceLength  Stat `json:"output_sequence_length"`

	// RequestCount counts successful requests (aiperf's request_count); ErrorCount the failed.
	RequestCount int `json:"request_count"`
	ErrorCount   int `json:"error_count"`
	// CachedTokenRatio = Σ usage.prompt_tokens_details.cached_tokens / Σ usage.prompt_tokens.
	CachedTokenRatio                float64 `json:"cached_token_ratio"`
	TotalUsagePromptTokens          int     `json:"total_usage_prompt_tokens"`
	TotalUsagePromptCacheReadTokens int     `json:"total_usage_prompt_cache_read_tokens"`
	TheoreticalPrefixCacheHit       float64 `json:"theoretical_prefix_cache_hit"`
	// TheoreticalCacheableTokens is Σ min(theoretical hit blocks × block size, prompt tokens)
	// over the successful requests with usage and trace blocks: the prompt tokens an infinite
	// cache on a single worker could have served. CapturedCacheFraction is the cached tokens
	// the workers reported for those same requests divided by it (0 when it is 0): how much of
	// the achievable reuse the fleet and its routing actually got.
	TheoreticalCacheableTokens int     `json:"theoretical_cacheable_tokens"`
	CapturedCacheFraction      float64 `json:"captured_cache_fraction"`
	// CapacityCacheableTokens is the same sum over the pooled-LRU hit (kvbench
	// --capacity-blocks), and CapturedOfCapacity the cached tokens divided by it: how close the
	// run came to a fleet that is one LRU cache of the same total size. Both 0 without a capacity.
	CapacityCacheableTokens int     `json:"capacity_cacheable_tokens,omitempty"`
	CapturedOfCapacity      float64 `json:"captured_of_capacity,omitempty"`
	// OptimalCacheableTokens is the same sum over the clairvoyant cache's hit (one cache of the
	// same size evicting the block wanted last, Belady's MIN), and CapturedOfOptimal the cached
	// tokens divided by it. Between it and the pooled LRU's lies what least-recently-used
	// eviction loses, which routing cannot win back. Both 0 without a capacity.
	OptimalCacheableTokens int     `json:"optimal_cacheable_tokens,omitempty"`
	CapturedOfOptimal      float64 `json:"captured_of_optimal,omitempty"`
	// Missed splits the theoretical hit the workers did not report (theoretical cacheable
	// minus cached, per request, when positive) by where the request went; nil unless every
	// request counted names its worker.
	Missed            *MissedCache `json:"missed_cache,omitempty"`
	BenchmarkDuration float64      `json:"benchmark_duration"`
	// RunDuration is the run's wall time in seconds, from its start to the end of its last
	// request, failed ones included: the time the offered work took, over which goodput is
	// counted.
	RunDuration float64 `json:"run_duration"`
	// GoodRequestCount counts the successful requests whose TTFT was under
	// InputConfig.GoodputTTFTMS, and Goodput is that count per second of RunDuration (issue 33's
	// "requests per second finishing with TTFT under 2 s"). A rejected or failed request is never
	// good. Both 0 when the run had no TTFT limit.
	GoodRequestCount int     `json:"good_request_count"`
	Goodput          float64 `json:"goodput"`
	// OldestRequestAgeMS is the longest any request waited for its answer to begin: its TTFT
	// when it succeeded, the time to its error otherwise (a gateway's 429 or 503, a timeout).
	OldestRequestAgeMS float64        `json:"oldest_request_age_ms"`
	ErrorSummary       map[string]int `json:"error_summary"`
	WorkerDistribution map[string]int `json:"worker_distribution"`
	ContextResets      int            `json:"context_resets"`
}

// MissedCache is the theoretical hit a run missed, in prompt tokens, by where each request
// went: to the worker its conversation's previous turn went to (the prefix was evicted there,
// or never reused: capacity and queueing), to another worker (a routing move), or as a
// conversation's first turn (its shared prefix, a system prompt or a parent's context, was
// not cached where it went). Each is also given as a fraction of the theoretical cacheable
// tokens, so captured + the three fractions = 1 (when no request reused more than its
// theoretical hit).
type MissedCache struct {
	// The missed prompt tokens: same worker, moved, first turn.
	SameWorkerTokens int `json:"same_worker_tokens"`
	MovedTokens      int `json:"moved_tokens"`
	FirstTurnTokens  int `json:"first_turn_tokens"`
	// The same as fractions of the theoretical cacheable tokens.
	SameWorkerFraction float64 `json:"same_worker_fraction"`
	MovedFraction      float64 `json:"moved_fraction"`
	FirstTurnFraction  float64 `json:"first_turn_fraction"`
}

// or is the split, or a zero one when there is none.
func (m *MissedCache) or() MissedCache {
	if m == nil {
		return MissedCache{}
	}
	return *m
}

// missedCache splits the theoretical hit the counted records (successful, with usage and
// trace blocks) missed by where each went against its conversation's previous turn; nil when
// one of them names no worker, or nothing was cacheable.
func missedCache(recs []Record, blockSize, cacheable int) *MissedCache {
	if cacheable <= 0 || blockSize <= 0 {
		return nil
	}
	idx := make([]int, 0, len(recs))
	for i := range recs {
		r := &recs[i]
		if r.OK() && r.HasUsage && r.TraceBlocks > 0 {
			if r.Worker == "" {
				return nil
			}
			idx = append(idx, i)
		}
	}
	// A conversation's turns in order; its previous turn is the last counted one before.
	sort.SliceStable(idx, func(a, b int) bool {
		ra, rb := &recs[idx[a]], &recs[idx[b]]
		if ra.ConversationID != rb.ConversationID {
			return ra.ConversationID < rb.ConversationID
		}
		return ra.TurnIndex < rb.TurnIndex
	})
	m := &MissedCache{}
	prev := map[string]string{} // conversation → worker of its last counted turn
	for _, i := range idx {
		r := &recs[i]
		missed := max(min(r.TheoreticalHit*blockSize, r.PromptTokens)-r.CachedTokens, 0)
		switch w, ok := prev[r.ConversationID]; {
		case !ok:
			m.FirstTurnTokens += missed
		case w == r.Worker:
			m.SameWorkerTokens += missed
		default:
			m.MovedTokens += missed
		}
		prev[r.ConversationID] = r.Worker
	}
	c := float64(cacheable)
	m.SameWorkerFraction = float64(m.SameWorkerTokens) / c
	m.MovedFraction = float64(m.MovedTokens) / c
	m.FirstTurnFraction = float64(m.FirstTurnTokens) / c
	return m
}

// InputConfig records how the run was made.
type InputConfig struct {
	URL            string  `json:"url"`
	Model          string  `json:"model"`
	Trace          string  `json:"trace"`
	Format         Format  `json:"format"`
	API            API     `json:"api,omitempty"`
	BlockSize      int     `json:"block_size"`
	Mode           Mode    `json:"mode"`
	Concurrency    int     `json:"concurrency,omitempty"`
	RequestRate    float64 `json:"request_rate,omitempty"`
	TimeScale      float64 `json:"time_scale"`
	MaxRequests    int     `json:"max_requests,omitempty"`
	SessionHeaders string  `json:"session_headers"`
	Policy         string  `json:"policy,omitempty"`
	// Repeat is kvbench --repeat: the independent users of the trace the run replayed (0 in
	// summaries written before it was recorded).
	Repeat int `json:"repeat,omitempty"`
	// GoodputTTFTMS is the TTFT under which a successful request counts towards goodput, in ms
	// (kvbench --goodput-ttft; 0 = no goodput).
	GoodputTTFTMS float64 `json:"goodput_ttft_ms,omitempty"`
	// OfferedRequestRate is the requests per second the schedule asks for if every answer were
	// instant (fixed mode: the requests sent over the trace's scaled zero-latency span,
	// Trace.Span); closed-loop sessions send slower when answers take time. 0 when unknown.
	OfferedRequestRate float64 `json:"offered_request_rate,omitempty"`
}

// SchemaVersion tags kvbench summaries.
const SchemaVersion = "kvbench/1"

// Summarize computes the run metrics from the records. Run-level throughputs have avg = total /
// benchmark duration (aiperf's definition); their min..p99 are over one-second time slices (fewer
// when the run is short), which aiperf reports with --slice-duration.
func Summarize(label string, cfg InputConfig, res *Result) *Summary {
	s := &Summary{Schema: SchemaVersion, Label: label, InputConfig: cfg, ContextResets: res.Resets,
		ErrorSummary: map[string]int{}, WorkerDistribution: map[string]int{}}
	var ttft, itl, lat, isl, osl []float64
	first, last := time.Duration(math.MaxInt64), time.Duration(0)
	totalOut, hit, blocks, capturedCached := 0, 0, 0, 0
	limit := time.Duration(cfg.GoodputTTFTMS * float64(time.Millisecond))
	var end time.Duration // the end of the last request, failed ones included
	for i := range res.Records {
		r := &res.Records[i]
		hit += r.TheoreticalHit
		blocks += r.TraceBlocks
		end = max(end, r.StartOffset+r.Latency)
		if r.Worker != "" {
			s.WorkerDistribution[r.Worker]++
		}
		if !r.OK() {
			s.ErrorCount++
			s.ErrorSummary[r.ErrorKind]++
			s.OldestRequestAgeMS = max(s.OldestRequestAgeMS, ms(r.Latency))
			continue
		}
		s.RequestCount++
		s.OldestRequestAgeMS = max(s.OldestRequestAgeMS, ms(r.TTFT))
		if limit > 0 && r.TTFT < limit {
			s.GoodRequestCount++
		}
		first = min(first, r.StartOffset)
		last = max(last, r.StartOffset+r.Latency)
		ttft = append(ttft, ms(r.TTFT))
		lat = append(lat, ms(r.Latency))
		if v, ok := r.ITL(); ok {
			itl = append(itl, ms(v))
		}
		osl = append(osl, float64(r.OutputTokens))
		totalOut += r.OutputTokens
		if r.HasUsage {
			isl = append(isl, float64(r.PromptTokens))
			s.TotalUsagePromptTokens += r.PromptTokens
			s.TotalUsagePromptCacheReadTokens += r.CachedTokens
			if r.TraceBlocks > 0 && cfg.BlockSize > 0 {
				s.TheoreticalCacheableTokens += min(r.TheoreticalHit*cfg.BlockSize, r.PromptTokens)
				s.CapacityCacheableTokens += min(r.CapacityHit*cfg.BlockSize, r.PromptTokens)
				s.OptimalCacheableTokens += min(r.OptimalHit*cfg.BlockSize, r.PromptTokens)
				capturedCached += r.CachedTokens
			}
		}
	}
	s.TimeToFirstToken = newStat("ms", ttft)
	s.InterTokenLatency = newStat("ms", itl)
	s.RequestLatency = newStat("ms", lat)
	s.InputSequenceLength = newStat("tokens", isl)
	s.OutputSequenceLength = newStat("tokens", osl)
	if s.TotalUsagePromptTokens > 0 {
		s.CachedTokenRatio = float64(s.TotalUsagePromptCacheReadTokens) / float64(s.TotalUsagePromptTokens)
	}
	if blocks > 0 {
		s.TheoreticalPrefixCacheHit = float64(hit) / float64(blocks)
	}
	if s.TheoreticalCacheableTokens > 0 {
		s.CapturedCacheFraction = float64(capturedCached) / float64(s.TheoreticalCacheableTokens)
	}
	if s.CapacityCacheableTokens > 0 {
		s.CapturedOfCapacity = float64(capturedCached) / float64(s.CapacityCacheableTokens)
	}
	if s.OptimalCacheableTokens > 0 {
		s.CapturedOfOptimal = float64(capturedCached) / float64(s.OptimalCacheableTokens)
	}
	s.Missed = missedCache(res.Records, cfg.BlockSize, s.TheoreticalCacheableTokens)
	s.RunDuration = end.Seconds()
	if s.RunDuration > 0 {
		s.Goodput = float64(s.GoodRequestCount) / s.RunDuration
	}
	s.OutputTokenThroughput = Stat{Unit: "tokens/sec"}
	s.RequestThroughput = Stat{Unit: "requests/sec"}
	if s.RequestCount > 0 && last > first {
		dur := last - first
		s.BenchmarkDuration = dur.Seconds()
		s.OutputTokenThroughput = sliceStat("tokens/sec", res.Records, first, dur, float64(totalOut)/dur.Seconds(),
			func(r *Record) float64 { return float64(r.OutputTokens) })
		s.RequestThroughput = sliceStat("requests/sec", res.Records, first, dur, float64(s.RequestCount)/dur.Seconds(),
			func(r *Record) float64 { return 1 })
	}
	return s
}

// sliceStat buckets successful requests by completion time into equal slices (1 s, at most 200,
// at least 1) and summarises the per-slice rates; avg is the whole-run rate.
func sliceStat(unit string, recs []Record, first, dur time.Duration, avg float64, weight func(*Record) float64) Stat {
	slice := time.Second
	if dur/slice > 200 {
		slice = dur / 200
	}
	n := int(dur / slice)
	if n < 1 {
		n, slice = 1, dur
	}
	buckets := make([]float64, n)
	for i := range recs {
		r := &recs[i]
		if !r.OK() {
			continue
		}
		b := int((r.StartOffset + r.Latency - first) / slice)
		buckets[min(max(b, 0), n-1)] += weight(r)
	}
	// The last slice also absorbs the remainder of the run, so rate it over its real length.
	rates := make([]float64, n)
	for i, v := range buckets {
		l := slice
		if i == n-1 {
			l = dur - slice*time.Duration(n-1)
		}
		rates[i] = v / l.Seconds()
	}
	st := newStat(unit, rates)
	st.Avg = avg
	return st
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
