package router

import (
	"container/list"
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

// pinTable is a bounded LRU map of response id → target, with a TTL since last use.
type pinTable struct {
	cfg PinConfig
	now func() time.Time

	mu  sync.Mutex
	lru *list.List // of *pinEntry, most recent at the front
	ids map[string]*list.Element
}

type pinEntry struct {
	id   string
	t    kvkey.Target
	used time.Time
}

// PinView is one pin in the debug view.
type PinView struct {
	ResponseID string       `json:"response_id"`
	Target     kvkey.Target `json:"target"`
	AgeSeconds float64      `json:"idle_seconds"`
}

func newPinTable(cfg PinConfig) *pinTable {
	return &pinTable{cfg: cfg, now: time.Now, lru: list.New(), ids: map[string]*list.Element{}}
}

// put pins id to t (a response id seen again moves to t).
func (p *pinTable) put(id string, t kvkey.Target) {
	if id == "" || p.cfg.MaxPins <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if el, ok := p.ids[id]; ok {
		e := el.Value.(*pinEntry)
		e.t, e.used = t, p.now()
		p.lru.MoveToFront(el)
		return
	}
	p.ids[id] = p.lru.PushFront(&pinEntry{id: id, t: t, used: p.now()})
	for p.lru.Len() > p.cfg.MaxPins {
		old := p.lru.Back()
		p.lru.Remove(old)
		delete(p.ids, old.Value.(*pinEntry).id)
	}
}

// get returns id's target, refreshing its use; an expired pin is dropped.
func (p *pinTable) get(id string) (kvkey.Target, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	el, ok := p.ids[id]
	if !ok {
		return kvkey.Target{}, false
	}
	e := el.Value.(*pinEntry)
	now := p.now()
	if p.cfg.TTL > 0 && now.Sub(e.used) > p.cfg.TTL {
		p.lru.Remove(el)
		delete(p.ids, id)
		return kvkey.Target{}, false
	}
	e.used = now
	p.lru.MoveToFront(el)
	return e.t, true
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
		out = append(out, PinView{ResponseID: e.id, Target: e.t, AgeSeconds: now.Sub(e.used).Seconds()})
	}
	return out
}

// routePinned is Route for a request pinned to a stored response: the pinned target is the
// only candidate; without a live pin on a routable candidate the request fails (hard pin).
func (e *Dispatcher) routePinned(req *Request, cands []Candidate) (Decision, Lifecycle, error) {
	id := req.PinResponseID
	t, ok := e.pins.get(id)
	if !ok {
		return Decision{}, nil, &UnknownResponseError{ID: id, Reason: "no worker is known to store it (never seen by this gateway, expired or evicted)"}
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
