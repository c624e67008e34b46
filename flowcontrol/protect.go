package flowcontrol

import (
	"math"
	"slices"
	"sync"
	"time"
)

// Cache protection (flow_control.protect_cache): a request that a higher priority, or a
// named tenant its own tenant is over its share against (overShare), outranks is kept off the
// targets that hold that class's recent prompt (its footprint), so its prefills
// neither make their LRU caches evict the footprint nor queue ahead of the class's next
// request there; at least half of its eligible targets stay (shield). The caller tells the
// queue each target's live footprints (TargetState.Guards): those the router's working sets
// still count as cached there (server/flow_protect.go).

// Protection reasons (Placement.Protected, Dispatch.Protected): which rule steered the
// request off a target.
const (
	ProtectedByPriority = "priority"
	ProtectedByTenant   = "tenant"
)

// Guard is one class's recent footprint on a target: the prompt it last routed there.
type Guard struct {
	Priority int
	// Tenant is the class's tenant when it is named (a client key or the fairness header):
	// then it is protected from other named tenants of its priority with more than
	// ContendedShare times its service, not only from lower priorities. "" protects it by
	// priority only.
	Tenant string
	// Blocks is the footprint's size in KV blocks.
	Blocks float64
}

// Class is a request's place in the queue: its priority and tenant, and whether the tenant
// is named by the client (a key or the fairness header; only named tenants protect their
// footprint from each other).
type Class struct {
	Priority int
	Tenant   string
	Named    bool
}

// shares caches the service the tenants asked for, for one Place or Next (under the queue's
// lock).
type shares struct {
	asked map[string]float64
}

func newShares() *shares { return &shares{asked: map[string]float64{}} }

// askedIn is the service t asked for, decayed to now, cached in s.
func (q *Queue[T]) askedIn(s *shares, t string, now time.Time) float64 {
	v, ok := s.asked[t]
	if !ok {
		_, v = q.serviceOf(t, now)
		s.asked[t] = v
	}
	return v
}

// outranks reports whether guard g is protected from a request of class c, and by which
// rule: a higher priority's, or, within a priority, a named tenant's from a named tenant over
// its share (overShare; ContendedShare 0: tenants never outrank).
func (q *Queue[T]) outranks(g Guard, c Class, s *shares, now time.Time) (string, bool) {
	switch {
	case g.Priority > c.Priority:
		return ProtectedByPriority, true
	case g.Priority == c.Priority && c.Named && g.Tenant != "" && g.Tenant != c.Tenant && q.lim.ContendedShare > 0 &&
		q.overShare(s, c.Tenant, g.Tenant, now):
		return ProtectedByTenant, true
	}
	return "", false
}

// overShare reports whether tenant c is over its share against tenant g: c asked for more
// service than g (Arrive: its requests' weighted tokens on arrival, served, waiting or shed
// alike, decaying) and either c has requests waiting at the gateway while g has none (the
// queue holds c back while g is served: c's demand is over what its fair share gives it), or
// c asked for more than ContendedShare times g's service (nobody waits: Place).
//
// Neither attained service nor a fixed ratio alone tells a flood from a light tenant on a
// saturated fleet: fair sharing gives the flood about what the light tenant leaves, and a
// flood of clients that wait for each answer slows its own asking down as its answers slow,
// so both ratios hovered around 1.5 in the two-tenant benchmark
// (docs/benchmarks/2026-12-05-cache-protection.md) and protection came and went.
func (q *Queue[T]) overShare(s *shares, c, g string, now time.Time) bool {
	ac, ag := q.askedIn(s, c, now), q.askedIn(s, g, now)
	if ac <= ag {
		return false
	}
	if q.waitingOf(c) > 0 && q.waitingOf(g) == 0 {
		return true
	}
	return ac > q.lim.ContendedShare*ag
}

// waitingOf is the number of t's requests waiting in the queue.
func (q *Queue[T]) waitingOf(t string) int {
	if a := q.service[t]; a != nil {
		return a.waiting
	}
	return 0
}

// shield returns the targets among eligible that a request of class c must avoid: those
// holding a footprint that outranks it, the most at risk (outranking blocks there) first, while at least half of the eligible targets (rounded up) and those with the
// least at risk stay eligible: the request is never left without a target, and a flood of it
// keeps a share of the fleet. by names the rule that excluded a target ("" when none was
// excluded).
func (q *Queue[T]) shield(c Class, eligible []T, states map[T]TargetState, s *shares, now time.Time) (avoid map[T]bool, by string) {
	if !q.lim.Protect {
		return nil, ""
	}
	risk := make(map[T]float64, len(eligible))
	byOf := make(map[T]string, len(eligible))
	for _, t := range eligible {
		for _, g := range states[t].Guards {
			rule, ok := q.outranks(g, c, s, now)
			if !ok {
				continue
			}
			risk[t] += math.Max(g.Blocks, 1)
			if byOf[t] == "" || rule == ProtectedByPriority {
				byOf[t] = rule
			}
		}
	}
	if len(risk) == 0 {
		return nil, ""
	}
	least := math.Inf(1)
	for _, t := range eligible {
		least = math.Min(least, risk[t])
	}
	// The most at risk first; at least half of the eligible targets stay (the flood keeps a
	// share of the fleet), and so do those with the least at risk.
	order := slices.Clone(eligible)
	slices.SortFunc(order, func(a, b T) int {
		switch {
		case risk[a] > risk[b]:
			return -1
		case risk[a] < risk[b]:
			return 1
		}
		return cmpString(fmtKey(a), fmtKey(b))
	})
	keep := (len(eligible) + 1) / 2
	for i, t := range order {
		if risk[t] <= least || len(eligible)-i <= keep {
			break
		}
		if avoid == nil {
			avoid = map[T]bool{}
		}
		avoid[t] = true
		if by == "" || byOf[t] == ProtectedByPriority {
			by = byOf[t]
		}
	}
	return avoid, by
}

// Footprints is, per target, the last prompt each class's conversation (session) routed there
// within a window: what cache protection guards (TargetState.Guards). M is the caller's mark
// of the prompt (the router's key for its age in the target's working set). Bounded: at most
// maxFootprints per target, the lowest priority's oldest forgotten first. Safe for concurrent
// use; its lock is a leaf.
type Footprints[T comparable, M any] struct {
	mu     sync.Mutex
	window time.Duration
	at     map[T]map[footKey]*Footprint[M]
}

type footKey struct {
	prio    int
	tenant  string
	session string
}

// Footprint is one class's last prompt on a target.
type Footprint[M any] struct {
	Priority int
	Tenant   string // "" for a class protected by priority only
	Blocks   float64
	Mark     M
	At       time.Time
}

// maxFootprints bounds the footprints remembered per target.
const maxFootprints = 256

// NewFootprints returns an empty record keeping footprints for window after their last use.
func NewFootprints[T comparable, M any](window time.Duration) *Footprints[T, M] {
	return &Footprints[T, M]{window: window, at: map[T]map[footKey]*Footprint[M]{}}
}

// Record notes that a request of priority prio and tenant (named, or "") in session (""
// for none: then one footprint per class) routed a prompt of blocks marked m to t at now;
// it replaces the session's footprint there.
func (f *Footprints[T, M]) Record(t T, prio int, tenant, session string, blocks float64, m M, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fs := f.at[t]
	if fs == nil {
		fs = map[footKey]*Footprint[M]{}
		f.at[t] = fs
	}
	for tt := range f.at {
		f.expire(tt, now) // every target: one that left the fleet is forgotten too
	}
	if f.at[t] == nil {
		f.at[t] = fs
	}
	k := footKey{prio, tenant, session}
	if _, ok := fs[k]; !ok && len(fs) >= maxFootprints {
		var drop *footKey
		var worst *Footprint[M]
		for kk, fp := range fs {
			if worst == nil || fp.Priority < worst.Priority || fp.Priority == worst.Priority && fp.At.Before(worst.At) {
				kk := kk
				drop, worst = &kk, fp
			}
		}
		delete(fs, *drop)
	}
	fs[k] = &Footprint[M]{Priority: prio, Tenant: tenant, Blocks: blocks, Mark: m, At: now}
}

// expire drops t's footprints older than the window; the caller holds mu.
func (f *Footprints[T, M]) expire(t T, now time.Time) {
	for k, fp := range f.at[t] {
		if now.Sub(fp.At) > f.window {
			delete(f.at[t], k)
		}
	}
	if len(f.at[t]) == 0 {
		delete(f.at, t)
	}
}

// Live returns t's footprints within the window, highest priority first.
func (f *Footprints[T, M]) Live(t T, now time.Time) []Footprint[M] {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expire(t, now)
	out := make([]Footprint[M], 0, len(f.at[t]))
	for _, fp := range f.at[t] {
		out = append(out, *fp)
	}
	slices.SortFunc(out, func(a, b Footprint[M]) int {
		if a.Priority != b.Priority {
			return b.Priority - a.Priority
		}
		return cmpString(a.Tenant, b.Tenant)
	})
	return out
}

// eligibleOf is the targets of states a request with gain may go to (Entry.Gain).
func eligibleOf[T comparable](gain map[T]float64, states map[T]TargetState) []T {
	out := make([]T, 0, len(states))
	for t := range states {
		if _, ok := gainOn(gain, t); ok {
			out = append(out, t)
		}
	}
	return out
}

// withoutTargets is states less the targets in avoid (states itself when avoid is empty):
// what a shielded request is priced against.
func withoutTargets[T comparable](states map[T]TargetState, avoid map[T]bool) map[T]TargetState {
	if len(avoid) == 0 {
		return states
	}
	out := make(map[T]TargetState, len(states))
	for t, s := range states {
		if !avoid[t] {
			out[t] = s
		}
	}
	return out
}
