package router

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// LoadTracker is the gateway's own view of the load on each target, Dynamo-style
// (after Dynamo's ActiveSequences, lib/kv-router/src/sequences): prompt tokens in flight until each request's first token, and the KV
// blocks each request holds until it ends, with blocks shared by concurrent requests on the same
// target counted once. It is corrected by the workers' own /metrics (UpdateMetrics). Safe for
// concurrent use; reads for scoring take no global lock.
type LoadTracker struct {
	mu      sync.RWMutex
	targets map[kvkey.Target]*targetLoad
	expiry  time.Duration
	now     func() time.Time
	pub     atomic.Pointer[loadPub]            // the fleet's load sync, when clustered (SetPublisher)
	changed atomic.Pointer[func(kvkey.Target)] // hears capacity freeing (OnChange)
}

// OnChange makes f hear every change that may free capacity on a target: a first token, a
// finished request, a fresh metrics report. f runs on the caller's goroutine with no lock of
// the tracker held and must not block (flow control only wakes its dispatcher).
func (lt *LoadTracker) OnChange(f func(kvkey.Target)) {
	lt.changed.Store(&f)
}

func (lt *LoadTracker) notify(t kvkey.Target) {
	if f := lt.changed.Load(); f != nil {
		(*f)(t)
	}
}

// loadPub boxes a LoadPublisher for an atomic pointer.
type loadPub struct{ p LoadPublisher }

// SetPublisher makes every later change of the tracker's counters also go to p as a signed
// increment (nil stops it). A cluster of replicas shares its load this way.
func (lt *LoadTracker) SetPublisher(p LoadPublisher) {
	if p == nil {
		lt.pub.Store(nil)
		return
	}
	lt.pub.Store(&loadPub{p})
}

func (lt *LoadTracker) publish(t kvkey.Target, d LoadVector) {
	if b := lt.pub.Load(); b != nil {
		b.p.LoadDelta(t, d)
	}
}

// targetLoad is one target's load. Counters are atomics so scoring reads them without locks;
// the block refcounts and the live-handle set sit behind mu.
type targetLoad struct {
	prefillTokens   atomic.Int64
	prefillRequests atomic.Int64
	requests        atomic.Int64
	uniqueBlocks    atomic.Int64
	metrics         atomic.Pointer[WorkerMetrics]
	// released and finished count, since the target was first seen, the blocks that stopped
	// being held and the requests that ended. A metrics sample remembers both at scrape time,
	// so scoring can take off what ended after the sample instead of trusting a stale report.
	released atomic.Int64
	finished atomic.Int64
	// begun and firstTokens count the requests accounted and those past their first token,
	// so that a scraped waiting count can be moved forward by what happened since (waitingNow).
	begun       atomic.Int64
	firstTokens atomic.Int64

	mu     sync.RWMutex
	blocks map[kvkey.BlockHash]int32 // refcount per keyed sequence hash of active prompts (load_blocks.go)
	live   map[*Handle]struct{}
}

// WorkerMetrics is what a worker's /metrics said about one target at one moment.
type WorkerMetrics struct {
	Running      float64 // vllm:num_requests_running
	Waiting      float64 // vllm:num_requests_waiting
	KVUsage      float64 // vllm:kv_cache_usage_perc, a fraction 0..1
	NumGPUBlocks int     // vllm:cache_config_info{num_gpu_blocks}; 0 when unknown
	// StartTime is the worker process's process_start_time_seconds (0 when not exposed, e.g.
	// vLLM with --api-server-count > 1); a change means the worker restarted.
	StartTime float64
	// Timing holds the worker's cumulative timing histograms' sums and counts.
	Timing WorkerTiming
	At     time.Time // when it was scraped

	mark metricsMark // the target's released/finished counters when the scrape was sent
}

// WorkerTiming is the _sum and _count of vLLM's timing histograms (vllm/v1/metrics/loggers.py,
// PrometheusStatLogger): cumulative, so the difference of two readings is a window.
type WorkerTiming struct {
	TTFTSum, TTFTCount       float64 // vllm:time_to_first_token_seconds (arrival to first token)
	PrefillSum, PrefillCount float64 // vllm:request_prefill_time_seconds (first scheduled to first token; at finish)
	IterTokensSum            float64 // vllm:iteration_tokens_total: tokens per engine step
	Iterations               float64
	// ITLSum, ITLCount: vllm:inter_token_latency_seconds, one observation per output token
	// after the first (the time of the step that produced it).
	ITLSum, ITLCount float64
	// TPOTSum, TPOTCount: vllm:time_per_output_token_seconds, the same observations under
	// their deprecated name (older vLLM, or shown with --show-hidden-metrics-for-version).
	TPOTSum, TPOTCount float64
	// ComputedSum, ComputedCount: vllm:request_prefill_kv_computed_tokens, each finished
	// request's prefill tokens not found in the prefix cache (observed with the prefill time).
	ComputedSum, ComputedCount float64
}

// scaled is t with every figure times f (a worker total split over its ranks).
func (t WorkerTiming) scaled(f float64) WorkerTiming {
	return WorkerTiming{t.TTFTSum * f, t.TTFTCount * f, t.PrefillSum * f, t.PrefillCount * f, t.IterTokensSum * f, t.Iterations * f,
		t.ITLSum * f, t.ITLCount * f, t.TPOTSum * f, t.TPOTCount * f, t.ComputedSum * f, t.ComputedCount * f}
}

// metricsMark is a target's released-blocks and finished-requests counters at one moment.
type metricsMark struct {
	released, finished int64
	begun, firstTokens int64
	set                bool
}

// mark reads t's counters; a scrape takes it before asking the worker, so that whatever ends
// while the request is in flight is discounted from the (then already stale) report.
func (lt *LoadTracker) mark(t kvkey.Target) metricsMark {
	tl := lt.getOrCreate(t)
	return metricsMark{released: tl.released.Load(), finished: tl.finished.Load(),
		begun: tl.begun.Load(), firstTokens: tl.firstTokens.Load(), set: true}
}

// TargetLoad is a snapshot of one target's load as the gateway accounts it.
type TargetLoad struct {
	PrefillTokens   int // prompt tokens sent and not yet answered by a first token
	PrefillRequests int // requests still before their first token
	Requests        int // active requests
	ActiveBlocks    int // distinct prompt blocks held by active requests
}

// Handle is one request's load on one target. Call FirstToken when the first token arrives
// and Done when the request ends for any reason (finished, cancelled, failed); both are
// idempotent and safe to call concurrently, and Done without FirstToken releases everything.
type Handle struct {
	lt      *LoadTracker
	tl      *targetLoad
	target  kvkey.Target
	prefill int64
	hashes  []kvkey.BlockHash
	started time.Time
	stage   atomic.Int32 // stagePrefill → stageDecode → stageDone
	exp     expirer      // told when Expire force-releases the handle (guarded by tl.mu)
}

// expirer is state kept beside a handle (the kv policy's TTFT observation) that must end when
// Expire force-releases it, so that one sweep bounds both.
type expirer interface{ expired() }

// attach makes x hear if Expire force-releases h.
func (h *Handle) attach(x expirer) {
	h.tl.mu.Lock()
	h.exp = x
	h.tl.mu.Unlock()
}

const (
	stagePrefill int32 = iota
	stageDecode
	stageDone
)

// NewLoadTracker returns a tracker that force-releases handles older than expiry (see
// KVConfig.LoadExpiry) when Expire runs.
func NewLoadTracker(expiry time.Duration) *LoadTracker {
	return &LoadTracker{targets: make(map[kvkey.Target]*targetLoad), expiry: expiry, now: time.Now}
}

func (lt *LoadTracker) get(t kvkey.Target) *targetLoad {
	lt.mu.RLock()
	tl := lt.targets[t]
	lt.mu.RUnlock()
	return tl
}

func (lt *LoadTracker) getOrCreate(t kvkey.Target) *targetLoad {
	if tl := lt.get(t); tl != nil {
		return tl
	}
	lt.mu.Lock()
	defer lt.mu.Unlock()
	tl := lt.targets[t]
	if tl == nil {
		tl = &targetLoad{blocks: make(map[kvkey.BlockHash]int32), live: make(map[*Handle]struct{})}
		lt.targets[t] = tl
	}
	return tl
}

// Begin accounts a request routed to t: its prompt tokens not expected to be cached
// (prompt − cachedBlocks×block size) as prefill in flight, and its prompt blocks as held. The
// handle keeps req.BlockHashes until Done; the caller must not modify that slice meanwhile.
func (lt *LoadTracker) Begin(t kvkey.Target, req *Request, cachedBlocks int) *Handle {
	tl := lt.getOrCreate(t)
	prefill := int64(req.PromptTokens - cachedBlocks*blockSizeOf(req))
	if prefill < 0 {
		prefill = 0
	}
	h := &Handle{lt: lt, tl: tl, target: t, prefill: prefill, hashes: req.BlockHashes, started: lt.now()}
	added := int64(0)
	tl.mu.Lock()
	for k, n := 0, len(h.hashes); k < heldKeys(n); k++ {
		p := heldPos(k, n)
		b := h.hashes[p]
		if tl.blocks[b]++; tl.blocks[b] == 1 {
			w := heldWeight(p)
			tl.uniqueBlocks.Add(w)
			added += w
		}
	}
	tl.live[h] = struct{}{}
	tl.mu.Unlock()
	tl.prefillTokens.Add(prefill)
	tl.prefillRequests.Add(1)
	tl.requests.Add(1)
	tl.begun.Add(1)
	lt.publish(t, LoadVector{Requests: 1, PrefillRequests: 1, PrefillTokens: prefill, Blocks: added})
	return h
}

// Target is the target the handle's load is accounted on.
func (h *Handle) Target() kvkey.Target { return h.target }

// FirstToken moves the request from prefill to decode: its prompt tokens stop counting as
// prefill in flight; its blocks stay held until Done.
func (h *Handle) FirstToken() {
	if h.stage.CompareAndSwap(stagePrefill, stageDecode) {
		h.tl.prefillTokens.Add(-h.prefill)
		h.tl.prefillRequests.Add(-1)
		h.tl.firstTokens.Add(1)
		h.lt.publish(h.target, LoadVector{PrefillRequests: -1, PrefillTokens: -h.prefill})
		h.lt.notify(h.target)
	}
}

// Done releases everything the request still holds.
func (h *Handle) Done() { h.release() }

// release is Done, reporting whether this call released the handle (false: it was done).
func (h *Handle) release() bool {
	var d LoadVector
	for {
		s := h.stage.Load()
		if s == stageDone {
			return false
		}
		if h.stage.CompareAndSwap(s, stageDone) {
			if s == stagePrefill {
				h.tl.prefillTokens.Add(-h.prefill)
				h.tl.prefillRequests.Add(-1)
				h.tl.firstTokens.Add(1) // out of the worker's queue either way
				d.PrefillRequests, d.PrefillTokens = -1, -h.prefill
			}
			break
		}
	}
	tl := h.tl
	tl.mu.Lock()
	for k, n := 0, len(h.hashes); k < heldKeys(n); k++ {
		p := heldPos(k, n)
		if b := h.hashes[p]; tl.blocks[b] > 1 {
			tl.blocks[b]--
		} else {
			delete(tl.blocks, b)
			w := heldWeight(p)
			tl.uniqueBlocks.Add(-w)
			tl.released.Add(w)
			d.Blocks -= w
		}
	}
	delete(tl.live, h)
	tl.mu.Unlock()
	tl.requests.Add(-1)
	tl.finished.Add(1)
	d.Requests = -1
	h.lt.publish(h.target, d)
	h.lt.notify(h.target)
	return true
}

// Load returns the gateway's accounting of t (zero for a target never seen).
func (lt *LoadTracker) Load(t kvkey.Target) TargetLoad {
	tl := lt.get(t)
	if tl == nil {
		return TargetLoad{}
	}
	return tl.snapshot()
}

func (tl *targetLoad) snapshot() TargetLoad {
	return TargetLoad{
		PrefillTokens:   int(tl.prefillTokens.Load()),
		PrefillRequests: int(tl.prefillRequests.Load()),
		Requests:        int(tl.requests.Load()),
		ActiveBlocks:    int(tl.uniqueBlocks.Load()),
	}
}

// withPeers is l with the peer replicas' load added.
func (l TargetLoad) withPeers(pv LoadVector) TargetLoad {
	l.PrefillTokens += int(pv.PrefillTokens)
	l.PrefillRequests += int(pv.PrefillRequests)
	l.Requests += int(pv.Requests)
	l.ActiveBlocks += int(pv.Blocks)
	return l
}

// sharedActive returns how many leading blocks of hashes are already held by active requests
// on the target (to within heldStride−1 beyond the first heldExact: load_blocks.go). The held
// set is prefix-closed (each request holds its whole chain, and a chained hash names its whole
// prefix), so membership is monotone along the chain's keys and a binary search needs only
// log2(keys) lookups.
func (tl *targetLoad) sharedActive(hashes []kvkey.BlockHash) int {
	if tl.uniqueBlocks.Load() == 0 || len(hashes) == 0 {
		return 0
	}
	tl.mu.RLock()
	defer tl.mu.RUnlock()
	n := len(hashes)
	keys := heldKeys(n)
	switch {
	case tl.blocks[hashes[0]] == 0: // the common unrelated prompt: one lookup
		return 0
	case tl.blocks[hashes[n-1]] != 0: // the whole prompt is already held
		return n
	}
	k := 1 + sort.Search(keys-2, func(i int) bool { return tl.blocks[hashes[heldPos(i+1, n)]] == 0 })
	return heldPos(k-1, n) + 1
}

// UpdateMetrics records a worker's own report for target t; scoring uses it while it is fresh.
func (lt *LoadTracker) UpdateMetrics(t kvkey.Target, m WorkerMetrics) {
	if m.At.IsZero() {
		m.At = lt.now()
	}
	if !m.mark.set {
		m.mark = lt.mark(t)
	}
	lt.getOrCreate(t).metrics.Store(&m)
	lt.notify(t)
}

// sinceSample returns the worker's report with what the gateway saw end after it was taken
// (blocks released, requests finished) taken off: a report scraped mid-request must not keep a
// target looking loaded once that request is over.
func (tl *targetLoad) sinceSample(m WorkerMetrics) (activeBlocks, requests float64) {
	activeBlocks = m.KVUsage*float64(m.NumGPUBlocks) - float64(tl.released.Load()-m.mark.released)
	requests = m.Running + m.Waiting - float64(tl.finished.Load()-m.mark.finished)
	return max(activeBlocks, 0), max(requests, 0)
}

// waitingNow is the worker's reported waiting requests moved forward to now: plus the
// requests the gateway sent there since the scrape, minus those that have reached their first
// token (or ended) since. A request sent and already running counts as waiting until its
// first token, so the estimate errs towards busy.
func (tl *targetLoad) waitingNow(m WorkerMetrics) float64 {
	sent := tl.begun.Load() - m.mark.begun
	left := tl.firstTokens.Load() - m.mark.firstTokens
	return max(m.Waiting+float64(sent-left), 0)
}

// Metrics returns the last report for t if it is not older than maxAge.
func (lt *LoadTracker) Metrics(t kvkey.Target, maxAge time.Duration) (WorkerMetrics, bool) {
	tl := lt.get(t)
	if tl == nil {
		return WorkerMetrics{}, false
	}
	return tl.freshMetrics(lt.now(), maxAge)
}

func (tl *targetLoad) freshMetrics(now time.Time, maxAge time.Duration) (WorkerMetrics, bool) {
	m := tl.metrics.Load()
	if m == nil || now.Sub(m.At) > maxAge {
		return WorkerMetrics{}, false
	}
	return *m, true
}

// Expire force-releases handles that began more than the tracker's expiry ago, ending what is
// attached to them (the kv policy's TTFT observation, without feeding its fit), and returns
// how many it released; it bounds the damage of a caller that forgets Done.
func (lt *LoadTracker) Expire() int {
	cutoff := lt.now().Add(-lt.expiry)
	lt.mu.RLock()
	tls := make([]*targetLoad, 0, len(lt.targets))
	for _, tl := range lt.targets {
		tls = append(tls, tl)
	}
	lt.mu.RUnlock()
	n := 0
	for _, tl := range tls {
		var stale []*Handle
		var exps []expirer
		tl.mu.RLock()
		for h := range tl.live {
			if h.started.Before(cutoff) {
				stale, exps = append(stale, h), append(exps, h.exp)
			}
		}
		tl.mu.RUnlock()
		for i, h := range stale {
			if h.release() {
				n++
				if exps[i] != nil {
					exps[i].expired()
				}
			}
		}
	}
	return n
}

// defaultBlockSize is vLLM's default --block-size, assumed when a request does not say.
const defaultBlockSize = 16

// blockSizeOf is the request's block size, or vLLM's default when unset.
func blockSizeOf(req *Request) int {
	if req.BlockSize > 0 {
		return req.BlockSize
	}
	return defaultBlockSize
}
