package router

import (
	"math"
	"time"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router/latency"
)

// HoldCost is the priced choice of a sibling hold under kv (HoldRecord.Cost): holding costs
// the wait for the prefix plus the cached suffix's TTFT on the first request's target; not
// holding costs the best other target's TTFT for the whole prompt now, plus, when the fleet
// is loaded, the GPU time the duplicate prefill takes from the requests that come next. The
// request is held when HoldMs ≤ ElseMs + SavedTermMs. All times are the time model's
// predictions, in ms.
type HoldCost struct {
	// WaitMs is the first request's predicted TTFT left: the wait for the prefix.
	WaitMs float64 `json:"wait_ms"`
	// SuffixMs is the predicted TTFT on the first request's target once the prefix is
	// computed there: the uncached suffix after the shared prefix, queued behind what was
	// routed there after the first request and the suffixes of the requests held with this one.
	SuffixMs float64 `json:"suffix_ms"`
	// HoldMs is WaitMs + SuffixMs.
	HoldMs float64 `json:"hold_ms"`
	// Else is where the request goes if not held: the policy's choice now, or the best other
	// candidate when the policy chose the first request's target (absent when there is none);
	// ElseMs its predicted TTFT for the prompt (0 without one).
	Else   *kvkey.Target `json:"else,omitempty"`
	ElseMs float64       `json:"else_ms"`
	// SavedMs is the GPU prefill time the hold saves: the prompt's prefill on Else minus the
	// suffix's on the first request's target.
	SavedMs float64 `json:"saved_ms"`
	// LoadShare is the share of the other candidates (all but the first request's target and
	// Else) with requests queued (the worker reports some waiting, or the prefill routed there
	// and not started exceeds one step's token budget) or over a busy threshold, 1 when there
	// are none: the chance that the next request waits behind the duplicate prefill.
	LoadShare float64 `json:"load_share"`
	// SavedTermMs is hold.saved_weight × LoadShare × SavedMs, added to ElseMs.
	SavedTermMs float64 `json:"saved_term_ms"`
	// Hold is the choice: HoldMs ≤ ElseMs + SavedTermMs, or no other candidate.
	Hold bool `json:"hold"`
}

// holdPrices are the predicted alternatives of one hold decision, in ms.
type holdPrices struct {
	waitMs, suffixMs float64
	hasElse          bool
	elseMs           float64
	savedMs          float64 // GPU prefill ms the hold saves (clamped at 0)
	loadShare        float64 // 0..1
	weight           float64 // hold.saved_weight
}

// priceHold is the hold's decision rule (pure): hold when waiting for the prefix and then
// computing the suffix is predicted no slower than the whole prompt on the best other target
// now, that target's time raised by the GPU time the hold saves, weighted by how loaded the
// rest of the fleet is. Ties hold (the prefix is then computed once). With no other target,
// hold.
func priceHold(in holdPrices) HoldCost {
	c := HoldCost{WaitMs: math.Max(in.waitMs, 0), SuffixMs: in.suffixMs}
	c.HoldMs = c.WaitMs + c.SuffixMs
	if !in.hasElse {
		c.Hold = true
		return c
	}
	c.ElseMs = in.elseMs
	c.SavedMs = math.Max(in.savedMs, 0)
	c.LoadShare = math.Min(math.Max(in.loadShare, 0), 1)
	c.SavedTermMs = in.weight * c.LoadShare * c.SavedMs
	c.Hold = c.HoldMs <= c.ElseMs+c.SavedTermMs
	return c
}

// suffixOf is the uncached and cached tokens of req on a target holding its first shared
// blocks (the last prompt token is always computed, as beginTime counts it).
func suffixOf(req *Request, shared int) (u, c float64) {
	bs := blockSizeOf(req)
	prompt := float64(max(req.PromptTokens, len(req.BlockHashes)*bs))
	c = math.Min(float64(shared*bs), math.Max(prompt-1, 0))
	return math.Max(prompt-c, 0), c
}

// holdCostOf prices holding req for the prefix its leader (lv) is computing on lv.target
// against d's best other candidate; nil when the policy does not score by time (kv_blocks: the
// hold is not priced there). d is the policy's decision for req now.
func (p *KVPolicy) holdCostOf(req *Request, d Decision, lv leaderView, shared int, now time.Time) *HoldCost {
	if p.timed == nil {
		return nil
	}
	bs := float64(blockSizeOf(req))
	u, c := suffixOf(req, shared)
	in := holdPrices{weight: p.cfg.Hold.SavedWeight}

	// The leader's target once the prefix is computed there: of the gateway's queue, only
	// what was routed after the leader stays ahead (FIFO); the peers' share and the worker's
	// unseen waiting requests stay as they are; the followers held with this one are released
	// at the same moment and queue beside it.
	st, th, _, _, _ := p.scoreState(lv.target, bs, now)
	gw, _ := p.timed.state(lv.target)
	afterTok, afterPairs := gw.AheadTokens, gw.AheadPairs
	if tt := p.timed.get(lv.target); tt != nil && lv.mark.ok {
		afterTok = math.Min(afterTok, math.Max(float64(tt.routedU.Load()-lv.mark.tokens), 0))
		afterPairs = math.Min(afterPairs, math.Max(float64(tt.routedPairs.Load()-lv.mark.pairs), 0))
	}
	after := st
	after.AheadTokens = afterTok + (st.AheadTokens - gw.AheadTokens) + lv.heldTokens
	after.AheadPairs = afterPairs + (st.AheadPairs - gw.AheadPairs) + lv.heldPairs
	in.suffixMs = latency.PredictTTFT(th, p.timed.params, after, latency.Req{Uncached: u, Cached: c}).TotalMs
	in.waitMs = float64(lv.begun.Add(time.Duration(lv.predMs*float64(time.Millisecond))).Sub(now)) / float64(time.Millisecond)

	// The other candidate: the policy's own choice when that is not the leader's target (its
	// ties broken and temperature drawn), else the best other one by the policy's cost (not
	// busy unless all are).
	allBusy := true
	for _, r := range d.Candidates {
		allBusy = allBusy && r.Busy
	}
	best := -1
	for i, r := range d.Candidates {
		if r.Target == lv.target || (r.Busy && !allBusy) {
			continue
		}
		if r.Target == d.Chosen.Target {
			best = i
			break
		}
		if best < 0 || r.Cost < d.Candidates[best].Cost {
			best = i
		}
	}
	if best < 0 {
		return ptr(priceHold(in))
	}
	alt := d.Candidates[best]
	in.hasElse, in.elseMs = true, alt.TTFTMs
	prompt := u + c
	credit := float64(alt.G1Blocks) + p.cfg.G2Credit*float64(alt.G2Blocks) + p.cfg.G3Credit*float64(alt.G3Blocks)
	cAlt := math.Min(credit*bs, math.Max(prompt-1, 0))
	_, thAlt := p.timed.state(alt.Target)
	in.savedMs = latency.PrefillMs(thAlt, prompt-cAlt, cAlt) - latency.PrefillMs(th, u, c)

	others, loaded := 0, 0
	for _, r := range d.Candidates {
		if r.Target == lv.target || r.Target == alt.Target {
			continue
		}
		others++
		if r.Busy {
			loaded++
			continue
		}
		// Queued: requests wait there beyond the step in progress (the worker reports some
		// waiting, or the prefill ahead exceeds one step's token budget). One prefill in
		// flight is not a queue: at light load the duplicate delays nobody.
		s, _, _, m, fresh := p.scoreState(r.Target, bs, now)
		if (fresh && m.Waiting > 0) || s.AheadTokens >= float64(p.timed.params.MaxBatchedTokens) {
			loaded++
		}
	}
	in.loadShare = 1
	if others > 0 {
		in.loadShare = float64(loaded) / float64(others)
	}
	out := priceHold(in)
	out.Else = &alt.Target
	return &out
}

func ptr[T any](v T) *T { return &v }
