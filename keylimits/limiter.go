package keylimits

import (
	"sort"
	"sync"
	"time"
)

// Limits are one key's limits (configs.ClientKey's fields); 0 is no limit.
type Limits struct {
	RequestsPerMinute int
	TokensPerMinute   int
	MaxConcurrent     int
	// Burst is the requests bucket's size; the tokens bucket holds the same span of time at
	// its rate (Burst tokens without RequestsPerMinute). 0: one second of each rate, at least 1.
	Burst int
}

// Limited reports whether any limit is set.
func (l Limits) Limited() bool {
	return l.RequestsPerMinute > 0 || l.TokensPerMinute > 0 || l.MaxConcurrent > 0
}

// capacities are the buckets' sizes.
func (l Limits) capacities() (requests, tokens float64) {
	perSec := func(perMinute int) float64 { return max(1, float64(perMinute)/60) }
	if l.RequestsPerMinute > 0 {
		requests = perSec(l.RequestsPerMinute)
		if l.Burst > 0 {
			requests = float64(l.Burst)
		}
	}
	if l.TokensPerMinute > 0 {
		tokens = perSec(l.TokensPerMinute)
		switch {
		case l.Burst > 0 && l.RequestsPerMinute > 0:
			// The same span of time as the requests bucket: Burst requests last
			// Burst/(rpm/60) seconds.
			tokens = max(1, float64(l.TokensPerMinute)/60*float64(l.Burst)/(float64(l.RequestsPerMinute)/60))
		case l.Burst > 0:
			tokens = float64(l.Burst)
		}
	}
	return requests, tokens
}

// Reason names the limit a request was refused by (OpenAI's error type for the first two).
type Reason string

// The reasons.
const (
	ReasonRequests    Reason = "requests"
	ReasonTokens      Reason = "tokens"
	ReasonConcurrency Reason = "concurrency"
)

// BucketStatus is one bucket as the x-ratelimit-*-requests or -tokens headers show it.
type BucketStatus struct {
	Limit     int           // per minute
	Remaining int           // whole units that may be spent now (fleet-wide)
	Reset     time.Duration // until the bucket is full again
}

// Status is what a key's response headers show: a nil bucket is a limit the key does not have.
type Status struct {
	Requests, Tokens *BucketStatus
}

// Decision is the answer to Admit.
type Decision struct {
	Allowed bool
	// Limited is false for a key without limits: nothing is counted and no header is due.
	Limited bool
	Reason  Reason
	// RetryAfter is when the refused request would be admitted if nothing else came (for
	// concurrency, unknown: 0).
	RetryAfter time.Duration
	Status     Status
	// Ticket is the admitted request's handle for Correct and Release.
	Ticket Ticket
}

// Ticket is an admitted request's claim: its key, its in-flight slot and its token charge.
type Ticket struct {
	key    *keyState
	tokens int // the estimate charged
}

// PeerKey is what a replica reports of one key: its demand rates (attempted requests and tokens
// per second, decayed) and its requests in flight.
type PeerKey struct {
	Name     string
	Requests float64
	Tokens   float64
	InFlight int
}

// maxPeers bounds the peer replicas remembered (a fleet is a handful of replicas).
const maxPeers = 256

// Limiter holds every limited key's state. Keys come from the configuration, so its memory is
// bounded by it; peers' reports name only configured keys (others are dropped), and at most
// maxPeers peers are kept, each until it is silent for the peer timeout.
//
// Fleet-wide limits. Each replica holds its part of each of the key's buckets: it receives its
// share of the key's demand (its own attempted rate against what the peers report, every live
// replica credited with a small floor) of every refill, holds about that share of the capacity
// (the share smoothed, see bucket), and pays a request's plain cost. While the replicas agree
// on the shares, the shares sum to 1, so together they receive the rate and hold one burst,
// whatever the timing of their requests. The share weighs the refill, integrated over time
// (every bucket is advanced at its old share before a report changes it), not the price: an
// admission priced at cost/share, fixed at the moment of admission, overpays while its
// replica's share is momentarily low (a peer's first demand report heard before its own: 0.14
// instead of 1/3, 7 units instead of 3) far more than its peers underpay at their momentarily
// high shares, so three replicas with staggered reports admitted 49-52 of 55
// (TestFleetStaggeredReports). The alternative, each replica deducting the others' reported
// consumption from one shared bucket, admits every request that arrives at two replicas within
// the propagation delay twice, so at start (every replica full) a fleet of n admits n bursts,
// and a synchronized flood overshoots by the delay times the rate; shares do not overshoot,
// and what they cost is that a key whose traffic moves to another replica is under-admitted
// until the demand reports follow (about demandTau), and that the burst is split: a key idle
// fleet-wide holds a third of it on each of three replicas. max_concurrent is checked against
// the sum of the in-flight counts peers report.
type Limiter struct {
	mu          sync.Mutex
	keys        map[string]*keyState
	peers       map[string]*peer
	peerTimeout time.Duration
	// peerSet counts changes of the set of live peers (the buckets' parts of the burst follow
	// such a change at once, a change of demand smoothly).
	peerSet uint64
}

type keyState struct {
	name     string
	limits   Limits
	req, tok *bucket // nil: no such limit
	inFlight int
	reported bool // was in the last Report (an idle key is reported once more, as zero)
	// ownReq and ownTok are this replica's demand as of its last Report: the share is computed
	// from what the peers have heard, not from the fresher local rate, so every replica
	// divides the same numbers and the shares sum to 1.
	ownReq, ownTok float64
}

type peer struct {
	at   time.Time // last message
	keys map[string]peerEntry
}

type peerEntry struct {
	PeerKey
	at time.Time
}

// New holds the keys with limits (others are never limited), all buckets full at now.
// peerTimeout is how long a silent peer's reports still count.
func New(keys map[string]Limits, peerTimeout time.Duration, now time.Time) *Limiter {
	l := &Limiter{keys: make(map[string]*keyState), peers: make(map[string]*peer), peerTimeout: peerTimeout}
	for name, lim := range keys {
		if !lim.Limited() {
			continue
		}
		ks := &keyState{name: name, limits: lim}
		rc, tc := lim.capacities()
		if lim.RequestsPerMinute > 0 {
			ks.req = newBucket(lim.RequestsPerMinute, rc, now)
		}
		if lim.TokensPerMinute > 0 {
			ks.tok = newBucket(lim.TokensPerMinute, tc, now)
		}
		l.keys[name] = ks
	}
	return l
}

// Len is the number of limited keys.
func (l *Limiter) Len() int {
	if l == nil {
		return 0
	}
	return len(l.keys)
}

// Limited reports whether the key named name has limits.
func (l *Limiter) Limited(name string) bool { return l.key(name) != nil }

// Admit decides on one request of the key named name costing tokens (prompt plus max output)
// at now. An admitted request holds an in-flight slot until Release and its token charge until
// Correct; a refused one costs nothing but counts as demand.
func (l *Limiter) Admit(name string, tokens int, now time.Time) (d Decision) {
	ks := l.key(name)
	if ks == nil {
		return Decision{Allowed: true}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	tokens = max(tokens, 0)
	l.advanceLocked(ks, now)
	ks.attemptLocked(tokens, now)
	d = Decision{Limited: true, Status: ks.statusLocked()}
	if d.Reason, d.RetryAfter = l.refusalLocked(ks, tokens, now); d.Reason != "" {
		return d
	}
	if ks.req != nil {
		ks.req.take(1)
	}
	if ks.tok != nil {
		ks.tok.take(float64(tokens))
	}
	ks.inFlight++
	d.Allowed, d.Ticket, d.Status = true, Ticket{key: ks, tokens: tokens}, ks.statusLocked()
	return d
}

// Precheck refuses, at now, a request of the key named name that Admit would refuse whatever
// its token count: its max_concurrent is full or its request bucket holds less than one
// request. The gateway asks it before it parses and tokenizes the body, so a key flooding past
// its limits costs no tokenization. A refusal counts as demand (bodyTokens, the body's rough
// token count, for the token bucket) as Admit's would; an allowance takes and records nothing:
// Admit decides afterwards with the real count.
func (l *Limiter) Precheck(name string, bodyTokens int, now time.Time) (d Decision) {
	ks := l.key(name)
	if ks == nil {
		return Decision{Allowed: true}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.advanceLocked(ks, now)
	d = Decision{Limited: true}
	if d.Reason, d.RetryAfter = l.refusalLocked(ks, -1, now); d.Reason == "" {
		return Decision{Allowed: true, Limited: true}
	}
	ks.attemptLocked(max(bodyTokens, 0), now)
	d.Status = ks.statusLocked()
	return d
}

// key is the limited key named name (nil: unlimited, or no limiter).
func (l *Limiter) key(name string) *keyState {
	if l == nil {
		return nil
	}
	return l.keys[name]
}

// advanceLocked refills ks's buckets to now at this replica's current share of each (from the
// demand as last reported, so recording an attempt does not change it). The share has held
// since the last advance: Report, ApplyPeer, ForgetPeer and ExpirePeers advance the buckets
// whose shares they are about to change (a peer entry aging past the peer timeout between
// them changes a share at a moment no call marks; it counts from the next advance).
func (l *Limiter) advanceLocked(ks *keyState, now time.Time) {
	if ks.req != nil {
		ks.req.advance(now, l.shareLocked(ks.name, ks.req, ks.ownReq, now, func(p PeerKey) float64 { return p.Requests }), l.peerSet)
	}
	if ks.tok != nil {
		ks.tok.advance(now, l.shareLocked(ks.name, ks.tok, ks.ownTok, now, func(p PeerKey) float64 { return p.Tokens }), l.peerSet)
	}
}

// advanceAllLocked advances every key's buckets (before a change of the peers themselves).
func (l *Limiter) advanceAllLocked(now time.Time) {
	for _, ks := range l.keys {
		l.advanceLocked(ks, now)
	}
}

// attemptLocked counts one request of tokens as the key's demand at now.
func (ks *keyState) attemptLocked(tokens int, now time.Time) {
	if ks.req != nil {
		ks.req.attempt(1, now)
	}
	if ks.tok != nil {
		ks.tok.attempt(float64(tokens), now)
	}
}

// refusalLocked is the limit a request of tokens would be refused by ("" if none) and when it
// would be admitted; tokens < 0 leaves the token bucket out (the count is not known yet). The
// buckets are advanced to now.
func (l *Limiter) refusalLocked(ks *keyState, tokens int, now time.Time) (Reason, time.Duration) {
	if m := ks.limits.MaxConcurrent; m > 0 && ks.inFlight+l.peerInFlightLocked(ks.name, now) >= m {
		return ReasonConcurrency, 0
	}
	if ks.req != nil {
		if need := ks.req.need(1); ks.req.level < need {
			return ReasonRequests, ks.req.wait(need)
		}
	}
	if ks.tok != nil && tokens >= 0 {
		if need := ks.tok.need(float64(tokens)); ks.tok.level < need {
			return ReasonTokens, ks.tok.wait(need)
		}
	}
	return "", 0
}

// Correct replaces an admitted request's token estimate with what it used (the worker's
// usage: prompt plus output tokens), refunding or charging the difference.
func (l *Limiter) Correct(t Ticket, used int, now time.Time) {
	if t.key == nil || t.key.tok == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.advanceLocked(t.key, now)
	t.key.tok.refund(float64(t.tokens - used))
}

// Release ends an admitted request: its in-flight slot frees.
func (l *Limiter) Release(t Ticket) {
	if t.key == nil {
		return
	}
	l.mu.Lock()
	t.key.inFlight--
	l.mu.Unlock()
}

// Status is the key's buckets at now (for the headers of a response that was not admitted
// through Admit, e.g. GET /v1/models); ok is false for a key without limits.
func (l *Limiter) Status(name string, now time.Time) (Status, bool) {
	ks := l.key(name)
	if ks == nil {
		return Status{}, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.advanceLocked(ks, now)
	return ks.statusLocked(), true
}

func (ks *keyState) statusLocked() Status {
	var s Status
	if ks.req != nil {
		st := ks.req.status()
		s.Requests = &st
	}
	if ks.tok != nil {
		st := ks.tok.status()
		s.Tokens = &st
	}
	return s
}

// shareLocked is this replica's share of b's demand: (own, as last reported, + floor) over the
// sum of the same across the live peers.
func (l *Limiter) shareLocked(name string, b *bucket, reported float64, now time.Time, demand func(PeerKey) float64) float64 {
	if len(l.peers) == 0 {
		return 1
	}
	floor := floorShare * b.rate
	own := reported + floor
	total := own
	for _, p := range l.peers {
		if now.Sub(p.at) > l.peerTimeout {
			continue
		}
		total += floor
		if e, ok := p.keys[name]; ok && now.Sub(e.at) <= l.peerTimeout {
			total += demand(e.PeerKey)
		}
	}
	return own / total
}

func (l *Limiter) peerInFlightLocked(name string, now time.Time) int {
	n := 0
	for _, p := range l.peers {
		if e, ok := p.keys[name]; ok && now.Sub(e.at) <= l.peerTimeout {
			n += e.InFlight
		}
	}
	return n
}

// Report is this replica's report to its peers at now: every key with demand or requests in
// flight, and once more (as zero) a key that had them in the previous report. Sorted by name.
func (l *Limiter) Report(now time.Time) []PeerKey {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []PeerKey
	for _, ks := range l.keys {
		l.advanceLocked(ks, now) // at the share its last report set
		pk := PeerKey{Name: ks.name, InFlight: ks.inFlight}
		if ks.req != nil {
			pk.Requests = ks.req.decayedDemand(now)
		}
		if ks.tok != nil {
			pk.Tokens = ks.tok.decayedDemand(now)
		}
		active := pk.InFlight > 0 || pk.Requests > idleDemand(ks.req) || pk.Tokens > idleDemand(ks.tok)
		ks.ownReq, ks.ownTok = pk.Requests, pk.Tokens
		if !active {
			ks.ownReq, ks.ownTok = 0, 0
		}
		if active || ks.reported {
			if !active {
				pk = PeerKey{Name: ks.name}
			}
			out = append(out, pk)
		}
		ks.reported = active
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// idleDemand is the demand below which a key is idle (a hundredth of the floor).
func idleDemand(b *bucket) float64 {
	if b == nil {
		return 0
	}
	return floorShare * b.rate / 100
}

// ApplyPeer records a peer's report at now: its entries replace what the peer said of those
// keys before (a report may come in several messages); names without limits here are dropped.
// A new peer beyond maxPeers is ignored.
func (l *Limiter) ApplyPeer(id string, entries []PeerKey, now time.Time) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.peers[id]
	if p == nil && len(l.peers) >= maxPeers {
		return
	}
	if p == nil || now.Sub(p.at) > l.peerTimeout {
		// A peer joining (or back from silence) adds its floor to every key's shares.
		l.advanceAllLocked(now)
		l.peerSet++
	}
	if p == nil {
		p = &peer{keys: make(map[string]peerEntry)}
		l.peers[id] = p
	}
	p.at = now
	for _, e := range entries {
		ks := l.keys[e.Name]
		if ks == nil {
			continue
		}
		l.advanceLocked(ks, now) // at the share the peer's last report set
		if e.Requests == 0 && e.Tokens == 0 && e.InFlight == 0 {
			delete(p.keys, e.Name)
			continue
		}
		p.keys[e.Name] = peerEntry{PeerKey: e, at: now}
	}
}

// ForgetPeer drops a peer at now, at once (it announced it is leaving).
func (l *Limiter) ForgetPeer(id string, now time.Time) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.peers[id]; ok {
		l.advanceAllLocked(now)
		delete(l.peers, id)
		l.peerSet++
	}
}

// ExpirePeers drops the peers silent for longer than the peer timeout; it returns how many.
func (l *Limiter) ExpirePeers(now time.Time) int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for id, p := range l.peers {
		if now.Sub(p.at) > l.peerTimeout {
			if n == 0 {
				l.advanceAllLocked(now)
				l.peerSet++
			}
			delete(l.peers, id)
			n++
		}
	}
	return n
}

// Peers is the number of peers whose reports count.
func (l *Limiter) Peers() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.peers)
}
