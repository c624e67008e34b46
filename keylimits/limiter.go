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
	key      *keyState
	tokens   int     // the estimate charged
	perToken float64 // fleet units charged per token (1 on a lone replica)
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
// Fleet-wide limits. Each replica keeps the whole fleet's buckets but spends from them only in
// proportion to its share of the key's demand (its own attempted rate against what the peers
// report, every live replica credited with a small floor): a request costs cost/share. While
// the replicas agree on the shares, the shares sum to 1, so together they spend at most the
// rate plus one burst, whatever the timing of their requests. The alternative, each replica
// deducting the others' reported consumption from one shared bucket, admits every request that
// arrives at two replicas within the propagation delay twice, so at start (every replica full)
// a fleet of n admits n bursts, and a synchronized flood overshoots by the delay times the
// rate; shares cannot overshoot, and what they cost is that a key whose traffic moves to
// another replica is under-admitted until the demand reports follow (about demandTau).
// max_concurrent is checked against the sum of the in-flight counts peers report.
type Limiter struct {
	mu          sync.Mutex
	keys        map[string]*keyState
	peers       map[string]*peer
	peerTimeout time.Duration
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
	reqShare, tokShare := l.sharesLocked(ks, now)
	ks.attemptLocked(tokens, now)
	d = Decision{Limited: true, Status: ks.statusLocked()}
	if d.Reason, d.RetryAfter = l.refusalLocked(ks, tokens, reqShare, tokShare, now); d.Reason != "" {
		return d
	}
	t := Ticket{key: ks, tokens: tokens}
	if ks.req != nil {
		ks.req.take(1, reqShare)
	}
	if ks.tok != nil {
		t.perToken = ks.tok.take(float64(tokens), tokShare)
	}
	ks.inFlight++
	d.Allowed, d.Ticket, d.Status = true, t, ks.statusLocked()
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
	reqShare, _ := l.sharesLocked(ks, now)
	d = Decision{Limited: true}
	if d.Reason, d.RetryAfter = l.refusalLocked(ks, -1, reqShare, 0, now); d.Reason == "" {
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

// sharesLocked refills ks's buckets to now and returns this replica's share of each (from
// the demand as last reported, so recording an attempt does not change it).
func (l *Limiter) sharesLocked(ks *keyState, now time.Time) (reqShare, tokShare float64) {
	if ks.req != nil {
		ks.req.advance(now)
		reqShare = l.shareLocked(ks.name, ks.req, ks.ownReq, now, func(p PeerKey) float64 { return p.Requests })
	}
	if ks.tok != nil {
		ks.tok.advance(now)
		tokShare = l.shareLocked(ks.name, ks.tok, ks.ownTok, now, func(p PeerKey) float64 { return p.Tokens })
	}
	return reqShare, tokShare
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

// refusalLocked is the limit a request of tokens would be refused by at the given shares
// ("" if none) and when it would be admitted; tokens < 0 leaves the token bucket out (the
// count is not known yet).
func (l *Limiter) refusalLocked(ks *keyState, tokens int, reqShare, tokShare float64, now time.Time) (Reason, time.Duration) {
	if m := ks.limits.MaxConcurrent; m > 0 && ks.inFlight+l.peerInFlightLocked(ks.name, now) >= m {
		return ReasonConcurrency, 0
	}
	if ks.req != nil {
		if need := ks.req.need(1, reqShare); ks.req.level < need {
			return ReasonRequests, ks.req.wait(need)
		}
	}
	if ks.tok != nil && tokens >= 0 {
		if need := ks.tok.need(float64(tokens), tokShare); ks.tok.level < need {
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
	t.key.tok.advance(now)
	t.key.tok.refund(float64(t.tokens-used) * t.perToken)
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
	if ks.req != nil {
		ks.req.advance(now)
	}
	if ks.tok != nil {
		ks.tok.advance(now)
	}
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
	if p == nil {
		if len(l.peers) >= maxPeers {
			return
		}
		p = &peer{keys: make(map[string]peerEntry)}
		l.peers[id] = p
	}
	p.at = now
	for _, e := range entries {
		if l.keys[e.Name] == nil {
			continue
		}
		if e.Requests == 0 && e.Tokens == 0 && e.InFlight == 0 {
			delete(p.keys, e.Name)
			continue
		}
		p.keys[e.Name] = peerEntry{PeerKey: e, at: now}
	}
}

// ForgetPeer drops a peer at once (it announced it is leaving).
func (l *Limiter) ForgetPeer(id string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	delete(l.peers, id)
	l.mu.Unlock()
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
