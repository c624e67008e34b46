package sessions

import (
	"log/slog"
	"sync"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// Residency is what the session index needs from the physical (tiered) index.
type Residency interface {
	// ResidencyVersion increases on every removal or clear on the target.
	ResidencyVersion(t kvkey.Target) uint64
	// IsResidentG1 reports whether the block is resident on the target's GPU.
	IsResidentG1(t kvkey.Target, hash kvkey.BlockHash) bool
	// DeepestG1 returns how many leading hashes are resident on the target's GPU.
	DeepestG1(t kvkey.Target, hashes []kvkey.BlockHash) int
}

// Tracker owns session state: identity records, affinity, the shared prefix forest with per-session
// per-target frontiers, and the hints derived from them. It is safe for concurrent use. State
// changes (Observe, End, OnRouted and the event methods) hold mu, the state lock; each publishes
// the hint records it changed to the hint table before releasing it. Hints reads only the hint
// table, under its read lock, so a routing decision never waits for an event batch being applied
// (see the package doc for the lock order). Event methods (ApplyStored, ApplyRemoved,
// ApplyCleared) must be called after the physical index applied the same event (that order is
// what makes the residency version guard of OnRouted sound), and the caller must not hold a lock
// that the index's read methods need: OnRouted calls ResidencyVersion and, on its rare verify
// path, DeepestG1 while holding mu. (indexers hands its change sets over after releasing its
// locks, so its ChangeConsumer may call them.)
type Tracker struct {
	cfg Config
	idx Residency
	log *slog.Logger
	now func() time.Time

	mu       sync.Mutex
	f        *forest
	sess     []session
	freeSess []uint32
	byID     map[string]uint32
	head     uint32
	tail     uint32
	tick     uint64
	rev      map[kvkey.Target]map[NodeRef]revList
	rmHits   []removalHit // ApplyRemoved scratch
	rmBelow  []uint32
	rmSess   []sessRef
	pendQ    []pendEntry // pending chains in routing order, for expiry (stale entries skipped)
	dirty    []sessRef   // sessions whose hint record must be republished (see publish)
	gone     []string    // ids of sessions released since the last publish

	// hints is the hint side: what Hints reads, under its own lock (see hinttable.go).
	hints hintTable
	stats counters
	// shared is the fleet's session bindings (nil: one replica). Only its Lookup, which takes
	// a leaf lock, is called under mu or the hint table's lock.
	shared SharedBindings
}

// New returns a Tracker. idx may be nil (no KV events): then only affinity and parent placement
// from affinity work, and frontiers come only from stored events.
func New(cfg Config, idx Residency, log *slog.Logger) (*Tracker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}

	return &Tracker{
		cfg: cfg, idx: idx, log: log.With("component", "sessions"), now: time.Now,
		f:    newForest(cfg.MaxNodes),
		byID: make(map[string]uint32),
		head: nilSlot, tail: nilSlot,
		rev:   make(map[kvkey.Target]map[NodeRef]revList),
		hints: hintTable{byID: make(map[string]*hintRec)},
	}, nil
}

// Config returns the effective configuration (defaults applied).
func (m *Tracker) Config() Config { return m.cfg }

// Observe records a request's identity: it creates or refreshes the session and remembers its
// parent (the first parent named wins). Call it when the request is parsed, before routing.
func (m *Tracker) Observe(id Identity) {
	if id.SessionID == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	defer m.publish()
	s, r := m.getOrCreate(id.SessionID, false, sessRef{slot: nilSlot})
	if s.parent == "" && id.ParentID != "" && id.ParentID != id.SessionID {
		s.parent = id.ParentID
		m.markDirty(r)
	}
}

// End releases a session's state (end of session). Unknown ids are ignored.
func (m *Tracker) End(sessionID string) {
	if m.shared != nil && sessionID != "" {
		m.shared.Ended(sessionID)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	defer m.publish()
	if slot, ok := m.byID[sessionID]; ok {
		m.release(slot)
		m.stats.closed.Add(1)
	}
}
