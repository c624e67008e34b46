package router

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/confval"
	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
)

// shared returns a prompt whose first n blocks are those of base, then own blocks of its own.
func sharedPrompt(base []kvkey.BlockHash, n int, seed uint64, own int) []kvkey.BlockHash {
	out := append([]kvkey.BlockHash(nil), base[:n]...)
	return append(out, chain(seed, own)...)
}

func TestHoldTable(t *testing.T) {
	leader := chain(1, 80)
	cases := []struct {
		name       string
		first      []kvkey.BlockHash
		second     []kvkey.BlockHash
		wantLeader bool // the second claim leads a new prefill
		wantNil    bool // the second claim is not tracked
		wantShared int
	}{
		{"same prefix of 64 follows", leader, sharedPrompt(leader, 64, 2, 10), false, false, 64},
		{"longer shared prefix", leader, sharedPrompt(leader, 75, 2, 10), false, false, 75},
		{"identical prompt", leader, leader, false, false, 80},
		{"63 shared blocks lead their own", leader, sharedPrompt(leader, 63, 2, 10), true, false, 0},
		{"short prompt untracked", leader, leader[:63], false, true, 0},
		{"unrelated prompt leads", leader, chain(3, 70), true, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHoldTable(64)
			now := time.Unix(100, 0)
			pf, lead := h.claim(tc.first, now)
			if pf == nil || !lead {
				t.Fatalf("first claim: %v %v, want a leader", pf, lead)
			}
			got, lead2 := h.claim(tc.second, now)
			if (got == nil) != tc.wantNil || lead2 != tc.wantLeader {
				t.Fatalf("second claim: nil=%v leader=%v, want nil=%v leader=%v", got == nil, lead2, tc.wantNil, tc.wantLeader)
			}
			if got == pf {
				if s := sharedBlocks(tc.second, pf.hashes); s != tc.wantShared {
					t.Errorf("shared = %d, want %d", s, tc.wantShared)
				}
			}
			h.finish(pf, true)
			h.finish(pf, false) // idempotent: the first call wins
			if !isClosed(pf.doneCh) || !isClosed(pf.routedCh) || !pf.computed {
				t.Errorf("finish: done %v routed %v computed %v", isClosed(pf.doneCh), isClosed(pf.routedCh), pf.computed)
			}
			if next, lead := h.claim(tc.first, now); next == pf || !lead {
				t.Errorf("after finish the prefix must lead anew")
			}
		})
	}
}

func TestHoldTableBounded(t *testing.T) {
	h := newHoldTable(1)
	now := time.Unix(100, 0)
	for i := range maxPrefills {
		if pf, lead := h.claim(chain(uint64(i+1), 1), now); pf == nil || !lead {
			t.Fatalf("claim %d refused", i)
		}
	}
	if pf, _ := h.claim(chain(1<<20, 1), now); pf != nil {
		t.Fatalf("claim beyond %d tracked", maxPrefills)
	}
	if n := h.expire(now.Add(time.Second)); n != maxPrefills || h.len() != 0 {
		t.Fatalf("expire ended %d, %d left", n, h.len())
	}
}

func TestHoldDeadline(t *testing.T) {
	begun := time.Unix(100, 0)
	cases := []struct {
		elapsed time.Duration
		predMs  float64
		want    time.Duration
	}{
		{0, 40, 40*time.Millisecond + 250*time.Millisecond},
		{30 * time.Millisecond, 40, 10*time.Millisecond + 250*time.Millisecond},
		{time.Second, 40, 250 * time.Millisecond}, // overdue: the margin only
	}
	for _, tc := range cases {
		if got := holdDeadline(begun, tc.predMs, 250*time.Millisecond, begun.Add(tc.elapsed)); got != tc.want {
			t.Errorf("holdDeadline(elapsed %v, pred %v) = %v, want %v", tc.elapsed, tc.predMs, got, tc.want)
		}
	}
}

// holdFixtureWith is a kv dispatcher over deps; with no matcher, the leader is placed by load
// and the followers' blocks are unknown. These fixtures exercise the wait itself, so the hold
// is made to pay: the GPU time it saves weighs a thousandfold (hold.saved_weight) whenever no
// other candidate is idle (on two targets, always). TestHoldPriced prices it for real.
func holdFixtureWith(t *testing.T, mod func(*KVConfig), deps KVDeps) (*Dispatcher, *prometheus.Registry) {
	t.Helper()
	cfg := DefaultKVConfig()
	cfg.Hold.Margin = confval.Duration(20 * time.Millisecond)
	cfg.Hold.SavedWeight = 1000
	if mod != nil {
		mod(&cfg)
	}
	p := newTestKV(t, PolicyKV, cfg, deps, nil)
	p.float = rand.Float64 // safe for the concurrent routes of these tests
	reg := prometheus.NewPedanticRegistry()
	e, err := NewDispatcher(DispatcherOptions{KV: p, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return e, reg
}

type routed struct {
	d   Decision
	lc  Lifecycle
	err error
}

func routeAsync(ctx context.Context, e *Dispatcher, req *Request, cands []Candidate) chan routed {
	ch := make(chan routed, 1)
	go func() {
		d, lc, err := e.Route(ctx, req, cands)
		ch <- routed{d, lc, err}
	}()
	return ch
}

// holdSetup is a kv dispatcher (holdFixtureWith) over n targets with a leader in flight: the
// 100-block prompt base, routed and before its first token.
type holdSetup struct {
	e     *Dispatcher
	cands []Candidate
	base  []kvkey.BlockHash
	ld    Decision
	lead  Lifecycle
}

func newHoldSetup(t *testing.T, mod func(*KVConfig), deps KVDeps, n int) *holdSetup {
	t.Helper()
	e, _ := holdFixtureWith(t, mod, deps)
	s := &holdSetup{e: e, cands: kvCands(n), base: chain(1, 100)}
	var err error
	if s.ld, s.lead, err = e.Route(context.Background(), request(s.base), s.cands); err != nil {
		t.Fatal(err)
	}
	return s
}

func withMargin(d time.Duration) func(*KVConfig) {
	return func(c *KVConfig) { c.Hold.Margin = confval.Duration(d) }
}

// TestHoldFollower: a follower sharing a prefix with a prefill in flight waits, then goes
// where the leader's fate sends it: onto the leader's target once the prefix is computed there
// (its first token, or KV events announcing the shared blocks before a non-streamed leader's
// first byte), even though load alone would send it to the idle target; anew at once when the
// leader fails; back to its caller with the context's error, leaving no goroutine or timer,
// when the client leaves.
func TestHoldFollower(t *testing.T) {
	cases := []struct {
		name    string
		margin  time.Duration
		events  bool // the matcher reports the leader's blocks once told (residentAfter)
		shared  int
		act     func(s *holdSetup, m *residentAfter, cancel context.CancelFunc)
		outcome string // "" for an error return
		onto    bool   // routed onto the leader's target
		minWait float64
	}{
		{"released at the leader's first token", 5 * time.Second, false, 64,
			func(s *holdSetup, _ *residentAfter, _ context.CancelFunc) { s.lead.Sent(); s.lead.FirstToken() },
			holdReleased, true, 40},
		{"released by the index's residency", 5 * time.Second, true, 90,
			func(_ *holdSetup, m *residentAfter, _ context.CancelFunc) { m.set.Store(true) },
			holdReleased, true, 40},
		{"leader failed: routed anew", time.Hour, false, 64,
			func(s *holdSetup, _ *residentAfter, _ context.CancelFunc) { s.lead.Failed(errors.New("worker down")) },
			holdLeaderFailed, false, 40},
		{"client left", time.Hour, false, 64,
			func(_ *holdSetup, _ *residentAfter, cancel context.CancelFunc) { cancel() },
			"", false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := &residentAfter{}
			deps := KVDeps{}
			if tc.events {
				deps.Matcher = m
			}
			s := newHoldSetup(t, withMargin(tc.margin), deps, 2)
			m.t = s.ld.Chosen.Target
			before := runtime.NumGoroutine()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ch := routeAsync(ctx, s.e, request(sharedPrompt(s.base, tc.shared, 2, 8)), s.cands)
			select {
			case r := <-ch:
				t.Fatalf("follower routed while the leader prefills: %s", js(r.d))
			case <-time.After(50 * time.Millisecond):
			}
			tc.act(s, m, cancel)
			var r routed
			select {
			case r = <-ch:
			case <-time.After(2 * time.Second):
				t.Fatal("the follower did not return")
			}
			defer s.lead.Done()
			if tc.outcome == "" {
				if !errors.Is(r.err, context.Canceled) || r.lc != nil {
					t.Fatalf("cancelled hold: %v %v", r.err, r.lc)
				}
				deadline := time.Now().Add(time.Second)
				for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				if n := runtime.NumGoroutine(); n > before {
					t.Errorf("%d goroutines after the cancelled hold, %d before", n, before)
				}
				if got := counterOf(t, s.e.metrics.holds, holdCancelled); got != 1 {
					t.Errorf("holds cancelled = %v, want 1", got)
				}
				return
			}
			if r.err != nil || r.d.Hold == nil || r.d.Hold.Outcome != tc.outcome {
				t.Fatalf("follower: %v %s, want outcome %s", r.err, js(r.d), tc.outcome)
			}
			if r.d.Hold.WaitedMs < tc.minWait {
				t.Errorf("held %.1f ms, want at least %v", r.d.Hold.WaitedMs, tc.minWait)
			}
			if got := counterOf(t, s.e.metrics.holds, tc.outcome); got != 1 {
				t.Errorf("holds{%s} = %v, want 1", tc.outcome, got)
			}
			if tc.onto {
				if r.d.Chosen.Target != s.ld.Chosen.Target || r.d.Hold.SharedBlocks != tc.shared {
					t.Fatalf("follower: %s, want released onto %s sharing %d blocks", js(r.d), s.ld.Chosen.Target, tc.shared)
				}
				if !strings.Contains(r.d.Chosen.Reason, "sibling hold") {
					t.Errorf("reason %q does not name the hold", r.d.Chosen.Reason)
				}
				for _, reason := range []string{"no_hold", holdBusy, "hold_expired"} {
					if got := counterOf(t, s.e.metrics.dup, reason); got != 0 {
						t.Errorf("duplicate prefill{%s} = %v on a released hold", reason, got)
					}
				}
			}
			r.lc.Done()
			s.lead.Done()
			if n := s.e.holds.len(); n != 0 {
				t.Errorf("%d prefills tracked after both ended", n)
			}
		})
	}
}

// TestHoldFallbacks: the hold never applies to a busy target, is off when disabled, and ends
// at its bound; each case routes normally and counts the duplicated prefix.
func TestHoldFallbacks(t *testing.T) {
	cases := []struct {
		name    string
		mod     func(*KVConfig)
		match   fixedMatcher
		outcome string
		dup     string
		dupToks float64
		minWait time.Duration
	}{
		{"busy target", func(c *KVConfig) { c.BusyPrefillTokens = 1 }, nil, holdBusy, holdBusy, 70 * 16, 0},
		{"disabled", func(c *KVConfig) { c.Hold.Enabled = false }, nil, holdDisabled, "no_hold", 70 * 16, 0},
		{"expired", nil, nil, holdExpired, "hold_expired", 70 * 16, 20 * time.Millisecond},
		// An earlier request left the prefix cached on both targets: nothing to wait for.
		{"already cached", func(c *KVConfig) { c.Hold.Margin = confval.Duration(time.Hour) },
			fixedMatcher{tgt(0): {G1: 70}, tgt(1): {G1: 70}}, holdCached, "no_hold", 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			deps := KVDeps{}
			if tc.match != nil {
				deps.Matcher = tc.match
			}
			s := newHoldSetup(t, tc.mod, deps, 2)
			e := s.e
			defer s.lead.Done()
			start := time.Now()
			d, lc, err := e.Route(context.Background(), request(sharedPrompt(s.base, 70, 2, 8)), s.cands)
			if err != nil {
				t.Fatal(err)
			}
			defer lc.Done()
			if d.Hold == nil || d.Hold.Outcome != tc.outcome {
				t.Fatalf("follower: %s, want outcome %s", js(d), tc.outcome)
			}
			if waited := time.Since(start); waited < tc.minWait {
				t.Errorf("waited %v, want at least %v", waited, tc.minWait)
			}
			if got := counterOf(t, e.metrics.holds, tc.outcome); got != 1 {
				t.Errorf("holds{%s} = %v, want 1", tc.outcome, got)
			}
			// The 70 shared blocks are computed again on the other target: the leader is still
			// prefilling on its own.
			if got := counterOf(t, e.metrics.dup, tc.dup); got != tc.dupToks {
				t.Errorf("duplicate prefill{%s} = %v tokens, want %v", tc.dup, got, tc.dupToks)
			}
		})
	}
}

// TestRegretReason: the regret is the best G1 minus the chosen one's, with why it lost.
func TestRegretReason(t *testing.T) {
	cases := []struct {
		name   string
		mod    func(*KVConfig)
		want   string
		blocks int
	}{
		{"busy best", func(c *KVConfig) { c.BusyPrefillTokens = 1 }, "busy", 40},
		{"no regret", nil, "", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultKVConfig()
			if tc.mod != nil {
				tc.mod(&cfg)
			}
			p := newTestKV(t, PolicyKV, cfg, KVDeps{Matcher: fixedMatcher{tgt(0): {G1: 50}, tgt(1): {G1: 10}}}, nil)
			cands := kvCands(2)
			if tc.want == "busy" {
				p.load.Begin(tgt(0), request(chain(9, 4)), 0) // target 0 has prefill in flight: busy
			}
			d, err := p.Pick(context.Background(), request(chain(1, 60)), cands)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == "" {
				if d.Regret != nil {
					t.Fatalf("regret %s on the best match", js(d.Regret))
				}
				return
			}
			if d.Regret == nil || d.Regret.Reason != tc.want || d.Regret.Blocks != tc.blocks || d.Regret.Best != tgt(0) {
				t.Fatalf("regret %s, want %d blocks for %s", js(d.Regret), tc.blocks, tc.want)
			}
			if want := `"regret":{"blocks":40,`; !strings.Contains(js(d), want) {
				t.Errorf("decision JSON (POST /debug/route) lacks %s: %s", want, js(d))
			}
		})
	}
}

func counterOf(t *testing.T, cv *prometheus.CounterVec, label string) float64 {
	t.Helper()
	var m dto.Metric
	if err := cv.WithLabelValues(label).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// residentAfter reports every block resident on one target once its flag is set (the KV events
// announcing a prefill that has not sent its first byte yet).
type residentAfter struct {
	t   kvkey.Target
	set atomic.Bool
}

func (m *residentAfter) MatchTiers(hashes []kvkey.BlockHash, targets []kvkey.Target, out []indexers.TierMatch) {
	for i, t := range targets {
		out[i] = indexers.TierMatch{}
		if t == m.t && m.set.Load() {
			out[i].G1 = len(hashes)
		}
	}
}

// TestHoldManyFollowers: of many requests with one prefix routed at once, exactly one leads;
// every other one is released onto its target after its first token (the three other targets
// report requests waiting that the gateway did not send: the hold is the faster choice).
func TestHoldManyFollowers(t *testing.T) {
	e, _ := holdFixtureWith(t, withMargin(5*time.Second), KVDeps{})
	cands, base := kvCands(4), chain(1, 100)
	for i := 1; i < 4; i++ {
		e.kv.load.UpdateMetrics(tgt(i), WorkerMetrics{Waiting: 8, Running: 1})
	}
	ld, lead, err := e.Route(context.Background(), request(base), cands)
	if err != nil || ld.Chosen.Target != tgt(0) {
		t.Fatalf("leader: %v %s, want the idle %s", err, js(ld), tgt(0))
	}
	var chs []chan routed
	for i := range 8 {
		chs = append(chs, routeAsync(context.Background(), e, request(sharedPrompt(base, 64+i, uint64(10+i), 4)), cands))
	}
	time.Sleep(20 * time.Millisecond)
	lead.FirstToken()
	lead.Done()
	for _, ch := range chs {
		r := <-ch
		if r.err != nil || r.d.Chosen.Target != ld.Chosen.Target || r.d.Hold == nil || r.d.Hold.Outcome != holdReleased {
			t.Errorf("follower: %v %s", r.err, js(r.d))
			continue
		}
		r.lc.Done()
	}
	if got := counterOf(t, e.metrics.holds, holdReleased); got != 8 {
		t.Errorf("released %v, want 8", got)
	}
}
