package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/sessions"
)

func TestPredictedCachedTokens(t *testing.T) {
	cases := []struct{ g1, bs, prompt, want int }{
		{0, 16, 100, 0},
		{4, 16, 100, 64},
		{6, 16, 100, 96},  // (100−1)/16 = 6 full blocks
		{7, 16, 112, 96},  // a fully cached 112-token prompt: vLLM recomputes the last token
		{7, 16, 113, 112}, // one token more: all 7 blocks count
		{3, 0, 100, 0},
	}
	for _, tc := range cases {
		if got := PredictedCachedTokens(tc.g1, tc.bs, tc.prompt); got != tc.want {
			t.Errorf("PredictedCachedTokens(%d,%d,%d) = %d, want %d", tc.g1, tc.bs, tc.prompt, got, tc.want)
		}
	}
}

// TestDispatcherObserve: usage reports feed the prediction-error and mismatch metrics; the mismatch
// log names the model and is rate limited.
func TestDispatcherObserve(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	p, err := NewKV(DefaultKVConfig(), KVDeps{Matcher: fixedMatcher{tgt(0): {G1: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewDispatcher(DispatcherOptions{KV: p, Registerer: reg, Log: log, MismatchLogBurst: 2, MismatchLogEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	req := request(chain(1, 128)) // 2048 tokens
	d, h, err := pickAndBegin(context.Background(), e, req, kvCands(2))
	if err != nil {
		t.Fatal(err)
	}
	h.Done()
	e.Observe("qwen", req, d, Usage{PromptTokens: 2048, CachedTokens: 1536, HasCached: true})
	for range 5 {
		e.Observe("qwen", req, d, Usage{PromptTokens: 2051, CachedTokens: 1600, HasCached: true})
	}
	e.Observe("qwen", req, d, Usage{PromptTokens: 2048})

	if got := metricValue(t, e.feedback.mismatches.WithLabelValues("qwen")); got != 5 {
		t.Errorf("mismatches %v, want 5", got)
	}
	if got := metricValue(t, e.feedback.predicted.WithLabelValues("qwen", "events")); got != 6*1600 {
		t.Errorf("predicted %v", got)
	}
	if got := metricValue(t, e.feedback.actual.WithLabelValues("qwen", "events")); got != 1536+5*1600 {
		t.Errorf("reported %v", got)
	}
	if got := metricValue(t, e.feedback.unpredicted.WithLabelValues("qwen")); got != 1 {
		t.Errorf("without cached_tokens %v", got)
	}
	if n := histogramCount(t, reg, "kvgate_router_cached_tokens_prediction_error"); n != 6 {
		t.Errorf("prediction error observations %d, want 6", n)
	}
	if n := histogramCount(t, reg, "kvgate_router_decision_seconds"); n != 1 {
		t.Errorf("decision latency observations %d, want 1", n)
	}
	if lines := strings.Count(logs.String(), "model=qwen"); lines != 2 {
		t.Errorf("logged %d mismatch lines, want the burst of 2:\n%s", lines, logs.String())
	}
	if !strings.Contains(logs.String(), "gateway_prompt_tokens=2048 worker_prompt_tokens=2051") {
		t.Errorf("log lacks the counts:\n%s", logs.String())
	}
}

// TestDispatcherDryRunAccountsNothing: a dry run returns the same record shape and leaves load and
// the approximate index untouched.
func TestDispatcherDryRunAccountsNothing(t *testing.T) {
	approx := NewApproxIndex(DefaultKVConfig().Approximate)
	p, err := NewKV(DefaultKVConfig(), KVDeps{Approx: approx})
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewDispatcher(DispatcherOptions{KV: p})
	if err != nil {
		t.Fatal(err)
	}
	req := request(chain(1, 128))
	d, err := e.Pick(context.Background(), req, kvCands(3))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range kvCands(3) {
		if e.Load().Load(c.Target) != (TargetLoad{}) || approx.Resident(c.Target) != 0 {
			t.Fatalf("dry run accounted state on %v", c.Target)
		}
	}
	// The record serialises with the fixed keys documented in docs/operations.md ("POST /debug/route").
	raw, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	var generic map[string]any
	if err := json.Unmarshal(raw, &generic); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"prompt_tokens", "prompt_blocks", "policy", "chosen", "candidates"} {
		if _, ok := generic[k]; !ok {
			t.Fatalf("record lacks %q: %s", k, raw)
		}
	}
	chosen := generic["chosen"].(map[string]any)
	for _, k := range []string{"worker", "dp_rank", "reason"} {
		if _, ok := chosen[k]; !ok {
			t.Fatalf("chosen lacks %q: %s", k, raw)
		}
	}
	cand := generic["candidates"].([]any)[0].(map[string]any)
	for _, k := range []string{"worker", "dp_rank", "mode", "g1_blocks", "g2_blocks", "g3_blocks", "cost"} {
		if _, ok := cand[k]; !ok {
			t.Fatalf("candidate lacks %q: %s", k, raw)
		}
	}
	if _, err := e.Pick(context.Background(), req, nil); err == nil {
		t.Fatal("no candidates accepted")
	}
}

// metricValue reads a counter or gauge.
func metricValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// histogramCount sums the sample counts of every series of a histogram family.
func histogramCount(t *testing.T, reg prometheus.Gatherer, name string) uint64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, f := range fams {
		if f.GetName() == name {
			for _, m := range f.Metric {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// counterSum sums the values of every series of a counter family.
func counterSum(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	v := 0.0
	for _, f := range fams {
		if f.GetName() == name {
			for _, m := range f.Metric {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

// TestDispatcherWrapsAnyPolicy: the dispatcher is a Router around any policy, so the server accounts
// load the same way whichever policy is configured: every attempt's Lifecycle holds the load
// until it is Done or Failed (exactly once, whichever comes first).
func TestDispatcherWrapsAnyPolicy(t *testing.T) {
	cases := []struct {
		name  string
		end   func(Lifecycle)
		first bool
	}{
		{"served", func(l Lifecycle) { l.Done() }, true},
		{"failed before the first byte", func(l Lifecycle) { l.Failed(errors.New("refused")) }, false},
		{"failed after a done", func(l Lifecycle) { l.Done(); l.Failed(errors.New("late")) }, true},
		{"done twice", func(l Lifecycle) { l.Done(); l.Done() }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, err := NewDispatcher(DispatcherOptions{Policy: &RoundRobin{}})
			if err != nil {
				t.Fatal(err)
			}
			var r Router = e
			if r.Name() != "round_robin" {
				t.Fatalf("router named %q", r.Name())
			}
			req := request(chain(1, 8))
			d, life, err := r.Route(context.Background(), req, kvCands(2))
			if err != nil {
				t.Fatal(err)
			}
			if got := e.Load().Load(d.Chosen.Target); got.PrefillTokens != 128 || got.Requests != 1 {
				t.Fatalf("after Route: %+v", got)
			}
			life.Sent()
			if tc.first {
				life.FirstToken()
				if got := e.Load().Load(d.Chosen.Target); got.PrefillTokens != 0 || got.Requests != 1 {
					t.Fatalf("after FirstToken: %+v", got)
				}
			}
			tc.end(life)
			if got := e.Load().Load(d.Chosen.Target); got != (TargetLoad{}) {
				t.Fatalf("after the end: %+v", got)
			}
		})
	}
}

// TestRequestWithoutBlockSize: an unset block size means vLLM's default 16, not 1.
func TestRequestWithoutBlockSize(t *testing.T) {
	p := newTestKV(t, PolicyKVBlocks, DefaultKVConfig(), KVDeps{Matcher: fixedMatcher{tgt(0): {G1: 8}}}, nil)
	req := request(chain(1, 8))
	req.BlockSize = 0
	d, _ := p.Pick(context.Background(), req, kvCands(2))
	if d.Candidates[0].Cost != 0 || d.Candidates[1].Cost != 8 {
		t.Fatalf("costs %v, %v; want 0 and 8 blocks", d.Candidates[0].Cost, d.Candidates[1].Cost)
	}
}

// TestDispatcherSessionSteps: the session updates hang off the Router's steps: Start records the
// identity, the attempt's Sent makes the post-selection update (affinity), and the end Start
// returned releases a session whose request ended it, and only that.
func TestDispatcherSessionSteps(t *testing.T) {
	cases := []struct {
		name      string
		final     bool
		sent      bool
		wantAfter bool // session still tracked after end
	}{
		{"routed, not final", false, true, true},
		{"routed, final", true, true, false},
		{"never sent, final", true, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sm, err := sessions.New(sessions.Defaults(), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			sh := &recordShared{}
			sm.SetShared(sh)
			e, err := NewDispatcher(DispatcherOptions{Policy: &RoundRobin{}, Sessions: sm})
			if err != nil {
				t.Fatal(err)
			}
			req := request(chain(1, 4))
			req.SessionID, req.ParentSessionID, req.EndsSession = "child", "root", tc.final
			end := e.Start(req)
			v, ok := sm.Debug("child", false)
			if !ok || v.ParentID != "root" || v.Affinity != nil {
				t.Fatalf("after Start: %+v %v", v, ok)
			}
			d, life, err := e.Route(context.Background(), req, kvCands(2))
			if err != nil {
				t.Fatal(err)
			}
			if tc.sent {
				life.Sent()
				if v, _ := sm.Debug("child", false); v.Affinity == nil || *v.Affinity != d.Chosen.Target || v.Routed != 1 {
					t.Fatalf("after Sent: %+v", v)
				}
			}
			life.Done()
			life.Failed(errors.New("after Done: ignored"))
			if _, ok := sm.Debug("child", false); !ok {
				t.Fatal("session released before the request ended")
			}
			// The shared bindings heard the catch-up before routing and, for a sent attempt,
			// exactly one lease end at the chosen target.
			wantRel := []string(nil)
			if tc.sent {
				wantRel = []string{"child→" + d.Chosen.Target.Worker}
			}
			if !reflect.DeepEqual(sh.synced, []string{"child/root"}) || !reflect.DeepEqual(sh.released, wantRel) {
				t.Fatalf("shared bindings: synced %v released %v, want [child/root] and %v", sh.synced, sh.released, wantRel)
			}
			end()
			if _, ok := sm.Debug("child", false); ok != tc.wantAfter {
				t.Fatalf("after end: tracked=%v, want %v", ok, tc.wantAfter)
			}
		})
	}
}

// TestDispatcherDebugViews: the dispatcher's debug views show its load and sessions, and say why a
// session has no view.
func TestDispatcherDebugViews(t *testing.T) {
	sm, err := sessions.New(sessions.Defaults(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := NewDispatcher(DispatcherOptions{Policy: &RoundRobin{}})
	tracked, _ := NewDispatcher(DispatcherOptions{Policy: &RoundRobin{}, Sessions: sm})
	req := request(chain(1, 4))
	req.SessionID = "s"
	tracked.Start(req)
	d, life, err := tracked.Route(context.Background(), req, kvCands(1))
	if err != nil {
		t.Fatal(err)
	}
	defer life.Done()
	if v := tracked.DebugTargets([]kvkey.Target{d.Chosen.Target}); len(v) != 1 || v[0].Load == nil || v[0].Load.Requests != 1 || v[0].Mode != "" {
		t.Errorf("DebugTargets: %+v", v)
	}
	if f := tracked.DebugFleet(); f.Sessions == nil || f.Sessions.Sessions != 1 {
		t.Errorf("DebugFleet: %+v", f)
	}
	cases := []struct {
		name string
		e    *Dispatcher
		id   string
		want string // error substring; "" = a view
	}{
		{"tracked", tracked, "s", ""},
		{"unknown", tracked, "t", `unknown session "t"`},
		{"not tracked", plain, "s", "not tracked"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := tc.e.DebugSession(tc.id, false)
			switch {
			case tc.want == "" && (err != nil || v.(sessions.SessionView).ID != tc.id):
				t.Errorf("view %+v, err %v", v, err)
			case tc.want != "" && (!errors.Is(err, ErrNoSession) || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("err %v, want ErrNoSession with %q", err, tc.want)
			}
		})
	}
}

// TestBuild: Build runs a KV-aware policy as the dispatcher's KV policy (its mode and approximate
// index show in the views, Forget clears the latter) and any other as a plain policy.
func TestBuild(t *testing.T) {
	cases := []struct {
		name     string
		wantErr  string
		wantMode string
	}{
		{PolicyKV, "", ModeApproximate},
		{PolicyKVNoLoad, "", ModeApproximate},
		{"round_robin", "", ""},
		{"best", `unknown policy "best"`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			deps := KVDeps{Approx: NewApproxIndex(DefaultKVConfig().Approximate)}
			e, err := Build(tc.name, Options{KVDeps: deps}, DispatcherOptions{Policy: &RoundRobin{}})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || e.Name() != tc.name {
				t.Fatalf("dispatcher %v, err %v", e, err)
			}
			req := request(chain(1, 4))
			d, life, err := e.Route(context.Background(), req, kvCands(1))
			if err != nil {
				t.Fatal(err)
			}
			life.Done()
			v := e.DebugTargets([]kvkey.Target{d.Chosen.Target})[0]
			if v.Mode != tc.wantMode || (tc.wantMode != "") != (v.ApproximateBlocks != nil) {
				t.Fatalf("view %+v", v)
			}
			if v.ApproximateBlocks != nil && *v.ApproximateBlocks != 4 {
				t.Fatalf("approximate blocks %d after routing 4", *v.ApproximateBlocks)
			}
			e.Forget(d.Chosen.Target)
			if v := e.DebugTargets([]kvkey.Target{d.Chosen.Target})[0]; v.ApproximateBlocks != nil && *v.ApproximateBlocks != 0 {
				t.Fatalf("approximate blocks %d after Forget", *v.ApproximateBlocks)
			}
		})
	}
	if _, err := NewDispatcher(DispatcherOptions{Policy: &RoundRobin{}, KV: &KVPolicy{}}); err == nil {
		t.Error("a dispatcher with both a policy and a KV policy was built")
	}
}

// recordShared is a sessions.SharedBindings that records the catch-ups and lease ends.
type recordShared struct {
	mu       sync.Mutex
	synced   []string
	released []string
}

func (r *recordShared) Lookup(string) (sessions.SharedBinding, bool) {
	return sessions.SharedBinding{}, false
}
func (r *recordShared) Routed(string, string, kvkey.Target) {}
func (r *recordShared) Group(string) []sessions.GroupMember { return nil }
func (r *recordShared) Ended(string)                        {}

func (r *recordShared) Sync(_ context.Context, id, parent string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.synced = append(r.synced, id+"/"+parent)
}

func (r *recordShared) Released(id string, t kvkey.Target) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.released = append(r.released, id+"→"+t.Worker)
}

// TestDispatcherDecisionLog: at debug level every routed request logs its whole decision
// record (parseable back, every candidate); at info level nothing is built or written.
func TestDispatcherDecisionLog(t *testing.T) {
	tests := []struct {
		level slog.Level
		lines int
	}{
		{slog.LevelDebug, 1},
		{slog.LevelInfo, 0},
	}
	for _, tc := range tests {
		var logs bytes.Buffer
		log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: tc.level}))
		p, err := NewKV(DefaultKVConfig(), KVDeps{Matcher: fixedMatcher{tgt(1): {G1: 100}}})
		if err != nil {
			t.Fatal(err)
		}
		e, err := NewDispatcher(DispatcherOptions{KV: p, Log: log})
		if err != nil {
			t.Fatal(err)
		}
		req := request(chain(1, 128))
		req.SessionID = "s1"
		d, lc, err := e.Route(context.Background(), req, kvCands(3))
		if err != nil {
			t.Fatal(err)
		}
		lc.Done()
		var got []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var rec map[string]any
			if l == "" || json.Unmarshal([]byte(l), &rec) != nil || rec["msg"] != "routed" {
				continue
			}
			got = append(got, rec)
		}
		if len(got) != tc.lines {
			t.Fatalf("level %v: %d routed records, want %d:\n%s", tc.level, len(got), tc.lines, logs.String())
		}
		if tc.lines == 0 {
			continue
		}
		rec := got[0]
		if rec["session"] != "s1" || rec["target"] != d.Chosen.Target.String() {
			t.Errorf("record %v: want session s1, target %v", rec, d.Chosen.Target)
		}
		var logged Decision
		if err := json.Unmarshal([]byte(rec["decision"].(string)), &logged); err != nil {
			t.Fatalf("decision field does not parse: %v", err)
		}
		if len(logged.Candidates) != 3 || logged.Chosen.Target != d.Chosen.Target || logged.PromptBlocks != 128 {
			t.Errorf("logged decision %+v, want 3 candidates, chosen %v, 128 blocks", logged, d.Chosen.Target)
		}
	}
}
