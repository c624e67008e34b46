package sim

import (
	"sync"
	"sync/atomic"
	"time"
)

// simRequest is one completion request inside an engine. The engine goroutine owns every field
// above mu; the HTTP handler reads the output under mu.
type simRequest struct {
	id         string
	seq        seqState
	promptLen  int
	maxTokens  int // output cap (max_tokens or what the context leaves)
	stopAt     int // natural end of the filler output (EOS), 0 = none
	sessionID  string
	reportFull bool // vllm_xargs.kv_cache_report_mode == "full": re-announce prefix hits
	computed   int  // tokens whose KV is computed
	scheduled  bool
	cached     int // prompt tokens served from the prefix cache at first schedule
	arrival    time.Time
	// priority is the request's vLLM priority (smaller is earlier; 0 by default), which orders
	// it only under the priority scheduling policy.
	priority   int64
	simElapsed time.Duration // modelled time since admission
	simTTFT    time.Duration
	// engine-core timestamps (vLLM's QUEUED, first SCHEDULED, first and last NEW_TOKENS)
	queuedAt, scheduledAt, firstTokenAt, lastTokenAt time.Time
	cancelled                                        atomic.Bool

	notify chan struct{} // capacity 1: "new output or finished"

	mu       sync.Mutex
	out      []uint32 // generated token ids
	finished bool
	finish   string // finish_reason
	err      error  // engine failure (restart), reported mid-stream
}

func newSimRequest(id string) *simRequest {
	return &simRequest{id: id, notify: make(chan struct{}, 1), arrival: time.Now()}
}

func (r *simRequest) signal() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// snapshot returns the output generated so far and the end state.
func (r *simRequest) snapshot() (out []uint32, finished bool, finish string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out, r.finished, r.finish, r.err
}

// RequestRecord describes a finished request, for tests and benchmarks (Options.OnRequestDone).
type RequestRecord struct {
	ID           string
	DPRank       int
	PromptTokens int
	CachedTokens int
	OutputTokens int
	FinishReason string // "stop", "length", "abort" (client went away) or "error"
	// SimTTFT and SimE2E are the modelled durations (before dividing by Speedup).
	SimTTFT, SimE2E time.Duration
}
