package router

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router/latency"
	"github.com/kvgate/kvgate/router/routerconfig"
)

// streamed marks r as a streamed request (its first byte is its first token).
func streamed(r *Request) *Request {
	r.Stream = true
	return r
}

// timedEngine is a kv engine with a fake clock whose metrics go to reg.
func timedEngine(t *testing.T, cfg KVConfig, reg *prometheus.Registry) (*Dispatcher, *KVPolicy, *fakeClock) {
	t.Helper()
	return timedEngineWith(t, cfg, fixedMatcher{}, reg)
}

// timedEngineWith is timedEngine over matcher m.
func timedEngineWith(t *testing.T, cfg KVConfig, m fixedMatcher, reg *prometheus.Registry) (*Dispatcher, *KVPolicy, *fakeClock) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := newTestKV(t, PolicyKV, cfg, KVDeps{Matcher: m}, clk)
	eo := DispatcherOptions{KV: p}
	if reg != nil {
		eo.Registerer = reg
	}
	e, err := NewDispatcher(eo)
	if err != nil {
		t.Fatal(err)
	}
	return e, p, clk
}

// TestKVLearnsFromLifecycle: TTFTs measured between Route and FirstToken, with the worker's
// cached_tokens from UsageSeen, fit the target's model: a worker three times slower than the
// prior profile is learned, and its queue accounting drains to zero.
func TestKVLearnsFromLifecycle(t *testing.T) {
	reg := prometheus.NewRegistry()
	e, p, clk := timedEngine(t, DefaultKVConfig(), reg)
	var slow latency.Theta
	for i, v := range p.timed.prior {
		slow[i] = 3 * v
	}
	r := rand.New(rand.NewPCG(4, 2))
	for i := 0; i < 200; i++ {
		blocks := 8 + r.IntN(1000)
		cached := r.IntN(blocks) * 16
		_, lc, err := e.Route(context.Background(), streamed(request(chain(uint64(i+10), blocks))), kvCands(1))
		if err != nil {
			t.Fatal(err)
		}
		lc.Sent()
		ms := latency.PredictTTFT(slow, p.timed.params, latency.State{}, latency.Req{Uncached: float64(blocks*16 - cached), Cached: float64(cached)}).TotalMs
		clk.advance(time.Duration(ms * float64(time.Millisecond)))
		lc.FirstToken()
		lc.UsageSeen(Usage{PromptTokens: blocks * 16, CachedTokens: cached, HasCached: true})
		lc.Done()
	}
	v := e.DebugTargets([]kvkey.Target{tgt(0)})[0].Latency
	if v == nil || !v.Ready || v.Samples != 200 {
		t.Fatalf("latency view %+v, want ready with 200 samples", v)
	}
	if got, want := v.Theta["prefill_ms_per_token"], slow[latency.FTokens]; got < 0.8*want || got > 1.2*want {
		t.Fatalf("fitted prefill_ms_per_token %v, want ~%v (3x the prior)", got, want)
	}
	if v.ResidualMAD > 0.05 {
		t.Fatalf("residual MAD %v on noiseless data", v.ResidualMAD)
	}
	if v.AheadTokens != 0 || v.DecodeRequests != 0 || v.DecodeKVTokens != 0 {
		t.Fatalf("accounting left after every request ended: %+v", v)
	}
	counts := map[string]uint64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			counts[mf.GetName()] += m.GetHistogram().GetSampleCount()
		}
	}
	for _, name := range []string{"kvgate_router_predicted_ttft_seconds", "kvgate_router_observed_ttft_seconds", "kvgate_router_ttft_prediction_error_ratio"} {
		if counts[name] != 200 {
			t.Fatalf("%s has %d samples, want 200", name, counts[name])
		}
	}
	e.Forget(tgt(0))
	if v := e.DebugTargets([]kvkey.Target{tgt(0)})[0].Latency; v.Ready || v.Samples != 0 || v.Theta["prefill_ms_per_token"] != p.timed.prior[latency.FTokens] {
		t.Fatalf("after Forget the fit must be the prior again: %+v", v)
	}

	// RemoveTarget (the worker left the fleet) drops its state and its series altogether.
	e.RemoveTarget(tgt(0))
	if p.timed.get(tgt(0)) != nil || e.load.get(tgt(0)) != nil {
		t.Error("the removed target still has time-model or load state")
	}
	if mfs, err = reg.Gather(); err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "worker" && l.GetValue() == tgt(0).String() {
					t.Errorf("%s still has a series of the removed target", mf.GetName())
				}
			}
		}
	}
}

// TestKVTimeAccountingSteps: the queue and decode accounting per Lifecycle path, and which
// paths feed the fit.
func TestKVTimeAccountingSteps(t *testing.T) {
	firstAndUsage := func(lc Lifecycle, clk *fakeClock) {
		clk.advance(50 * time.Millisecond)
		lc.FirstToken()
		lc.UsageSeen(Usage{PromptTokens: 1024, CachedTokens: 512, HasCached: true})
	}
	for _, tc := range []struct {
		name                string
		stream              bool
		steps               func(lc Lifecycle, clk *fakeClock)
		ahead, decodes, fed float64
		fedAfter            float64
	}{
		{"routed, no first token", true, func(Lifecycle, *fakeClock) {}, 1024, 0, 0, 0},
		{"first token; Done feeds", true, func(lc Lifecycle, clk *fakeClock) { clk.advance(50 * time.Millisecond); lc.FirstToken() }, 0, 1, 0, 1},
		{"usage feeds", true, firstAndUsage, 0, 1, 1, 1},
		{"non-stream body: its first byte is not a first token", false, firstAndUsage, 0, 1, 0, 0},
		{"failed before first token", true, func(lc Lifecycle, _ *fakeClock) { lc.Failed(nil) }, 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, p, clk := timedEngine(t, DefaultKVConfig(), nil)
			req := request(chain(1, 64))
			req.Stream = tc.stream
			_, lc, err := e.Route(context.Background(), req, kvCands(1))
			if err != nil {
				t.Fatal(err)
			}
			lc.Sent()
			tc.steps(lc, clk)
			st, _ := p.timed.state(tgt(0))
			fed := float64(p.latencyView(tgt(0)).Samples)
			if st.AheadTokens != tc.ahead || st.DecodeRequests != tc.decodes || fed != tc.fed {
				t.Fatalf("ahead %v decodes %v fed %v, want %v %v %v", st.AheadTokens, st.DecodeRequests, fed, tc.ahead, tc.decodes, tc.fed)
			}
			lc.Done()
			lc.Done()
			st, _ = p.timed.state(tgt(0))
			if st != (latency.State{}) {
				t.Fatalf("after Done: %+v, want all zero", st)
			}
			if got := float64(p.latencyView(tgt(0)).Samples); got != tc.fedAfter {
				t.Fatalf("samples after Done %v, want %v (Done feeds a measured TTFT once)", got, tc.fedAfter)
			}
		})
	}
}

// TestKVRestartResetsFit: a new process_start_time_seconds in a worker's /metrics returns its
// fit to the prior; the first reading, or the same one again, does not.
func TestKVRestartResetsFit(t *testing.T) {
	e, p, clk := timedEngine(t, DefaultKVConfig(), nil)
	feed := func(n int) {
		for i := 0; i < n; i++ {
			_, lc, _ := e.Route(context.Background(), streamed(request(chain(uint64(i+5), 10+i*37))), kvCands(1))
			clk.advance(time.Duration(30+i) * time.Millisecond)
			lc.FirstToken()
			lc.Done()
		}
	}
	body := func(start string) {
		page := "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds " + start + "\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0\n"
		if err := p.load.FeedMetrics(tgt(0).Worker, []int{0}, strings.NewReader(page)); err != nil {
			t.Fatal(err)
		}
		p.checkRestarts()
	}
	feed(30)
	for _, tc := range []struct {
		start string
		want  int
	}{{"1700000000", 30}, {"1700000000", 30}, {"1700000999", 0}} {
		body(tc.start)
		if got := p.latencyView(tgt(0)).Samples; got != tc.want {
			t.Fatalf("after start time %s: %d samples, want %d", tc.start, got, tc.want)
		}
	}
}

// TestKVTimeExpire: an attempt never ended stops counting as queued once it is older than
// load_expiry; a younger one stays.
func TestKVTimeExpire(t *testing.T) {
	e, p, clk := timedEngine(t, DefaultKVConfig(), nil)
	if _, _, err := e.Route(context.Background(), streamed(request(chain(1, 64))), kvCands(1)); err != nil {
		t.Fatal(err)
	}
	clk.advance(p.cfg.LoadExpiry.D() / 2)
	_, lc, err := e.Route(context.Background(), streamed(request(chain(2, 32))), kvCands(1))
	if err != nil {
		t.Fatal(err)
	}
	lc.FirstToken()
	clk.advance(p.cfg.LoadExpiry.D()/2 + time.Second)
	if n := e.load.Expire(); n != 1 {
		t.Fatalf("expired %d attempts, want 1", n)
	}
	if st, _ := p.timed.state(tgt(0)); st.AheadTokens != 0 || st.DecodeRequests != 1 || st.DecodeKVTokens != 512 {
		t.Fatalf("after expiry: %+v, want only the younger attempt's decode", st)
	}
	lc.Done()
	if st, _ := p.timed.state(tgt(0)); st != (latency.State{}) {
		t.Fatalf("after Done: %+v", st)
	}
}

// TestKVGatewayITLSample: a completed streamed response with enough events after its first
// token gives the fit one step-time sample (the mean time between them); a short one, a
// failed one or a non-streamed one gives none.
func TestKVGatewayITLSample(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream bool
		events int
		fail   bool
		want   int
	}{
		{"long stream", true, 64, false, 1},
		{"short stream", true, minITLEvents - 1, false, 0},
		{"failed", true, 64, true, 0},
		{"not streamed", false, 64, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, p, clk := timedEngine(t, allSources(), nil)
			req := request(chain(3, 20))
			if tc.stream {
				req = streamed(req)
			}
			_, lc, err := e.Route(context.Background(), req, kvCands(1))
			if err != nil {
				t.Fatal(err)
			}
			clk.advance(40 * time.Millisecond)
			lc.FirstToken()
			for i := 0; i < tc.events; i++ {
				clk.advance(12 * time.Millisecond)
				lc.Chunk()
			}
			if tc.fail {
				lc.Failed(nil)
			} else {
				lc.Done()
			}
			s := p.latencyView(tgt(0)).Sources["gateway_itl"]
			if s.Samples != tc.want {
				t.Fatalf("gateway_itl samples %d, want %d", s.Samples, tc.want)
			}
			if tc.want == 0 {
				return
			}
			if !(s.Error > 0) || math.IsInf(s.Error, 0) {
				t.Fatalf("gateway_itl error %v, want a finite positive error", s.Error)
			}
		})
	}
}

// allSources is the default config with the fit learning from every sample source
// (router.latency.learn_from lists only gateway_ttft by default).
func allSources() KVConfig {
	c := DefaultKVConfig()
	c.Latency.LearnFrom = routerconfig.LearnSources()
	return c
}

// The default learns from the gateway's TTFTs only: a worker's histograms and the gateway's
// inter-event times are not fed unless router.latency.learn_from names them.
func TestKVLearnFromDefaultIgnoresWorkerSources(t *testing.T) {
	_, p, _ := timedEngine(t, DefaultKVConfig(), nil)
	if !p.timed.learnFrom[latency.SourceTTFT] || p.timed.learnFrom[latency.SourceWorkerPrefill] ||
		p.timed.learnFrom[latency.SourceWorkerStep] || p.timed.learnFrom[latency.SourceGatewayITL] {
		t.Fatalf("default sources %v, want gateway_ttft only", p.timed.learnFrom)
	}
	if got, want := routerconfig.LearnSources(), latency.SourceNames(); !slices.Equal(got, want[:]) {
		t.Fatalf("routerconfig's source names %v differ from the model's %v", got, want)
	}
}
