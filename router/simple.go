package router

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// decision builds the record shared by the simple policies: every candidate with its load.
func decision(policy string, req *Request, candidates []Candidate, chosen int, reason string) Decision {
	d := Decision{
		Policy:     policy,
		Chosen:     Choice{Target: candidates[chosen].Target, Reason: reason},
		Candidates: make([]CandidateScore, len(candidates)),
	}
	if req != nil {
		d.PromptTokens = req.PromptTokens
		d.PromptBlocks = len(req.BlockHashes)
	}
	for i, c := range candidates {
		d.Candidates[i] = CandidateScore{Target: c.Target, Load: float64(c.InFlight)}
	}
	return d
}

func checkCandidates(name string, candidates []Candidate) error {
	if len(candidates) == 0 {
		return fmt.Errorf("%s: no candidates", name)
	}
	return nil
}

// RoundRobin cycles through the candidates in the order given.
type RoundRobin struct{ next atomic.Uint64 }

// Name returns "round_robin".
func (p *RoundRobin) Name() string { return "round_robin" }

// Pick returns the next candidate in turn.
func (p *RoundRobin) Pick(_ context.Context, req *Request, candidates []Candidate) (Decision, error) {
	if err := checkCandidates(p.Name(), candidates); err != nil {
		return Decision{}, err
	}
	i := int((p.next.Add(1) - 1) % uint64(len(candidates)))
	return decision(p.Name(), req, candidates, i, "next in turn"), nil
}

// Random picks a candidate uniformly at random.
type Random struct {
	mu  sync.Mutex
	rng *rand.Rand
}

// NewRandom returns a Random policy; seed 0 draws a random seed.
func NewRandom(seed uint64) *Random {
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &Random{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Name returns "random".
func (p *Random) Name() string { return "random" }

// Pick returns a uniformly random candidate.
func (p *Random) Pick(_ context.Context, req *Request, candidates []Candidate) (Decision, error) {
	if err := checkCandidates(p.Name(), candidates); err != nil {
		return Decision{}, err
	}
	p.mu.Lock()
	i := p.rng.IntN(len(candidates))
	p.mu.Unlock()
	return decision(p.Name(), req, candidates, i, "uniform random"), nil
}

// LeastLoaded picks the candidate with the fewest requests in flight through this gateway.
// Ties are broken in rotation, so an idle fleet still spreads sequential requests.
type LeastLoaded struct{ next atomic.Uint64 }

// Name returns "least_loaded".
func (p *LeastLoaded) Name() string { return "least_loaded" }

// Pick returns the least-loaded candidate.
func (p *LeastLoaded) Pick(_ context.Context, req *Request, candidates []Candidate) (Decision, error) {
	if err := checkCandidates(p.Name(), candidates); err != nil {
		return Decision{}, err
	}
	low, ties := candidates[0].InFlight, 0
	for _, c := range candidates {
		switch {
		case c.InFlight < low:
			low, ties = c.InFlight, 1
		case c.InFlight == low:
			ties++
		}
	}
	// The k-th of the tied candidates, k rotating, so equal loads share the traffic.
	k := int((p.next.Add(1) - 1) % uint64(ties))
	best := 0
	for i, c := range candidates {
		if c.InFlight == low {
			if k == 0 {
				best = i
				break
			}
			k--
		}
	}
	reason := fmt.Sprintf("fewest in flight (%d)", candidates[best].InFlight)
	return decision(p.Name(), req, candidates, best, reason), nil
}
