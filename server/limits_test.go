package server

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/router"
)

// blockingEnricher holds every Enrich until release is closed, counting how many run at once.
type blockingEnricher struct {
	release chan struct{}
	mu      sync.Mutex
	running int
	peak    int
	entered chan struct{}
}

func (e *blockingEnricher) Enrich(ctx context.Context, _ *apireq.Request, _ *router.Request) error {
	e.mu.Lock()
	e.running++
	e.peak = max(e.peak, e.running)
	e.mu.Unlock()
	e.entered <- struct{}{}
	select {
	case <-e.release:
	case <-ctx.Done():
	}
	e.mu.Lock()
	e.running--
	e.mu.Unlock()
	return nil
}

// Tokenizations beyond the cap wait in a bounded queue; a full queue and a wait past the
// timeout get 503 with Retry-After and the OpenAI error body.
func TestTokenizeSlots(t *testing.T) {
	cases := []struct {
		name    string
		queue   int
		timeout time.Duration
		// the third request's expected status while two hold or wait
		want int
	}{
		{"queue full", 0, time.Minute, http.StatusServiceUnavailable},
		{"queue timeout", 1, 50 * time.Millisecond, http.StatusServiceUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := startSim(t, fastSim())
			cfg := testGatewayConfig(w.srv.URL)
			cfg.Limits = configs.Limits{MaxConcurrentTokenizations: 1, TokenizeQueue: tc.queue, TokenizeQueueTimeout: configs.Duration(tc.timeout)}
			pol, _ := router.New("round_robin", router.Options{})
			e := &blockingEnricher{release: make(chan struct{}), entered: make(chan struct{}, 8)}
			g := startGatewayWith(t, cfg, routerFor(t, pol), e)
			body := `{"model":"` + testModel + `","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
			first := make(chan int, 1)
			go func() {
				resp, _ := g.post(t, pathChat, body, nil)
				first <- resp.StatusCode
			}()
			<-e.entered // the first holds the only slot
			start := time.Now()
			resp, data := g.post(t, pathChat, body, nil)
			if resp.StatusCode != tc.want || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("status %d Retry-After %q (%s), want %d with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), data, tc.want)
			}
			var eb errorBody
			if err := json.Unmarshal(data, &eb); err != nil || eb.Error.Code != tc.want || eb.Error.Type != "ServiceUnavailableError" {
				t.Fatalf("body %s: %v", data, err)
			}
			if tc.queue == 0 && time.Since(start) > 5*time.Second {
				t.Errorf("a full queue must answer at once, took %s", time.Since(start))
			}
			close(e.release)
			if code := <-first; code != http.StatusOK {
				t.Errorf("first request: %d", code)
			}
			if e.peak != 1 {
				t.Errorf("%d tokenizations ran at once, cap 1", e.peak)
			}
		})
	}
}

// limitSpy records the MaxModelLen the server hands the enricher.
type limitSpy struct{ got chan int }

func (e *limitSpy) Enrich(_ context.Context, in *apireq.Request, _ *router.Request) error {
	e.got <- in.MaxModelLen
	if in.MaxModelLen > 0 {
		return ContextLengthError(in.MaxModelLen, in.MaxModelLen+5, false)
	}
	return nil
}

// The enricher learns max_model_len from the workers' /v1/models unless limits.max_model_len
// overrides it, and its ContextLengthError is vLLM's 400.
func TestMaxModelLenReachesEnricher(t *testing.T) {
	cases := []struct {
		name     string
		override int
		want     int
	}{
		{"from the worker's /v1/models", 0, 777},
		{"limits.max_model_len wins", 300, 300},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := fastSim()
			opts.MaxModelLen = 777
			opts.NumGPUBlocks = 1000
			w := startSim(t, opts)
			cfg := testGatewayConfig(w.srv.URL)
			cfg.Limits.MaxModelLen = tc.override
			pol, _ := router.New("round_robin", router.Options{})
			e := &limitSpy{got: make(chan int, 1)}
			g := startGatewayWith(t, cfg, routerFor(t, pol), e)
			resp, data := g.post(t, pathChat, `{"model":"`+testModel+`","messages":[{"role":"user","content":"hi"}]}`, nil)
			if got := <-e.got; got != tc.want {
				t.Fatalf("MaxModelLen = %d, want %d", got, tc.want)
			}
			var eb errorBody
			_ = json.Unmarshal(data, &eb)
			want := "This model's maximum context length is " + itoa(tc.want) + " tokens. However, your request has at least " + itoa(tc.want+5) + " input tokens. Please reduce the length of the input messages."
			if resp.StatusCode != 400 || eb.Error.Message != want || eb.Error.Type != "BadRequestError" {
				t.Fatalf("status %d body %s", resp.StatusCode, data)
			}
			if n := len(w.rec.all()); n != 0 {
				t.Errorf("%d requests reached the worker", n)
			}
		})
	}
}

// A body takes one slot per started 4 MiB, at most all of them, and waiters are served in
// order: a small request does not overtake a large one waiting for the whole pool.
func TestTokenizeSlotsWeightsAndOrder(t *testing.T) {
	ts := newTokenizeSlots(configs.Limits{MaxConcurrentTokenizations: 2, TokenizeQueue: 8, TokenizeQueueTimeout: configs.Duration(time.Minute)})
	for _, c := range []struct{ body, want int }{{0, 1}, {bodyUnit - 1, 1}, {bodyUnit, 2}, {30 << 20, 2}} {
		if got := ts.weight(c.body); got != c.want {
			t.Errorf("weight(%d) = %d, want %d", c.body, got, c.want)
		}
	}
	ctx := context.Background()
	relSmall, e := ts.acquire(ctx, 10)
	if e != nil {
		t.Fatal(e)
	}
	order := make(chan string, 2)
	go func() {
		rel, e := ts.acquire(ctx, 30<<20)
		if e == nil {
			order <- "large"
			rel()
		}
	}()
	for ts.queued() == 0 {
		time.Sleep(time.Millisecond)
	}
	go func() {
		rel, e := ts.acquire(ctx, 10)
		if e == nil {
			order <- "small"
			rel()
		}
	}()
	for ts.queued() < 2 {
		time.Sleep(time.Millisecond)
	}
	relSmall()
	if a, b := <-order, <-order; a != "large" || b != "small" {
		t.Fatalf("granted %s then %s, want large then small", a, b)
	}
}
