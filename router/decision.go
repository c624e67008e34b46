package router

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
)

// HeaderCachedBlocks is the response header carrying the chosen target's G1 match in blocks
// (the blocks the gateway expected the worker to find cached on GPU).
const HeaderCachedBlocks = "X-Kvgate-Cached-Blocks"

// ChosenScore returns the candidate row of the chosen target, if the decision has one.
func ChosenScore(d Decision) (CandidateScore, bool) {
	for _, c := range d.Candidates {
		if c.Target == d.Chosen.Target {
			return c, true
		}
	}
	return CandidateScore{}, false
}

// CachedBlocks returns the chosen target's G1 blocks (0 when the policy did not match blocks).
func CachedBlocks(d Decision) int {
	c, _ := ChosenScore(d)
	return c.G1Blocks
}

// CachedBlocksHeader is the value of HeaderCachedBlocks for a decision.
func CachedBlocksHeader(d Decision) string { return strconv.Itoa(CachedBlocks(d)) }

// costEps is the relative tolerance under which two costs tie.
const costEps = 1e-9

func tied(a, b float64) bool { return math.Abs(a-b) <= costEps*math.Max(1, math.Abs(b)) }

// decide picks among evaluated rows and builds the decision record.
func (p *KVPolicy) decide(req *Request, cands []Candidate, rows []kvRow) Decision {
	d := Decision{
		PromptTokens: req.PromptTokens,
		PromptBlocks: len(req.BlockHashes),
		Policy:       p.name,
		Candidates:   make([]CandidateScore, len(rows)),
	}
	busy := 0
	for i := range rows {
		r := &rows[i]
		d.Candidates[i] = CandidateScore{
			Target: cands[i].Target, Mode: r.mode,
			G1Blocks: r.match.G1, G2Blocks: r.match.G2, G3Blocks: r.match.G3,
			Load: r.load, TTFTMs: r.ttft, Cost: r.cost, EvictMs: r.evict, OverflowMs: r.overflow, RecomputeMs: r.recompute, QueueLoss: r.queueLoss, Busy: r.busy,
		}
		if r.busy {
			busy++
		}
	}
	allBusy := busy == len(rows)
	eligible := func(i int) bool { return allBusy || !rows[i].busy }

	chosen, ties := p.pick(rows, eligible)
	r := &rows[chosen]
	d.Chosen.Target = cands[chosen].Target

	// The common reason is built with appends: this runs on every request.
	buf := make([]byte, 0, 160)
	if p.cfg.Temperature > 0 {
		buf = append(buf, "softmax draw at temperature "...)
		buf = strconv.AppendFloat(buf, p.cfg.Temperature, 'g', -1, 64)
		buf = append(buf, ": cost "...)
	} else {
		buf = append(buf, "lowest cost "...)
	}
	buf = strconv.AppendFloat(buf, r.cost, 'g', 4, 64)
	if p.timed != nil {
		buf = append(buf, " ms"...) // kv: predicted TTFT (+ fleet term); load is queue + decodes, ms
	}
	buf = append(buf, " ("...)
	buf = append(buf, r.mode...)
	buf = append(buf, ": g1 "...)
	buf = strconv.AppendInt(buf, int64(r.match.G1), 10)
	buf = append(buf, ", g2 "...)
	buf = strconv.AppendInt(buf, int64(r.match.G2), 10)
	buf = append(buf, ", g3 "...)
	buf = strconv.AppendInt(buf, int64(r.match.G3), 10)
	buf = append(buf, " of "...)
	buf = strconv.AppendInt(buf, int64(len(req.BlockHashes)), 10)
	buf = append(buf, " blocks; load "...)
	buf = strconv.AppendFloat(buf, r.load, 'g', 4, 64)
	buf = append(buf, ')')
	b := bytes.NewBuffer(buf)
	if ties > 1 {
		fmt.Fprintf(b, "; tie among %d broken at random", ties)
	}
	hintDecided := false
	if r.hint > 0 {
		// Did the hint decide? Compare with the best cost the eligible rows have without hints.
		best := math.Inf(1)
		for i := range rows {
			if eligible(i) {
				best = math.Min(best, rows[i].costNoHnt)
			}
		}
		verdict := "agreed"
		if !tied(r.costNoHnt, best) && r.costNoHnt > best {
			verdict = "decided"
			hintDecided = true
		}
		fmt.Fprintf(b, "; session rule %s (+%.4g blocks) %s", r.hintRule, r.hint, verdict)
	}
	switch {
	case allBusy && busy > 0:
		fmt.Fprintf(b, "; all %d targets over busy thresholds (%s)", busy, r.busyWhy)
	case busy > 0:
		fmt.Fprintf(b, "; avoided %d busy target(s)", busy)
		for i := range rows {
			if rows[i].busy {
				fmt.Fprintf(b, " [%s: %s]", cands[i].Target, rows[i].busyWhy)
				break
			}
		}
	}
	d.Chosen.Reason = b.String()
	d.Regret = p.regretOf(rows, cands, chosen, allBusy, hintDecided)
	return d
}

// regretOf returns the decision's regret (nil when the chosen row has the best G1 match) with
// the reason the best row lost: busy, hint, temperature or load.
func (p *KVPolicy) regretOf(rows []kvRow, cands []Candidate, chosen int, allBusy, hintDecided bool) *Regret {
	best := chosen
	for i := range rows {
		if rows[i].match.G1 > rows[best].match.G1 {
			best = i
		}
	}
	if best == chosen {
		return nil
	}
	reason := "load"
	switch {
	case rows[best].busy && !allBusy:
		reason = "busy"
	case hintDecided:
		reason = "hint"
	case p.cfg.Temperature > 0:
		reason = "temperature"
	}
	return &Regret{Blocks: rows[best].match.G1 - rows[chosen].match.G1, Best: cands[best].Target,
		BestG1: rows[best].match.G1, Reason: reason}
}

// pick returns the chosen row and how many eligible rows tied at the lowest cost (T = 0).
// T = 0: argmin, ties broken uniformly at random by reservoir sampling. T > 0: a draw with
// p_i ∝ exp(−(c_i − c_min)/((c_max − c_min)·T)), uniform when all costs are equal
// (Dynamo lib/kv-router/src/scheduling/selector/default.rs, softmax_sample_index).
func (p *KVPolicy) pick(rows []kvRow, eligible func(int) bool) (int, int) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range rows {
		if eligible(i) {
			lo = math.Min(lo, rows[i].cost)
			hi = math.Max(hi, rows[i].cost)
		}
	}
	if p.cfg.Temperature > 0 && !tied(lo, hi) {
		scale := (hi - lo) * p.cfg.Temperature
		sum := 0.0
		for i := range rows {
			if eligible(i) {
				sum += math.Exp(-(rows[i].cost - lo) / scale)
			}
		}
		x := p.float() * sum
		last := -1
		for i := range rows {
			if !eligible(i) {
				continue
			}
			last = i
			x -= math.Exp(-(rows[i].cost - lo) / scale)
			if x < 0 {
				return i, 1
			}
		}
		return last, 1 // rounding left x ≥ 0: the last eligible row
	}
	chosen, ties := -1, 0
	for i := range rows {
		if !eligible(i) || !tied(rows[i].cost, lo) {
			continue
		}
		ties++
		if ties == 1 || p.float()*float64(ties) < 1 {
			chosen = i
		}
	}
	return chosen, ties
}
