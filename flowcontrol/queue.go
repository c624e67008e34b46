package flowcontrol

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// ErrFull is Push's error when the request would pass max_requests or max_bytes.
var ErrFull = errors.New("the gateway's queue is full")

// Entry is one waiting request. The caller fills the exported fields before Push and must
// not change them while the entry is queued.
type Entry[T comparable] struct {
	// Priority: higher is dispatched first, always.
	Priority int
	// Tenant is the fair-share identity within a priority.
	Tenant string
	// Bytes counts against max_bytes.
	Bytes int64
	// Cost is the service charged to Tenant when the entry is dispatched (weighted tokens);
	// Charge corrects it once the actual usage is known.
	Cost float64
	// Gain is what the request saves, in ms, on each target it may go to (its cached prefix
	// there, priced by the time model). A non-nil Gain lists every eligible target (0 for no
	// gain); a nil Gain makes every target eligible, none with a gain.
	Gain map[T]float64
	// Named: Tenant is named by the client (Class.Named).
	Named bool
	// Deadline is when the request's first token is due (its arrival plus queue_timeout;
	// zero: none), and Prefill its own prefill in ms on each target with its cache there (the
	// time model's; nil: none predicted). A target where the predicted wait plus Prefill
	// passes Deadline is not taken (deadline.go), and Late sheds the entry once every
	// eligible target is such.
	Deadline time.Time
	Prefill  map[T]float64
	// Value is the caller's own; the queue never reads it.
	Value any

	enqueued time.Time
	seq      uint64
	state    entryState
}

type entryState int8

const (
	stateNew entryState = iota
	stateWaiting
	stateDispatched
	stateRemoved
)

// Enqueued is when Push accepted the entry.
func (e *Entry[T]) Enqueued() time.Time { return e.enqueued }

// Limits are the queue's bounds and fairness knobs (from Config).
type Limits struct {
	MaxRequests int
	MaxBytes    int64
	// HalfLife of a tenant's attained service.
	HalfLife time.Duration
	// AgeWeight is the gain credit, in ms, per ms waited.
	AgeWeight float64
	// RecomputeWeight is the fleet's share of a prefill a request recomputes by leaving the
	// target that holds its prefix, as a fraction of that prefill (price).
	RecomputeWeight float64
	// MaxWaitMs is the predicted wait from which a target takes no request (0: none), and
	// ContendedWaitMs the same for a request that others contend with (0: MaxWaitMs).
	MaxWaitMs, ContendedWaitMs float64
	// Window is how long a priority or tenant stays active after its last request;
	// ContendedShare the multiple of the active tenants' mean service over which a tenant
	// is contended (0: never).
	Window         time.Duration
	ContendedShare float64
	// Protect turns cache protection on (protect.go): a request is kept off targets holding
	// the footprint of a class that outranks it, while enough others are eligible.
	Protect bool
}

// LimitsOf returns the queue limits of a config.
func LimitsOf(c Config) Limits {
	return Limits{MaxRequests: c.MaxRequests, MaxBytes: int64(c.MaxBytes), HalfLife: c.ServiceHalfLife.D(), AgeWeight: c.AgeWeight,
		RecomputeWeight: c.RecomputeWeight,
		MaxWaitMs:       ms(c.MaxPredictedWait), ContendedWaitMs: ms(c.ContendedPredictedWait),
		Window: c.ContentionWindow.D(), ContendedShare: c.ContendedShare, Protect: c.ProtectCache}
}

// Queue is the waiting requests of one model pool, by priority and tenant, with each tenant's
// attained service. Safe for concurrent use; its lock is a leaf.
type Queue[T comparable] struct {
	mu      sync.Mutex
	lim     Limits
	now     func() time.Time
	bands   map[int]*band[T]
	prios   []int // the bands' priorities, highest first
	n       int
	bytes   int64
	service map[string]*attained
	pruneAt int
	seq     uint64
	seen    map[int]time.Time // each priority's last arrival (Arrive)
}

// band is one priority's waiting requests, by tenant.
type band[T comparable] struct {
	tenants map[string][]*Entry[T] // each tenant's entries in arrival order
	n       int
	bytes   int64
}

// attained is a tenant's decaying attained service, the decaying service its requests asked
// for on arrival (served, waiting or shed alike), and its waiting requests.
type attained struct {
	v       float64
	asked   float64
	at      time.Time
	waiting int
	seen    time.Time // the tenant's last arrival (Arrive)
}

// minPruneAt is the tenant count from which idle tenants with negligible service are forgotten.
const minPruneAt = 1024

// NewQueue returns an empty queue reading time from now.
func NewQueue[T comparable](lim Limits, now func() time.Time) *Queue[T] {
	return &Queue[T]{lim: lim, now: now, bands: map[int]*band[T]{}, service: map[string]*attained{}, pruneAt: minPruneAt,
		seen: map[int]time.Time{}}
}

// Push queues e, or returns an error wrapping ErrFull when it would pass a bound (the entry is
// then not queued). When waiting entries of a lower priority than e's make room, they are
// shed instead (the lowest priority first, within it the youngest) and returned: the caller
// answers them as if the queue had been full when they came.
func (q *Queue[T]) Push(e *Entry[T]) (evicted []*Entry[T], err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e.state != stateNew {
		return nil, errors.New("flowcontrol: entry pushed twice")
	}
	if q.n+1 > q.lim.MaxRequests || q.bytes+e.Bytes > q.lim.MaxBytes {
		out, ok := q.evictFor(e)
		if !ok {
			if q.n+1 > q.lim.MaxRequests {
				return nil, fmt.Errorf("%w: %d requests waiting (flow_control.max_requests %d)", ErrFull, q.n, q.lim.MaxRequests)
			}
			return nil, fmt.Errorf("%w: %d bytes waiting, this request %d (flow_control.max_bytes %d)", ErrFull, q.bytes, e.Bytes, q.lim.MaxBytes)
		}
		for _, x := range out {
			q.unlink(x, stateRemoved)
		}
		evicted = out
	}
	b := q.bands[e.Priority]
	if b == nil {
		b = &band[T]{tenants: map[string][]*Entry[T]{}}
		q.bands[e.Priority] = b
		q.prios = append(q.prios, e.Priority)
		slices.SortFunc(q.prios, func(a, b int) int { return b - a })
	}
	q.seq++
	e.seq, e.enqueued, e.state = q.seq, q.now(), stateWaiting
	b.tenants[e.Tenant] = append(b.tenants[e.Tenant], e)
	b.n++
	b.bytes += e.Bytes
	q.n++
	q.bytes += e.Bytes
	q.tenant(e.Tenant).waiting++
	q.prune()
	return evicted, nil
}

// tenant returns t's service record, creating it.
func (q *Queue[T]) tenant(t string) *attained {
	a := q.service[t]
	if a == nil {
		a = &attained{at: q.now()}
		q.service[t] = a
	}
	return a
}

// serviceOf is t's attained service and the service its requests asked for on arrival, both
// decayed to now (0 for a tenant never seen).
func (q *Queue[T]) serviceOf(t string, now time.Time) (attained, asked float64) {
	a := q.service[t]
	if a == nil {
		return 0, 0
	}
	a.decay(now, q.lim.HalfLife)
	return a.v, a.asked
}

func (a *attained) decay(now time.Time, halfLife time.Duration) {
	if dt := now.Sub(a.at); dt > 0 && halfLife > 0 {
		f := math.Exp2(-float64(dt) / float64(halfLife))
		a.v *= f
		a.asked *= f
		a.at = now
	}
}

// prune forgets idle tenants whose service decayed below one token once there are many.
func (q *Queue[T]) prune() {
	if len(q.service) < q.pruneAt {
		return
	}
	now := q.now()
	for t, a := range q.service {
		if a.decay(now, q.lim.HalfLife); a.waiting == 0 && a.v < 1 && a.asked < 1 && now.Sub(a.seen) > q.lim.Window {
			delete(q.service, t)
		}
	}
	q.pruneAt = max(minPruneAt, 2*len(q.service))
}

// Remove takes e out of the queue (its client left, or it waited too long) and reports
// whether it was still waiting; false means it was dispatched (or removed) already.
func (q *Queue[T]) Remove(e *Entry[T]) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e.state != stateWaiting {
		return false
	}
	q.unlink(e, stateRemoved)
	return true
}

// unlink takes a waiting entry out of its band.
func (q *Queue[T]) unlink(e *Entry[T], to entryState) {
	b := q.bands[e.Priority]
	es := b.tenants[e.Tenant]
	if i := slices.Index(es, e); i >= 0 {
		es = slices.Delete(es, i, i+1)
	}
	if len(es) == 0 {
		delete(b.tenants, e.Tenant)
	} else {
		b.tenants[e.Tenant] = es
	}
	b.n--
	b.bytes -= e.Bytes
	if b.n == 0 {
		// An empty band goes: the priorities seen stay bounded by the requests waiting.
		delete(q.bands, e.Priority)
		q.prios = slices.DeleteFunc(q.prios, func(p int) bool { return p == e.Priority })
	}
	q.n--
	q.bytes -= e.Bytes
	if a := q.service[e.Tenant]; a != nil {
		a.waiting--
	}
	e.state = to
}

// Next chooses the entry that a target free to take it should take, dispatches it (it
// leaves the queue and its tenant is charged its Cost) and returns it with its Dispatch.
// states is every target's load (a target absent is neither free nor priced).
//
// A target is free for an entry when it is eligible (Gain), not saturated and its predicted
// wait is under the entry's bound (MaxWaitMs, or ContendedWaitMs for a contended entry). An
// entry takes a free target only when, by the time model, its prefill ends there no later
// than by waiting for its best other target (price: predicted wait less the weighed cache
// gain, the recompute weight paid in proportion to the backlog the idle targets cannot take,
// backlogShare), less its wait credit (AgeWeight × ms waited): late binding, priced.
// Otherwise it keeps waiting and others may take the target.
//
// The highest priority with an entry that takes a free target goes first; within it the
// tenants in order of least attained service; within a tenant the entry with the highest
// advantage (its best other price less its price here, plus its credit; without a time model
// its gain here less its best gain elsewhere, plus its credit), the oldest on a tie. ok is
// false when no waiting entry takes any free target.
func (q *Queue[T]) Next(states map[T]TargetState) (e *Entry[T], d Dispatch[T], ok bool) {
	if len(states) == 0 {
		return nil, d, false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	c := q.contentionAt(now)
	sh := newShares()
	weigh := q.lim.RecomputeWeight
	for _, p := range q.prios { // unlink may drop a band: we return right after
		b := q.bands[p]
		for _, group := range q.byService(b, now) {
			if e, d, ok = q.best(b, group, states, c, sh, weigh, now); ok {
				q.unlink(e, stateDispatched)
				a := q.tenant(e.Tenant)
				a.decay(now, q.lim.HalfLife)
				a.v += e.Cost
				d.Due = e.due(d.Target, states[d.Target])
				return e, d, true
			}
		}
	}
	return nil, d, false
}

// byService groups b's tenants by attained service, least first; tenants within a relative
// 1e-9 of each other share a group (equal service: the gain decides between them).
func (q *Queue[T]) byService(b *band[T], now time.Time) [][]string {
	type ts struct {
		name string
		v    float64
	}
	all := make([]ts, 0, len(b.tenants))
	for t := range b.tenants {
		v, _ := q.serviceOf(t, now)
		all = append(all, ts{t, v})
	}
	slices.SortFunc(all, func(x, y ts) int {
		switch {
		case x.v < y.v:
			return -1
		case x.v > y.v:
			return 1
		}
		return cmpString(x.name, y.name)
	})
	var groups [][]string
	for i := 0; i < len(all); {
		j := i + 1
		for j < len(all) && all[j].v-all[i].v <= 1e-9*math.Max(1, all[i].v) {
			j++
		}
		g := make([]string, 0, j-i)
		for _, x := range all[i:j] {
			g = append(g, x.name)
		}
		groups = append(groups, g)
		i = j
	}
	return groups
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// best is the entry of the tenants named with the highest advantage on a free target it
// takes (see Next).
func (q *Queue[T]) best(b *band[T], tenants []string, states map[T]TargetState, c contention, sh *shares, weigh float64, now time.Time) (best *Entry[T], d Dispatch[T], ok bool) {
	bestScore := math.Inf(-1)
	for _, t := range tenants {
		bd := q.boundOf(c, b.tenants[t][0].Priority, t, now)
		for _, e := range b.tenants[t] {
			age := q.lim.AgeWeight * float64(now.Sub(e.enqueued)) / float64(time.Millisecond)
			top, second, topAt := topGains(e.Gain)
			avoid, by := q.shield(Class{e.Priority, e.Tenant, e.Named}, eligibleOf(e.Gain, states), states, sh, now)
			late := e.lateTargets(states, now)
			// A target where it would be late is no alternative worth waiting for.
			priceOn := withoutTargets(states, union(avoid, late))
			// The recompute weight in proportion to the backlog: all of it while more
			// requests wait than idle targets can take (2x), half of it beside enough idle
			// ones (minBacklogShare; an idle target it would be late on cannot take it).
			weighE := weigh * backlogShare(e.Gain, priceOn, q.n)
			for f := range states {
				g, eligible := gainOn(e.Gain, f)
				if !eligible || avoid[f] || late[f] || !takes(bd, states, f) {
					continue
				}
				choice := ChoiceUnpriced
				here, elsewhere, priced := price(e.Gain, f, priceOn, weighE)
				var score float64
				if priced {
					adv := elsewhere - here
					if adv+age < 0 {
						continue // waiting for a better target is predicted sooner
					}
					score, choice = adv+age, ChoiceHolder
					switch {
					case adv < 0:
						choice = ChoiceAged
					case g < top:
						choice = ChoiceFaster
					}
				} else {
					// No time model: the gain here against the best elsewhere (a request whose
					// prefix another target holds goes last to this one).
					other := top
					if f == topAt {
						other = second
					}
					score, here, elsewhere = g-other+age, 0, 0
				}
				if g < top && late[topAt] && (choice == ChoiceFaster || choice == ChoiceUnpriced) {
					choice = ChoiceLateHolder // left because the holder would make it late
				}
				if !ok || score > bestScore || (score == bestScore && (e.seq < best.seq || e == best && less(f, d.Target))) {
					best, bestScore, ok = e, score, true
					d = Dispatch[T]{Target: f, Choice: choice, HereMs: here, ElseMs: elsewhere, Weigh: weighE, GainMs: g, TopGainMs: top,
						Contended: bd.contended, Protected: by}
				}
			}
		}
	}
	return best, d, ok
}

// less orders targets for a deterministic tie-break (map order is random).
func less[T comparable](a, b T) bool { return fmtKey(a) < fmtKey(b) }

// topGains returns the highest and second-highest gains (0 when absent: a target not listed
// gains nothing) and the target of the highest.
func topGains[T comparable](gain map[T]float64) (top, second float64, at T) {
	for t, g := range gain {
		switch {
		case g > top:
			top, second, at = g, top, t
		case g > second:
			second = g
		}
	}
	return top, second, at
}

// Charge adds delta (negative to refund) to tenant's attained service, never below zero: the
// actual usage of a dispatched request corrects the Cost charged for it.
func (q *Queue[T]) Charge(tenant string, delta float64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	a := q.tenant(tenant)
	a.decay(q.now(), q.lim.HalfLife)
	a.v = math.Max(0, a.v+delta)
}

// Service is tenant's attained service now (for tests and debug views).
func (q *Queue[T]) Service(tenant string) float64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	v, _ := q.serviceOf(tenant, q.now())
	return v
}

// Drain removes and returns every waiting entry, oldest first (no worker is left to serve
// them).
func (q *Queue[T]) Drain() []*Entry[T] {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*Entry[T]
	for _, b := range q.bands {
		for _, es := range b.tenants {
			out = append(out, es...)
		}
	}
	slices.SortFunc(out, func(x, y *Entry[T]) int { return int(x.seq) - int(y.seq) })
	for _, e := range out {
		q.unlink(e, stateRemoved)
	}
	return out
}

// Len is the number of waiting requests.
func (q *Queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// Depth returns the waiting requests and bytes of each priority with a request waiting.
func (q *Queue[T]) Depth() map[int][2]int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make(map[int][2]int64, len(q.bands))
	for p, b := range q.bands {
		out[p] = [2]int64{int64(b.n), b.bytes}
	}
	return out
}
