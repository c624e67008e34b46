package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/sessions"
)

// Policy names of the KV-aware policies.
const (
	PolicyKV       = "kv"
	PolicyKVNoLoad = "kv_no_load"
	PolicyKVBlocks = "kv_blocks"
)

// KVPolicy is the KV-aware policy (docs/ARCHITECTURE.md, "Routing cost"). Under `kv` the cost
// of a target is the predicted time to first token there, in ms (kv_time_score.go, router/latency):
// the prefill queued ahead, the request's own uncached prefill with its attention over the
// cached context, the running decodes' share of those steps and a KV-pressure term, plus the
// fleet term (this prefill stretches the steps of the target's running decodes), minus the
// prefill a session preference hint would save. Each target's
// coefficients are fitted online from the TTFTs the gateway observes.
//
// Under `kv_blocks` (the older cost, a baseline; after Dynamo's
// lib/kv-router/src/scheduling/selector/default.rs worker_logit), per target in KV blocks:
//
//	credit  = G1 + g2_credit·G2 + g3_credit·G3 + sibling-prefix hint blocks
//	prefill = max(prompt blocks − credit, 0)
//	load    = prefill_load_weight·(prompt tokens in flight)/block_size
//	        + decode_weight·(blocks held by active requests − those this prompt shares)
//	        + request_weight·active requests + waiting_weight·waiting requests not ours
//	cost    = prefill_weight·(prefill − preference hint blocks) + load
//
// Preference hints (affinity, parent, lineage root, sibling group) are subtracted outside the
// clamp, so they can still separate targets that all hold the whole prompt; a sibling's
// in-flight prefix is cache credit and is clamped like the tiers.
//
// The lowest cost wins, ties at random; with a temperature, a softmax draw. Busy targets are
// avoided while any other is not. Unlike Dynamo, the overlap credit offsets only this request's
// own prompt, never the prefill other requests already queued on the target. In kv_no_load
// mode the load term and the busy thresholds are off: overlap (and hints) only.
type KVPolicy struct {
	name    string
	cfg     KVConfig
	noLoad  bool
	timed   *timeModel       // the predicted-TTFT cost (kv); nil scores in blocks
	matcher indexers.Matcher // exact: read for targets whose events are healthy
	routed  RoutedRecorder   // the matcher, when it records routed prompts
	events  EventHealth
	approx  *indexers.ApproxIndex // approximate: read for the others
	recent  *recentRoutes         // prompts routed to healthy targets, for approx (kv_recent.go)
	load    *LoadTracker
	fleet   atomic.Pointer[Fleet] // the peers' load and the publishers, when clustered (SetFleet)
	hints   HintSource
	now     func() time.Time
	float   func() float64 // uniform [0,1); replaced in tests for determinism
	scratch sync.Pool      // *kvScratch
}

// kvScratch holds per-decision buffers, pooled to keep the hot path allocation-light.
type kvScratch struct {
	targets []kvkey.Target
	matches []indexers.TierMatch
	approx  []indexers.TierMatch
	rows    []kvRow
	times   []timeRow
}

// kvRow is one candidate's evaluation.
type kvRow struct {
	mode      string
	match     indexers.TierMatch
	hint      float64
	prefHint  float64 // the part of hint from preference rules, applied beyond the clamp
	hintRule  string
	prefill   float64 // uncached prompt blocks after credits (hints included)
	noHint    float64 // the same without hints, to tell whether a hint decided
	load      float64
	ttft      float64 // kv: the predicted TTFT alone (no hint, eviction, fleet or recompute term), ms
	evict     float64 // kv: the eviction terms (overflow included), ms
	overflow  float64 // kv: the overflow term, ms
	recompute float64 // kv: the recompute term, ms
	queueLoss float64 // kv: the share of the cached prefix priced as lost to the queue ahead
	busy      bool
	busyWhy   string
	cost      float64
	costNoHnt float64
}

// NewKV returns the `kv` policy: cost = predicted TTFT in ms. A zero cfg means
// DefaultKVConfig().
func NewKV(cfg KVConfig, deps KVDeps) (*KVPolicy, error) {
	return newKV(PolicyKV, false, cfg, deps)
}

// NewKVBlocks returns the `kv_blocks` policy: the cost in KV blocks (overlap plus block load),
// kept as a baseline. A zero cfg means DefaultKVConfig().
func NewKVBlocks(cfg KVConfig, deps KVDeps) (*KVPolicy, error) {
	return newKV(PolicyKVBlocks, false, cfg, deps)
}

// NewKVNoLoad returns the `kv_no_load` policy: overlap (and session hints) only. A zero cfg
// means DefaultKVConfig().
func NewKVNoLoad(cfg KVConfig, deps KVDeps) (*KVPolicy, error) {
	return newKV(PolicyKVNoLoad, true, cfg, deps)
}

func newKV(name string, noLoad bool, cfg KVConfig, deps KVDeps) (*KVPolicy, error) {
	if reflect.DeepEqual(cfg, KVConfig{}) {
		cfg = DefaultKVConfig()
	}
	if err := validateKV(cfg); err != nil {
		return nil, fmt.Errorf("%s policy: %w", name, err)
	}
	p := &KVPolicy{
		name: name, cfg: cfg, noLoad: noLoad,
		matcher: deps.Matcher, events: deps.Events, approx: deps.Approx, load: deps.Load, hints: deps.Hints,
		now: time.Now, float: rand.Float64,
	}
	if p.load == nil {
		p.load = NewLoadTracker(cfg.LoadExpiry.D())
	}
	if name == PolicyKV {
		tm, err := newTimeModel(cfg.Latency, cfg.Approximate.TTL.D())
		if err != nil {
			return nil, fmt.Errorf("%s policy: %w", name, err)
		}
		p.timed = tm
	}
	p.routed, _ = deps.Matcher.(RoutedRecorder)
	if p.approx != nil && p.matcher != nil {
		p.recent = newRecentRoutes()
	}
	p.scratch.New = func() any { return &kvScratch{} }
	return p, nil
}

// Name returns "kv", "kv_blocks" or "kv_no_load".
func (p *KVPolicy) Name() string { return p.name }

// Config returns the policy's configuration.
func (p *KVPolicy) Config() KVConfig { return p.cfg }

// Load returns the load tracker the policy reads.
func (p *KVPolicy) Load() *LoadTracker { return p.load }

// Approx returns the approximate index the policy reads (nil if none).
func (p *KVPolicy) Approx() *indexers.ApproxIndex { return p.approx }

// Begin accounts the request's load on the chosen target and, in
// predict-on-route fashion, records its blocks there in the approximate index (the chosen
// worker is about to compute them; this also covers the burst of identical prompts that
// arrives before the worker's KV events do) when that target is scored approximately; for a
// target whose events are healthy it only keeps the prompt, to record if they stop being
// healthy (kv_recent.go). When the matcher is a RoutedRecorder it also hands it the prompt's
// hashes, so the event index can place the worker's coming stores even if it lost their
// parents.
func (p *KVPolicy) Begin(d Decision, req *Request) *Handle { return p.begin(d, req) }

func (p *KVPolicy) begin(d Decision, req *Request) *Handle {
	t := d.Chosen.Target
	h := p.load.Begin(t, req, CachedBlocks(d))
	if p.approx != nil && len(req.BlockHashes) > 0 {
		if p.recent == nil || p.Mode(t) == ModeApproximate || !p.recent.add(t, req.BlockHashes, p.now()) {
			p.approx.Record(t, req.BlockHashes)
		}
		if f := p.fleet.Load(); f != nil && f.Approx != nil && p.Mode(t) == ModeApproximate {
			f.Approx.RoutedApprox(t, req.BlockHashes)
		}
	}
	if p.timed != nil && p.timed.workset != nil {
		p.timed.workset.record(t, req.BlockHashes, p.now())
	}
	if p.routed != nil && len(req.BlockHashes) > 0 && len(req.LocalHashes) == len(req.BlockHashes) {
		p.routed.NoteRouted(d.Chosen.Target, req.LocalHashes, req.BlockHashes)
	}
	return h
}

// errNoCandidates is returned when Pick is called with nothing to pick from.
var errNoCandidates = errors.New("router: no candidates")

// Pick scores every candidate and chooses one; it accounts no load.
func (p *KVPolicy) Pick(ctx context.Context, req *Request, candidates []Candidate) (Decision, error) {
	if len(candidates) == 0 {
		return Decision{}, errNoCandidates
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, fmt.Errorf("kv pick: %w", err)
	}
	s := p.scratch.Get().(*kvScratch)
	defer p.scratch.Put(s)
	p.evaluate(req, candidates, s)
	return p.decide(req, candidates, s.rows), nil
}

// evaluate fills s.rows with one row per candidate.
func (p *KVPolicy) evaluate(req *Request, cands []Candidate, s *kvScratch) {
	n := len(cands)
	s.targets = s.targets[:0]
	for _, c := range cands {
		s.targets = append(s.targets, c.Target)
	}
	s.matches = grow(s.matches, n)
	s.approx = grow(s.approx, n)
	s.rows = grow(s.rows, n)
	if p.timed != nil {
		s.times = grow(s.times, n)
	}
	clear(s.matches)
	hashes := req.BlockHashes
	anyApprox := false
	for i, t := range s.targets {
		mode := p.Mode(t)
		anyApprox = anyApprox || mode == ModeApproximate
		s.rows[i] = kvRow{mode: mode}
		if mode == ModeApproximate && p.recent != nil && p.recent.pending(t) {
			// Its events stopped being healthy: what was routed there meanwhile becomes the
			// approximate index's view (once; from now on begin records it directly).
			p.recent.flush(t, p.approx, p.now().Add(-p.cfg.Approximate.TTL.D()))
		}
	}
	if p.matcher != nil && len(hashes) > 0 {
		p.matcher.MatchTiers(hashes, s.targets, s.matches)
	}
	clear(s.approx)
	if anyApprox && p.approx != nil && len(hashes) > 0 {
		p.approx.MatchTiers(hashes, s.targets, s.approx)
	}
	if p.hints != nil && (req.SessionID != "" || req.ParentSessionID != "") {
		var hs []sessions.Hint
		if ph, ok := p.hints.(PrefixHintSource); ok {
			hs = ph.HintsWithPrefix(req.SessionID, req.ParentSessionID, hashes)
		} else {
			hs = p.hints.Hints(req.SessionID, req.ParentSessionID)
		}
		for _, h := range hs {
			for i, t := range s.targets {
				if t == h.Target && h.Blocks > 0 {
					r := &s.rows[i]
					r.hint += h.Blocks
					if h.Rule != sessions.RuleSiblingPrefix {
						r.prefHint += h.Blocks
					}
					if r.hintRule == "" {
						r.hintRule = h.Rule
					} else if !strings.Contains(r.hintRule, h.Rule) {
						r.hintRule += "+" + h.Rule
					}
				}
			}
		}
	}

	bs := float64(blockSizeOf(req))
	reqBlocks := float64(len(hashes))
	if req.PromptTokens > 0 {
		reqBlocks = float64(req.PromptTokens) / bs
	}
	now := p.now()
	for i := range s.rows {
		r := &s.rows[i]
		if r.mode == ModeEvents {
			r.match = s.matches[i]
		} else {
			r.match = s.approx[i]
		}
		credit := float64(r.match.G1) + p.cfg.G2Credit*float64(r.match.G2) + p.cfg.G3Credit*float64(r.match.G3)
		r.noHint = math.Max(reqBlocks-credit, 0)
		r.prefill = math.Max(reqBlocks-credit-(r.hint-r.prefHint), 0)
		if p.timed != nil {
			p.timeOf(r, &s.times[i], cands[i], hashes, reqBlocks*bs, bs, now)
			continue
		}
		if !p.noLoad {
			p.loadOf(r, cands[i], hashes, bs, now)
		}
		r.cost = p.cfg.PrefillWeight*(r.prefill-r.prefHint) + r.load
		r.costNoHnt = p.cfg.PrefillWeight*r.noHint + r.load
	}
	if p.timed != nil {
		p.addFleet(s.rows, s.times)
		p.addRecompute(s.rows, s.times, reqBlocks*bs, bs)
	}
}

// loadOf fills the load term and the busy flag of one row.
func (p *KVPolicy) loadOf(r *kvRow, c Candidate, hashes []kvkey.BlockHash, bs float64, now time.Time) {
	tl := p.load.get(c.Target)
	var snap TargetLoad
	shared := 0
	var m WorkerMetrics
	fresh := false
	if tl != nil {
		snap = tl.snapshot()
		if snap.ActiveBlocks > 0 {
			shared = tl.sharedActive(hashes)
		}
		m, fresh = tl.freshMetrics(now, p.cfg.MetricsMaxAge.D())
	}
	// The peers' load adds to the own (their blocks are not deduplicated against ours).
	pv := p.peerLoad(c.Target)
	requests := float64(max(snap.Requests, c.InFlight)) + float64(pv.Requests)
	snap = snap.withPeers(pv)
	active := float64(snap.ActiveBlocks)
	unseenWaiting := 0.0
	if fresh {
		mActive, mRequests := tl.sinceSample(m)
		if m.NumGPUBlocks > 0 {
			active = math.Max(active, mActive)
		}
		requests = math.Max(requests, mRequests)
		unseenWaiting = math.Max(m.Waiting-float64(snap.PrefillRequests), 0)
	}
	p.busyOf(r, snap, m, fresh)
	r.load = p.cfg.PrefillLoadWeight*float64(snap.PrefillTokens)/bs +
		p.cfg.DecodeWeight*math.Max(active-float64(shared), 0) +
		p.cfg.RequestWeight*requests +
		p.cfg.WaitingWeight*unseenWaiting
}

// peerLoad is Σ the peer replicas' load on t (zero when not clustered).
func (p *KVPolicy) peerLoad(t kvkey.Target) LoadVector {
	if f := p.fleet.Load(); f != nil {
		return f.Peers.Sum(t)
	}
	return LoadVector{}
}

// SetFleet shares the policy's load and approximate-mode routing with peer replicas and adds
// their load to every target's when scoring. Call it before routing starts.
func (p *KVPolicy) SetFleet(f Fleet) {
	p.fleet.Store(&f)
	p.load.SetPublisher(f.Load)
	if p.timed != nil {
		if f.Load == nil {
			p.timed.pub.Store(nil)
		} else {
			p.timed.pub.Store(&loadPub{f.Load})
		}
	}
}

// busyOf sets the row's busy flag from the worker's fresh metrics (waiting requests, KV usage)
// and the gateway's prefill tokens in flight.
func (p *KVPolicy) busyOf(r *kvRow, snap TargetLoad, m WorkerMetrics, fresh bool) {
	switch {
	case fresh && p.cfg.BusyWaitingRequests > 0 && m.Waiting >= float64(p.cfg.BusyWaitingRequests):
		r.busy, r.busyWhy = true, fmt.Sprintf("waiting %g >= %d", m.Waiting, p.cfg.BusyWaitingRequests)
	case fresh && p.cfg.BusyKVUsage > 0 && m.KVUsage >= p.cfg.BusyKVUsage:
		r.busy, r.busyWhy = true, fmt.Sprintf("kv usage %.2f >= %.2f", m.KVUsage, p.cfg.BusyKVUsage)
	case p.cfg.BusyPrefillTokens > 0 && snap.PrefillTokens >= p.cfg.BusyPrefillTokens:
		r.busy, r.busyWhy = true, fmt.Sprintf("prefill tokens %d >= %d", snap.PrefillTokens, p.cfg.BusyPrefillTokens)
	}
}

// grow returns s resized to n, reusing its storage when it can.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// Mode reports how the policy currently scores t: ModeEvents when the event index is trusted
// for it, else ModeApproximate (for GET /debug/workers).
func (p *KVPolicy) Mode(t kvkey.Target) string {
	if p.matcher != nil && (p.events == nil || p.events.EventsHealthy(t)) {
		return ModeEvents
	}
	return ModeApproximate
}
