package router

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/kvkey"
)

// TestPriceHold: the decision rule alone. Holding costs the wait plus the suffix; not holding
// costs the best other target's TTFT plus the saved GPU time weighted by the load share.
func TestPriceHold(t *testing.T) {
	cases := []struct {
		name     string
		in       holdPrices
		wantHold bool
		wantTerm float64
	}{
		{"no other target holds", holdPrices{waitMs: 500, suffixMs: 30}, true, 0},
		{"idle fleet: a whole prefill elsewhere is sooner", holdPrices{waitMs: 48, suffixMs: 28, hasElse: true, elseMs: 45, savedMs: 16, loadShare: 0, weight: 1}, false, 0},
		{"leader nearly done: waiting is sooner", holdPrices{waitMs: 5, suffixMs: 28, hasElse: true, elseMs: 45, savedMs: 16, loadShare: 0, weight: 1}, true, 0},
		{"tie holds (computed once)", holdPrices{waitMs: 17, suffixMs: 28, hasElse: true, elseMs: 45, weight: 1}, true, 0},
		{"loaded fleet: the saved GPU time tips it", holdPrices{waitMs: 25, suffixMs: 28, hasElse: true, elseMs: 45, savedMs: 16, loadShare: 1, weight: 1}, true, 16},
		{"half loaded: half the saved time", holdPrices{waitMs: 25, suffixMs: 28, hasElse: true, elseMs: 45, savedMs: 16, loadShare: 0.5, weight: 1}, true, 8},
		{"weight 0: TTFTs alone", holdPrices{waitMs: 25, suffixMs: 28, hasElse: true, elseMs: 45, savedMs: 16, loadShare: 1, weight: 0}, false, 0},
		{"overdue leader waits nothing", holdPrices{waitMs: -30, suffixMs: 28, hasElse: true, elseMs: 45, weight: 1}, true, 0},
		{"negative saving counts nothing", holdPrices{waitMs: 20, suffixMs: 28, hasElse: true, elseMs: 45, savedMs: -5, loadShare: 1, weight: 1}, false, 0},
		{"share clamped to 1", holdPrices{waitMs: 40, suffixMs: 28, hasElse: true, elseMs: 45, savedMs: 16, loadShare: 3, weight: 1}, false, 16},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := priceHold(tc.in)
			if c.Hold != tc.wantHold || math.Abs(c.SavedTermMs-tc.wantTerm) > 1e-9 {
				t.Fatalf("priceHold(%+v) = %s, want hold %v with a saved term of %v ms", tc.in, js(c), tc.wantHold, tc.wantTerm)
			}
			if c.HoldMs != c.WaitMs+c.SuffixMs || c.WaitMs < 0 {
				t.Errorf("hold_ms %v ≠ wait %v + suffix %v", c.HoldMs, c.WaitMs, c.SuffixMs)
			}
		})
	}
}

// pricedFixture is a kv dispatcher with the default config but for hold.saved_weight, a fake
// clock, n targets and the 100-block leader base routed to target at (target 0 when the others
// are loaded: they report requests waiting that the gateway did not send).
type pricedFixture struct {
	e     *Dispatcher
	clk   *fakeClock
	cands []Candidate
	base  []kvkey.BlockHash
	at    kvkey.Target
	lead  Lifecycle
}

func newPricedFixture(t *testing.T, n int, weight float64, loaded bool) *pricedFixture {
	return newPricedFixtureWith(t, n, weight, loaded, 0)
}

// newPricedFixtureWith is newPricedFixture with a prompt of inflight blocks (below
// hold.min_blocks: no leader) routed to each target but 0 first, before its first token.
func newPricedFixtureWith(t *testing.T, n int, weight float64, loaded bool, inflight int) *pricedFixture {
	t.Helper()
	cfg := DefaultKVConfig()
	cfg.Hold.SavedWeight = weight
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := newTestKV(t, PolicyKV, cfg, KVDeps{}, clk)
	e, err := NewDispatcher(DispatcherOptions{KV: p, Registerer: prometheus.NewPedanticRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	f := &pricedFixture{e: e, clk: clk, cands: kvCands(n), base: chain(1, 100)}
	if loaded {
		for i := 1; i < n; i++ {
			p.load.UpdateMetrics(tgt(i), WorkerMetrics{Waiting: 8, Running: 1})
		}
	}
	if inflight > 0 {
		for i := 1; i < n; i++ {
			d := Decision{Chosen: Choice{Target: tgt(i)}, Candidates: []CandidateScore{{Target: tgt(i)}}}
			a := e.commit(d, request(chain(uint64(50+i), inflight)), 0, "")
			t.Cleanup(a.Done)
		}
	}
	d, lead, err := e.Route(context.Background(), request(f.base), f.cands)
	if err != nil {
		t.Fatal(err)
	}
	if loaded && d.Chosen.Target != tgt(0) {
		t.Fatalf("leader: %s, want the idle %s", js(d), tgt(0))
	}
	f.at, f.lead = d.Chosen.Target, lead
	return f
}

// TestHoldPriced: the sibling hold is a priced choice on the kv time model (default prior).
// At once, with idle targets, a whole prefill elsewhere beats the wait plus the suffix: not
// held, counted as faster_elsewhere, with the duplicated prefix. A leader nearly done, or loaded
// alternatives, make the hold the faster choice; on two targets the saved GPU time decides a
// middle case, and hold.saved_weight 0 turns that off. POST /debug/route (Dispatcher.Pick)
// shows the same choice without waiting.
func TestHoldPriced(t *testing.T) {
	cases := []struct {
		name     string
		n        int
		weight   float64
		loaded   bool
		elapsed  time.Duration // since the leader was routed, on the fake clock
		inflight int           // blocks of a prompt in flight on every other target (newPricedFixtureWith)
		held     bool
	}{
		{"idle fleet, sibling at once", 4, 1, false, 0, 0, false},
		{"leader nearly done", 4, 1, false, 45 * time.Millisecond, 0, true},
		{"loaded alternatives", 4, 1, true, 0, 0, true},
		// One prefill in flight on every other worker is no queue: nobody waits behind a
		// duplicate, so the saved GPU time does not count (it would tip this case).
		{"others computing one prefill each: TTFTs alone", 4, 1, false, 15 * time.Millisecond, 40, false},
		{"two targets: the saved GPU time tips it", 2, 1, false, 25 * time.Millisecond, 0, true},
		{"two targets, saved_weight 0: TTFTs alone", 2, 0, false, 25 * time.Millisecond, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newPricedFixtureWith(t, tc.n, tc.weight, tc.loaded, tc.inflight)
			e := f.e
			defer f.lead.Done()
			f.clk.advance(tc.elapsed)
			req := request(sharedPrompt(f.base, 72, 2, 8))

			preview, err := e.Pick(context.Background(), req, f.cands)
			if err != nil {
				t.Fatal(err)
			}
			wantPreview := holdFaster
			if tc.held {
				wantPreview = holdWould
			}
			if h := preview.Hold; h == nil || h.Outcome != wantPreview || h.Cost == nil || h.Target != f.at {
				t.Fatalf("POST /debug/route's hold: %s, want %s on %s with its cost", js(preview), wantPreview, f.at)
			}

			ch := routeAsync(context.Background(), e, req, f.cands)
			var r routed
			if tc.held {
				select {
				case r = <-ch:
					t.Fatalf("follower routed while the leader prefills: %s", js(r.d))
				case <-time.After(30 * time.Millisecond):
				}
				f.lead.Sent()
				f.lead.FirstToken()
			}
			select {
			case r = <-ch:
			case <-time.After(2 * time.Second):
				t.Fatal("the follower did not return")
			}
			if r.err != nil {
				t.Fatal(r.err)
			}
			defer r.lc.Done()
			h := r.d.Hold
			if h == nil || h.Cost == nil {
				t.Fatalf("follower: %s, want a priced hold record", js(r.d))
			}
			c := h.Cost
			if c.Hold != tc.held || c.Hold != (c.HoldMs <= c.ElseMs+c.SavedTermMs) || c.Else == nil {
				t.Fatalf("cost %s, want hold %v, consistent, with an alternative", js(c), tc.held)
			}
			if !(c.WaitMs >= 0 && c.SuffixMs > 0 && c.ElseMs > 0) || c.SavedMs <= 0 {
				t.Errorf("cost %s: every predicted alternative must be positive", js(c))
			}
			holds := e.metrics.holds
			if tc.held {
				if h.Outcome != holdReleased || r.d.Chosen.Target != f.at {
					t.Fatalf("held follower: %s, want released onto %s", js(r.d), f.at)
				}
				if got := counterOf(t, holds, holdFaster); got != 0 {
					t.Errorf("holds{faster_elsewhere} = %v on a held follower", got)
				}
				return
			}
			if h.Outcome != holdFaster || r.d.Chosen.Target == f.at || r.d.Chosen.Target != *c.Else {
				t.Fatalf("follower: %s, want faster_elsewhere on the priced alternative %s", js(r.d), c.Else)
			}
			if !strings.Contains(r.d.Chosen.Reason, "faster elsewhere") {
				t.Errorf("reason %q does not say why it was not held", r.d.Chosen.Reason)
			}
			if got := counterOf(t, holds, holdFaster); got != 1 {
				t.Errorf("holds{faster_elsewhere} = %v, want 1", got)
			}
			// The 72 shared blocks are computed a second time there.
			if got := counterOf(t, e.metrics.dup, holdFaster); got != 72*16 {
				t.Errorf("duplicate prefill{faster_elsewhere} = %v tokens, want %d", got, 72*16)
			}
		})
	}
}

// TestHoldCostQueue: the suffix's predicted TTFT on the leader's target counts what was routed
// there after the leader and the followers already held beside it, not what the leader's
// first token drains (routed before it).
func TestHoldCostQueue(t *testing.T) {
	f := newPricedFixture(t, 2, 1, false)
	e := f.e
	defer f.lead.Done()
	req := request(sharedPrompt(f.base, 72, 2, 8))
	suffix := func(heldTokens float64) float64 {
		t.Helper()
		pf := e.holds.peek(req.BlockHashes)
		if pf == nil {
			t.Fatal("the leader's prefill is not tracked")
		}
		lv := e.holds.snapshot(pf)
		lv.heldTokens = heldTokens
		d, err := e.pick(context.Background(), req, f.cands)
		if err != nil {
			t.Fatal(err)
		}
		return e.kv.holdCostOf(req, d, lv, 72, e.kv.now()).SuffixMs
	}
	alone := suffix(0)
	if withHeld := suffix(2000); !(withHeld > alone) {
		t.Errorf("suffix with 2,000 held tokens beside it %v, alone %v: want longer", withHeld, alone)
	}
	// A 40-block prompt (below min_blocks: not a leader) routed to the leader's target after
	// it queues ahead of the released follower.
	d := Decision{Chosen: Choice{Target: f.at}, Candidates: []CandidateScore{{Target: f.at}}}
	after := e.commit(d, request(chain(7, 40)), 0, "")
	defer after.Done()
	if got := suffix(0); !(got > alone) {
		t.Errorf("suffix after a prompt routed behind the leader %v, alone %v: want longer", got, alone)
	}
}
