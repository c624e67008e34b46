package router

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

func TestLoadHandleLifecycle(t *testing.T) {
	lt := NewLoadTracker(time.Hour)
	a := tgt(0)
	req := request(chain(1, 8)) // 128 tokens
	cases := []struct {
		name  string
		steps func(h *Handle)
	}{
		{"first token then done", func(h *Handle) { h.FirstToken(); h.Done() }},
		{"done before first token (cancelled or failed)", func(h *Handle) { h.Done() }},
		{"repeated calls", func(h *Handle) { h.FirstToken(); h.FirstToken(); h.Done(); h.Done(); h.FirstToken() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := lt.Begin(a, req, 2) // 2 blocks predicted cached: 96 prefill tokens
			if got := lt.Load(a); got != (TargetLoad{PrefillTokens: 96, PrefillRequests: 1, Requests: 1, ActiveBlocks: 8}) {
				t.Fatalf("after begin: %+v", got)
			}
			tc.steps(h)
			if got := lt.Load(a); got != (TargetLoad{}) {
				t.Fatalf("after end: %+v", got)
			}
		})
	}
}

func TestLoadSharedBlocksCountOnce(t *testing.T) {
	lt := NewLoadTracker(time.Hour)
	hashes := chain(1, 10)
	h1 := lt.Begin(tgt(0), request(hashes), 0)
	h2 := lt.Begin(tgt(0), request(hashes[:6]), 0)
	h3 := lt.Begin(tgt(0), request(append(append([]kvkey.BlockHash{}, hashes[:4]...), chain(2, 3)...)), 0)
	if got := lt.Load(tgt(0)).ActiveBlocks; got != 13 {
		t.Fatalf("active blocks %d, want 10 + 3 distinct", got)
	}
	if got := lt.get(tgt(0)).sharedActive(hashes); got != 10 {
		t.Fatalf("shared %d", got)
	}
	h1.Done()
	if got := lt.get(tgt(0)).sharedActive(hashes); got != 6 {
		t.Fatalf("shared after first request ended %d, want 6", got)
	}
	h2.Done()
	h3.Done()
	if got := lt.Load(tgt(0)); got != (TargetLoad{}) {
		t.Fatalf("not zero: %+v", got)
	}
}

func TestLoadExpire(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	lt := NewLoadTracker(time.Minute)
	lt.now = clk.now
	old := lt.Begin(tgt(0), request(chain(1, 4)), 0)
	clk.t = clk.t.Add(50 * time.Second)
	fresh := lt.Begin(tgt(0), request(chain(2, 4)), 0)
	clk.t = clk.t.Add(20 * time.Second)
	if n := lt.Expire(); n != 1 {
		t.Fatalf("expired %d, want 1", n)
	}
	if got := lt.Load(tgt(0)); got.Requests != 1 || got.ActiveBlocks != 4 {
		t.Fatalf("after expiry: %+v", got)
	}
	old.Done() // late Done of an expired handle must not double-release
	fresh.Done()
	if got := lt.Load(tgt(0)); got != (TargetLoad{}) {
		t.Fatalf("not zero: %+v", got)
	}
}

// sseUpstream streams `chunks` SSE events; path /fail drops the connection mid-stream, /err
// answers 500 before any byte, /slow streams slowly so the client can cancel.
func sseUpstream(t *testing.T, chunks int) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/err" {
			http.Error(w, `{"error":{"message":"boom"}}`, http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := range chunks {
			if r.URL.Path == "/fail" && i == 2 {
				panic(http.ErrAbortHandler) // drop the connection mid-stream
			}
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			fl.Flush()
			delay := time.Millisecond
			if r.URL.Path == "/slow" {
				delay = 20 * time.Millisecond
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(delay):
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// relay does what the gateway's proxy does with a handle: route, stream, mark the first token
// at the first event, release at the end whatever happens.
func relay(ctx context.Context, e *Dispatcher, req *Request, cs []Candidate, url string) error {
	_, h, err := pickAndBegin(ctx, e, req, cs)
	if err != nil {
		return err
	}
	defer h.Done()
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	first := true
	for sc.Scan() {
		if !strings.HasPrefix(sc.Text(), "data: ") {
			continue
		}
		if first {
			h.FirstToken()
			first = false
		}
		if sc.Text() == "data: [DONE]" {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("stream ended without [DONE]")
}

// TestLoadReturnsToZeroAfterStreams runs real SSE streams that finish, get cancelled by the
// client, fail mid-stream, or fail before the first byte, concurrently across targets, and
// checks that every target's load returns to zero (run with -race).
func TestLoadReturnsToZeroAfterStreams(t *testing.T) {
	up := sseUpstream(t, 6)
	p, err := NewKV(DefaultKVConfig(), KVDeps{Approx: NewApproxIndex(DefaultKVConfig().Approximate)})
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewDispatcher(DispatcherOptions{KV: p})
	if err != nil {
		t.Fatal(err)
	}
	cs := kvCands(4)
	kinds := []string{"/ok", "/fail", "/err", "/slow"}
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	var peak int
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kind := kinds[i%len(kinds)]
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if kind == "/slow" {
				time.AfterFunc(30*time.Millisecond, cancel) // the client goes away mid-stream
			}
			err := relay(ctx, e, request(chain(uint64(i%5), 64)), cs, up.URL+kind)
			mu.Lock()
			defer mu.Unlock()
			outcomes[fmt.Sprintf("%s ok=%v", kind, err == nil)]++
			for _, c := range cs {
				peak = max(peak, e.Load().Load(c.Target).Requests)
			}
		}()
	}
	wg.Wait()
	want := map[string]int{"/ok ok=true": 10, "/fail ok=false": 10, "/err ok=false": 10, "/slow ok=false": 10}
	for k, v := range want {
		if outcomes[k] != v {
			t.Fatalf("outcomes %v, want %v", outcomes, want)
		}
	}
	if peak == 0 {
		t.Fatal("no load was ever seen in flight")
	}
	for _, c := range cs {
		if got := e.Load().Load(c.Target); got != (TargetLoad{}) {
			t.Errorf("%v: load %+v after all streams ended", c.Target, got)
		}
	}
}

// TestLoadConcurrentHandles hammers one target with concurrent begin/first-token/done in every
// order (run with -race).
func TestLoadConcurrentHandles(t *testing.T) {
	lt := NewLoadTracker(time.Hour)
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := lt.Begin(kvkey.Target{Worker: "w", DPRank: i % 2}, request(chain(uint64(i%3), 32)), i%4)
			var inner sync.WaitGroup
			inner.Add(2)
			go func() { defer inner.Done(); h.FirstToken() }()
			go func() { defer inner.Done(); h.Done() }()
			inner.Wait()
			h.Done()
		}()
	}
	wg.Wait()
	for r := range 2 {
		if got := lt.Load(kvkey.Target{Worker: "w", DPRank: r}); got != (TargetLoad{}) {
			t.Fatalf("rank %d: %+v", r, got)
		}
	}
}

// A worker report scraped while a request was running must stop counting that request's
// blocks and slot once the gateway has seen it end (a stale sample otherwise sends a repeated
// prompt away from the worker that just cached it).
func TestLoadMetricsDiscountEndedWork(t *testing.T) {
	tests := []struct {
		name         string
		endBefore    bool // the request ends before the sample is taken
		wantBlocks   float64
		wantRequests float64
	}{
		{"sample taken mid-request, request ended since", false, 20, 1},
		{"sample taken after the request ended", true, 100, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lt := NewLoadTracker(time.Hour)
			h := lt.Begin(tgt(0), request(chain(1, 80)), 0)
			if tc.endBefore {
				h.Done()
			}
			lt.UpdateMetrics(tgt(0), WorkerMetrics{Running: 2, KVUsage: 0.1, NumGPUBlocks: 1000})
			if !tc.endBefore {
				h.Done()
			}
			m, ok := lt.Metrics(tgt(0), time.Minute)
			if !ok {
				t.Fatal("no metrics")
			}
			blocks, reqs := lt.get(tgt(0)).sinceSample(m)
			if blocks != tc.wantBlocks || reqs != tc.wantRequests {
				t.Fatalf("since sample: %v blocks, %v requests; want %v, %v", blocks, reqs, tc.wantBlocks, tc.wantRequests)
			}
		})
	}
}

// The scraper marks the counters when it sends the request: a request that ends while the
// worker is answering is discounted from that answer.
func TestScraperMarksBeforeSending(t *testing.T) {
	lt := NewLoadTracker(time.Hour)
	var h *Handle
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h.Done() // the request ends after the worker took its snapshot
		fmt.Fprint(w, "vllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n"+
			"vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1\n")
	}))
	defer srv.Close()
	target := kvkey.Target{Worker: srv.URL}
	h = lt.Begin(target, request(chain(1, 80)), 0)
	s := &Scraper{Tracker: lt, Client: srv.Client(), Interval: time.Second, Targets: func() []kvkey.Target { return []kvkey.Target{target} }}
	s.ScrapeOnce(context.Background())
	m, ok := lt.Metrics(target, time.Minute)
	if !ok || m.NumGPUBlocks != 1000 {
		t.Fatalf("metrics %+v (fresh %v)", m, ok)
	}
	if blocks, reqs := lt.get(target).sinceSample(m); blocks != 20 || reqs != 0 {
		t.Fatalf("since sample: %v blocks, %v requests; want 20, 0", blocks, reqs)
	}
}

// TestHeldKeys: the keys of an n-block prompt are increasing positions ending at its last
// block, and their weights add up to n, so a prompt alone counts exactly its blocks.
func TestHeldKeys(t *testing.T) {
	for n := 1; n <= 400; n++ {
		sum, prev := int64(0), -1
		for k := 0; k < heldKeys(n); k++ {
			p := heldPos(k, n)
			if p <= prev || p >= n {
				t.Fatalf("n=%d: key %d at position %d after %d", n, k, p, prev)
			}
			sum += heldWeight(p)
			prev = p
		}
		if prev != n-1 || sum != int64(n) {
			t.Fatalf("n=%d: last key at %d, weights sum to %d", n, prev, sum)
		}
	}
}

// TestLoadLongPromptsShareWithinStride: long prompts are held by a sample of their blocks;
// shared prefixes and distinct blocks are still seen to within heldStride blocks, and
// everything is released at Done.
func TestLoadLongPromptsShareWithinStride(t *testing.T) {
	for _, tc := range []struct {
		name          string
		n, shared, m  int
		wantShared    int // exact value
		wantActiveMax int
	}{
		{"shared prefix inside the exact part", 2048, 40, 2048, 40, 2048 + 2008},
		{"shared prefix on a stride boundary", 2048, 64 + 16*20, 2048, 64 + 16*20, 2048 + 2048 - 384},
		{"shared prefix between stride keys", 2048, 1000, 2048, 1000 - (1000-64)%16, 2048 + 1048 + heldStride},
		{"one prompt inside another", 2048, 700, 700, 700 - (700-64)%16, 2048 + heldStride},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lt := NewLoadTracker(time.Hour)
			a := chain(1, tc.n)
			b := append(append([]kvkey.BlockHash{}, a[:tc.shared]...), chain(2, tc.m-tc.shared)...)
			if tc.m == tc.shared {
				b = a[:tc.m]
			}
			ha := lt.Begin(tgt(0), request(a), 0)
			if got := lt.Load(tgt(0)).ActiveBlocks; got != tc.n {
				t.Fatalf("one prompt: %d active blocks, want %d", got, tc.n)
			}
			if got := lt.get(tgt(0)).sharedActive(b); got != tc.wantShared {
				t.Fatalf("shared %d, want %d", got, tc.wantShared)
			}
			hb := lt.Begin(tgt(0), request(b), 0)
			exact := tc.n + tc.m - tc.shared
			if got := lt.Load(tgt(0)).ActiveBlocks; got < exact || got > tc.wantActiveMax {
				t.Fatalf("two prompts: %d active blocks, want %d..%d", got, exact, tc.wantActiveMax)
			}
			ha.Done()
			if got := lt.Load(tgt(0)).ActiveBlocks; got != tc.m {
				t.Fatalf("after the first ended: %d active blocks, want %d", got, tc.m)
			}
			hb.Done()
			if got := lt.Load(tgt(0)); got != (TargetLoad{}) || len(lt.get(tgt(0)).blocks) != 0 {
				t.Fatalf("after both ended: %+v, %d keys", got, len(lt.get(tgt(0)).blocks))
			}
		})
	}
}
