package router

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// ErrUnknownResponse is wrapped by Route's error for a request pinned to a stored response
// (Request.PinResponseID) whose worker is unknown, gone or not routable: only that worker holds
// the response, so no other candidate may serve it. The server answers with vLLM's 404 for an
// unknown response id (responses/serving.py, _make_not_found_error).
var ErrUnknownResponse = errors.New("response not found")

// UnknownResponseError is the error Route returns for an unservable pin.
type UnknownResponseError struct {
	// ID is the response id the request is pinned to.
	ID string
	// Reason says why the pin cannot be served (for logs; the client sees vLLM's message).
	Reason string
}

// Error implements error.
func (e *UnknownResponseError) Error() string {
	return fmt.Sprintf("response %q: %s", e.ID, e.Reason)
}

// Is makes errors.Is(err, ErrUnknownResponse) true.
func (e *UnknownResponseError) Is(target error) bool { return target == ErrUnknownResponse }

// PinConfig bounds the response pins: response id → the target that produced (and stores) it.
type PinConfig struct {
	// MaxPins is how many pins are kept, least recently used dropped first (0: none are kept,
	// every previous_response_id is unknown).
	MaxPins int
	// TTL drops a pin this long after it was last used (0: never by age).
	TTL time.Duration
}

// SharedPins is the fleet's Responses API pins when several gateway replicas act as one
// (cluster.Bindings implements it over a NATS JetStream key-value bucket): a follow-up naming a
// response another replica produced reaches the worker that stores it.
type SharedPins interface {
	// SharePin pins responseID to t fleet-wide before it returns, bounded by the store's own
	// deadline: the client learns the id only after it, so its follow-up finds the pin on any
	// replica. A failure (counted by the store) leaves the pin this replica's alone.
	SharePin(ctx context.Context, responseID string, t kvkey.Target) error
	// TouchPin rewrites a pin still in use, so the store's TTL does not drop it. It must not
	// block (the write is done behind).
	TouchPin(responseID string, t kvkey.Target)
	// LookupPin reads the fleet's pin of responseID, bounded by the store's own deadline; ok
	// is false with a nil error when no replica pinned it.
	LookupPin(ctx context.Context, responseID string) (t kvkey.Target, ok bool, err error)
}

// Where a pin came from, as PinView.Source reports it.
const (
	PinLocal  = "local"  // this replica saw the worker produce the response
	PinShared = "shared" // read from the fleet's shared pins on a local miss
)

// pinTable is a bounded LRU map of response id → target, with a TTL since last use.
type pinTable struct {
	cfg    PinConfig
	now    func() time.Time
	shared SharedPins // nil: pins are this replica's alone

	mu  sync.Mutex
	lru *list.List // of *pinEntry, most recent at the front
	ids map[string]*list.Element
}

type pinEntry struct {
	key    string // pinKey(owner, id): the table's and the fleet's key
	id     string
	owner  string
	t      kvkey.Target
	used   time.Time
	source string
	shared time.Time // when the pin was last written to the shared pins (zero: never)
}

// PinView is one pin in the debug view.
type PinView struct {
	ResponseID string `json:"response_id"`
	// Owner is the name of the client key that created the response ("" without client keys).
	Owner      string       `json:"owner,omitempty"`
	Target     kvkey.Target `json:"target"`
	AgeSeconds float64      `json:"idle_seconds"`
	// Source is where the pin came from: "local" (produced through this replica) or "shared"
	// (read from the fleet's pins).
	Source string `json:"source"`
}

func newPinTable(cfg PinConfig, shared SharedPins) *pinTable {
	return &pinTable{cfg: cfg, now: time.Now, shared: shared, lru: list.New(), ids: map[string]*list.Element{}}
}

// reshareEvery is how often a pin in use is written to the shared pins again, so that the
// bucket's TTL (counted from the last write) does not drop a pin still in use here.
func (p *pinTable) reshareEvery() time.Duration {
	if p.cfg.TTL > 0 {
		return p.cfg.TTL / 8
	}
	return time.Minute
}

// pinKey is the key of owner's pin of response id, in this table and in the fleet's shared
// pins: the owner is part of the key, so a request of another owner never finds the pin and
// gets the same 404 as for an id nobody produced (nothing tells it the id exists). The
// separator cannot occur in a key name (configs: auth.keys[].name).
func pinKey(owner, id string) string {
	if owner == "" {
		return id
	}
	return owner + "\x00" + id
}

// produced pins owner's response id to t as a response the worker of t produced through this
// replica, and shares it with the fleet before the client can see the id.
func (p *pinTable) produced(id, owner string, t kvkey.Target) {
	k := pinKey(owner, id)
	if p.put(k, id, owner, t, PinLocal) && p.shared != nil {
		// The store bounds the call by its deadline and counts a failure; the pin then stays
		// local, as on a single replica.
		_ = p.shared.SharePin(context.Background(), k, t)
	}
}

// put pins key (owner's response id) to t (a key seen again moves to t); it reports whether it
// kept the pin.
func (p *pinTable) put(key, id, owner string, t kvkey.Target, source string) bool {
	if id == "" || p.cfg.MaxPins <= 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	var shared time.Time
	if source == PinLocal && p.shared != nil {
		shared = now
	}
	if el, ok := p.ids[key]; ok {
		e := el.Value.(*pinEntry)
		e.t, e.used, e.source, e.shared = t, now, source, shared
		p.lru.MoveToFront(el)
		return true
	}
	p.ids[key] = p.lru.PushFront(&pinEntry{key: key, id: id, owner: owner, t: t, used: now, source: source, shared: shared})
	for p.lru.Len() > p.cfg.MaxPins {
		old := p.lru.Back()
		p.lru.Remove(old)
		delete(p.ids, old.Value.(*pinEntry).key)
	}
	return true
}

// get returns the target of key (pinKey), refreshing its use (and the fleet's copy, every
// reshareEvery, after releasing the lock); an expired pin is dropped.
func (p *pinTable) get(key string) (kvkey.Target, bool) {
	t, ok, reshare := p.getLocked(key)
	if reshare {
		p.shared.TouchPin(key, t) // keeps the fleet's copy alive while the pin is in use here
	}
	return t, ok
}

func (p *pinTable) getLocked(key string) (t kvkey.Target, ok, reshare bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	el, ok := p.ids[key]
	if !ok {
		return kvkey.Target{}, false, false
	}
	e := el.Value.(*pinEntry)
	now := p.now()
	if p.cfg.TTL > 0 && now.Sub(e.used) > p.cfg.TTL {
		p.lru.Remove(el)
		delete(p.ids, key)
		return kvkey.Target{}, false, false
	}
	e.used = now
	p.lru.MoveToFront(el)
	if p.shared != nil && !e.shared.IsZero() && now.Sub(e.shared) > p.reshareEvery() {
		e.shared = now
		reshare = true
	}
	return e.t, true, reshare
}

// lookup is get of owner's pin of id, falling back on a local miss to the fleet's shared pins
// (bounded by their deadline); a pin found there is kept locally, marked "shared".
func (p *pinTable) lookup(ctx context.Context, id, owner string) (kvkey.Target, string, error) {
	key := pinKey(owner, id)
	if t, ok := p.get(key); ok {
		return t, "", nil
	}
	if p.shared == nil || p.cfg.MaxPins <= 0 {
		return kvkey.Target{}, "no worker is known to store it (never seen by this gateway, expired or evicted)", nil
	}
	t, ok, err := p.shared.LookupPin(ctx, key)
	if err != nil {
		return kvkey.Target{}, "unknown here and the fleet's shared pins could not be read", err
	}
	if !ok {
		return kvkey.Target{}, "no replica of the fleet knows a worker storing it (never seen, expired or evicted)", nil
	}
	p.put(key, id, owner, t, PinShared)
	return t, "", nil
}

// view lists the live pins, most recently used first, at most limit of them.
func (p *pinTable) view(limit int) []PinView {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	out := []PinView{}
	for el := p.lru.Front(); el != nil && len(out) < limit; el = el.Next() {
		e := el.Value.(*pinEntry)
		if p.cfg.TTL > 0 && now.Sub(e.used) > p.cfg.TTL {
			continue
		}
		out = append(out, PinView{ResponseID: e.id, Owner: e.owner, Target: e.t, AgeSeconds: now.Sub(e.used).Seconds(), Source: e.source})
	}
	return out
}

// routePinned is Route for a request pinned to a stored response: the pinned target is the
// only candidate; without a live pin (here, or in the fleet's shared pins) on a routable
// candidate the request fails (hard pin).
func (e *Dispatcher) routePinned(ctx context.Context, req *Request, cands []Candidate) (Decision, Lifecycle, error) {
	id := req.PinResponseID
	t, reason, err := e.pins.lookup(ctx, id, req.Owner)
	if reason != "" {
		if err != nil {
			e.log.Debug("shared pin lookup failed", "response_id", id, "err", err)
		}
		return Decision{}, nil, &UnknownResponseError{ID: id, Reason: reason}
	}
	for _, c := range cands {
		if c.Target == t {
			d := Decision{PromptTokens: req.PromptTokens, Policy: e.policy.Name(),
				Chosen:     Choice{Target: t, Reason: "pinned: previous_response_id " + id},
				Candidates: []CandidateScore{{Target: t, Load: float64(c.InFlight)}}}
			return d, e.commit(d, req, 0, ""), nil
		}
	}
	return Decision{}, nil, &UnknownResponseError{ID: id, Reason: fmt.Sprintf("its worker %s is not routable", t.Worker)}
}
