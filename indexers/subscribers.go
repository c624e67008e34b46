package indexers

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/kvkey"
)

// Subscribers runs one Subscriber per worker+rank into a shared Index and reports on them. The
// gateway creates one, Starts a subscription per configured target, calls WorkerRestarted
// from its health prober, serves Snapshot on GET /debug/workers and registers Collector.
type Subscribers struct {
	ix   *Index
	zctx *zmq.Context
	log  *slog.Logger

	mu         sync.Mutex
	consumer   ChangeConsumer // set by SetConsumer, copied into every subscription
	warm       WarmStarter    // set by SetWarmStarter, copied into every subscription
	warmWait   time.Duration
	subs       map[kvkey.Target]*running
	collectors []*collectorFeed
	zap        *zapHandler // the context's ZAP handler, started with the first guarded collector
	wg         sync.WaitGroup
	// bySub is a copy of subs' subscribers, replaced under mu on every change, so that
	// EventsHealthy (called per routing decision) takes no lock.
	bySub atomic.Pointer[map[kvkey.Target]*Subscriber]
}

// publishLocked refreshes bySub from subs; m.mu must be held.
func (m *Subscribers) publishLocked() {
	cp := make(map[kvkey.Target]*Subscriber, len(m.subs))
	for t, r := range m.subs {
		cp[t] = r.sub
	}
	m.bySub.Store(&cp)
}

// EventsHealthy reports whether t's KV event index can be trusted right now: its subscription
// is live or replaying and its index is exact (not approximate after lost batches, see
// Sequencer). Targets without a subscription, or one that is connecting or backing off, are
// not. It is three atomic loads and a map lookup, cheap enough for every request.
func (m *Subscribers) EventsHealthy(t kvkey.Target) bool {
	p := m.bySub.Load()
	if p == nil {
		return false
	}
	s := (*p)[t]
	return s != nil && s.stats.healthy.Load() && !s.stats.approximate.Load()
}

type running struct {
	sub    *Subscriber
	cancel context.CancelFunc
	done   chan struct{} // nil for a collector's target (the collector runs on)
	shared bool          // fed by a collector
}

// NewSubscribers returns the subscriptions feeding ix, none yet. Close releases its ZMQ context.
func NewSubscribers(ix *Index, log *slog.Logger) (*Subscribers, error) {
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("zmq context: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	return &Subscribers{ix: ix, zctx: zctx, log: log, subs: map[kvkey.Target]*running{}}, nil
}

// SetConsumer makes c hear every change the subscriptions (and Stop with forget) make to the
// index, after the index released its lock. Call it before the first Start: subscriptions
// started earlier keep the consumer they had.
func (m *Subscribers) SetConsumer(c ChangeConsumer) {
	m.mu.Lock()
	m.consumer = c
	m.mu.Unlock()
}

// SetWarmStarter makes every subscription started from now on ask w for a peer's snapshot of
// its target before its first join, waiting at most timeout (0: the default, 5 s).
func (m *Subscribers) SetWarmStarter(w WarmStarter, timeout time.Duration) {
	m.mu.Lock()
	m.warm, m.warmWait = w, timeout
	m.mu.Unlock()
}

func (m *Subscribers) getConsumer() ChangeConsumer {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.consumer
}

// Index returns the index the subscriptions feed.
func (m *Subscribers) Index() *Index { return m.ix }

// TargetConfigs expands one worker's vLLM kv-events settings into per-rank subscriptions with
// vLLM's port offsets (rank r uses port+r for both the PUB and the replay endpoint, vLLM's offset_endpoint_port). The
// endpoints are the ones the gateway connects to, so a port the worker picks at bind time ("*"
// or 0) is an error (ErrEphemeralPort): configure the port the worker bound instead.
func TargetConfigs(worker string, dpSize int, endpoint, replayEndpoint, topic string) ([]SubscriberConfig, error) {
	for _, ep := range []string{endpoint, replayEndpoint} {
		if ephemeralPort(ep) {
			return nil, fmt.Errorf("%w: the gateway cannot connect to %q; give the port the worker bound", ErrEphemeralPort, ep)
		}
	}
	dpSize = max(dpSize, 1)
	out := make([]SubscriberConfig, 0, dpSize)
	for r := range dpSize {
		ep, err := OffsetEndpoint(endpoint, r)
		if err != nil {
			return nil, err
		}
		rep, err := OffsetEndpoint(replayEndpoint, r)
		if err != nil {
			return nil, err
		}
		out = append(out, SubscriberConfig{Target: kvkey.Target{Worker: worker, DPRank: r},
			Endpoint: ep, ReplayEndpoint: rep, Topic: topic})
	}
	return out, nil
}

// CollectorTargets expands one worker fed through the collector into per-rank targets: all
// ranks share the worker's topic (the collector tells them apart by data_parallel_rank) and
// rank r replays on replayEndpoint's port+r, as in TargetConfigs.
func CollectorTargets(worker string, dpSize int, replayEndpoint, topic string) ([]SubscriberConfig, error) {
	if ephemeralPort(replayEndpoint) {
		return nil, fmt.Errorf("%w: the gateway cannot connect to %q; give the port the worker bound", ErrEphemeralPort, replayEndpoint)
	}
	dpSize = max(dpSize, 1)
	out := make([]SubscriberConfig, 0, dpSize)
	for r := range dpSize {
		rep, err := OffsetEndpoint(replayEndpoint, r)
		if err != nil {
			return nil, err
		}
		out = append(out, SubscriberConfig{Target: kvkey.Target{Worker: worker, DPRank: r}, ReplayEndpoint: rep, Topic: topic})
	}
	return out, nil
}

// Start begins following one target's stream until ctx ends, Stop or Close. Starting an
// already running target replaces its subscription.
func (m *Subscribers) Start(ctx context.Context, cfg SubscriberConfig) error {
	if err := m.ix.AddTarget(cfg.Target); err != nil {
		return err
	}
	m.Stop(cfg.Target, false)
	if cfg.Consumer == nil {
		cfg.Consumer = m.getConsumer()
	}
	if cfg.WarmStart == nil {
		m.mu.Lock()
		cfg.WarmStart = m.warm
		if cfg.SnapshotTimeout == 0 {
			cfg.SnapshotTimeout = m.warmWait
		}
		m.mu.Unlock()
	}
	sctx, cancel := context.WithCancel(ctx)
	r := &running{sub: NewSubscriber(m.zctx, m.ix, cfg, m.log), cancel: cancel, done: make(chan struct{})}
	m.mu.Lock()
	m.subs[cfg.Target] = r
	m.publishLocked()
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(r.done)
		if err := r.sub.Run(sctx); err != nil {
			m.log.Error("kv-events subscriber stopped", "target", cfg.Target.String(), "err", err)
		}
	}()
	return nil
}

// Stop ends a target's subscription and waits for it; with forget, its blocks leave the index.
func (m *Subscribers) Stop(t kvkey.Target, forget bool) {
	m.mu.Lock()
	r := m.subs[t]
	delete(m.subs, t)
	m.publishLocked()
	m.mu.Unlock()
	if r != nil && r.shared {
		r.sub.forgotten.Store(true) // the collector drops its batches from now on
	} else if r != nil {
		r.cancel()
		<-r.done
	}
	if forget {
		if c := m.getConsumer(); c != nil {
			var cs ChangeSet
			m.ix.RemoveTargetTo(t, &cs)
			if !cs.Empty() {
				c.IndexChanged(&cs)
			}
		} else {
			m.ix.RemoveTarget(t)
		}
	}
}

// WorkerRestarted reports that a worker's health flapped (ejected, then readmitted). Each of
// its ranks treats it as a hint and checks it against the worker's replay ring: the index
// state is reset only if the engine did restart (see Sequencer).
func (m *Subscribers) WorkerRestarted(worker string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for t, r := range m.subs {
		if t.Worker == worker {
			r.sub.MarkRestarted()
		}
	}
}

// Close stops every subscription and terminates the ZMQ context.
func (m *Subscribers) Close() error {
	m.mu.Lock()
	for _, r := range m.subs {
		r.cancel()
	}
	for _, c := range m.collectors {
		c.cancel()
	}
	m.subs = map[kvkey.Target]*running{}
	m.publishLocked()
	m.mu.Unlock()
	m.wg.Wait()
	m.mu.Lock()
	zap := m.zap
	m.zap = nil
	m.mu.Unlock()
	if zap != nil {
		zap.close() // its socket must be closed before the context can end
	}
	return m.zctx.Term()
}

// TargetDebug is one target's entry in GET /debug/workers.
type TargetDebug struct {
	Worker          string           `json:"worker"`
	DPRank          int              `json:"dp_rank"`
	Endpoint        string           `json:"endpoint,omitempty"`
	ReplayEndpoint  string           `json:"replay_endpoint,omitempty"`
	State           string           `json:"state"`
	LastSeq         uint64           `json:"last_seq"`
	HaveSeq         bool             `json:"have_seq"`
	IndexMode       string           `json:"index_mode"`
	IndexModeReason string           `json:"index_mode_reason,omitempty"`
	LastBatchAgeSec float64          `json:"last_batch_age_seconds,omitempty"`
	Batches         int64            `json:"batches"`
	Gaps            int64            `json:"gaps"`
	ReplaysOK       int64            `json:"replays_ok"`
	ReplaysFailed   int64            `json:"replays_failed"`
	Resets          map[string]int64 `json:"resets"`
	ParseErrors     map[string]int64 `json:"parse_errors"`
	Reconnects      int64            `json:"reconnects"`
	JoinReplays     int64            `json:"join_replays"`
	// ReconnectChecks counts the replay-ring checks a reconnect of the SUB started (a worker
	// that restarted fast, without a /health flap, re-accepts the connection).
	ReconnectChecks  int64            `json:"reconnect_checks"`
	LateDuplicates   int64            `json:"late_duplicates"`
	Dropped          map[string]int64 `json:"dropped_batches"`
	ResidentBlocks   map[string]int64 `json:"resident_blocks"`
	Orphans          int64            `json:"orphans_g1"`
	IndexBlocks      int              `json:"index_blocks"`
	IndexBytesApprox int64            `json:"index_bytes_approx"`
	ResidencyVersion uint64           `json:"residency_version"`
	DroppedBlocks    map[string]int64 `json:"dropped_blocks,omitempty"`
	// ChainRecoveries counts stores with an unknown parent that were placed under a recently
	// routed prompt ("recovered") or dropped ("failed").
	ChainRecoveries map[string]int64 `json:"chain_recoveries"`
	// WarmStart is the target's last warm start from a peer's snapshot (absent without a
	// cluster, or before the first attempt).
	WarmStart *WarmStartDebug `json:"warm_start,omitempty"`
}

// BytesPerBlock is the approximate index memory per distinct block per target (global entry,
// external-hash entry and node, with Go map overhead), as measured by BenchmarkMemoryPerBlock.
const BytesPerBlock = 190

// Snapshot returns every known target's subscription state and index size, sorted by target.
func (m *Subscribers) Snapshot() []TargetDebug {
	m.mu.Lock()
	subs := make(map[kvkey.Target]*Subscriber, len(m.subs))
	for t, r := range m.subs {
		subs[t] = r.sub
	}
	m.mu.Unlock()
	reg := m.ix.reg.Load()
	out := make([]TargetDebug, 0, len(reg.byTarget))
	for t, ts := range reg.byTarget {
		d := TargetDebug{Worker: t.Worker, DPRank: t.DPRank, State: "unsubscribed", IndexMode: ModeApproximate,
			ResidentBlocks: map[string]int64{}, Orphans: ts.orphans[0].Load(),
			ResidencyVersion: ts.version.Load(), DroppedBlocks: map[string]int64{}}
		for k := range Tier(numTiers) {
			d.ResidentBlocks[k.String()] = ts.resident[k].Load()
		}
		for i, name := range dropNames {
			if v := ts.stats.drops[i].Load(); v > 0 {
				d.DroppedBlocks[name] = v
			}
		}
		ts.mu.Lock()
		d.IndexBlocks = ts.blocks()
		ts.mu.Unlock()
		d.IndexBytesApprox = int64(d.IndexBlocks) * BytesPerBlock
		d.Resets = map[string]int64{"total": ts.stats.resets.Load()}
		d.ChainRecoveries = map[string]int64{"recovered": ts.stats.recovered.Load(), "failed": ts.stats.unrecovered.Load()}
		if s := subs[t]; s != nil {
			st := &s.stats
			d.Endpoint, d.ReplayEndpoint = s.cfg.Endpoint, s.cfg.ReplayEndpoint
			d.State, _ = st.state.Load().(string)
			d.LastSeq, d.HaveSeq = st.lastSeq.Load(), st.haveSeq.Load()
			d.IndexMode = ModeExact
			if st.approximate.Load() {
				d.IndexMode = ModeApproximate
			}
			d.IndexModeReason, _ = st.modeReason.Load().(string)
			d.Dropped = map[string]int64{DropLateDuplicate: st.lateDuplicates.Load(), DropStale: st.stale.Load(),
				DropImplausible: st.implausible.Load(), DropUnconfirmed: st.unconfirmed.Load(),
				DropSkipped: st.skippedSeq.Load()}
			if ns := st.lastEvent.Load(); ns > 0 {
				d.LastBatchAgeSec = time.Since(time.Unix(0, ns)).Seconds()
			}
			d.Batches, d.Gaps = st.batches.Load(), st.gaps.Load()
			d.ReplaysOK, d.ReplaysFailed = st.replaysOK.Load(), st.replaysFailed.Load()
			d.Resets[ResetGap] = st.resetsGap.Load()
			d.Resets[ResetRestart] = st.resetsRestart.Load()
			d.Resets[ResetHealth] = st.resetsHealth.Load()
			if v := st.resetsWarm.Load(); v > 0 {
				d.Resets[ResetWarmStart] = v
			}
			s.cursor.mu.Lock()
			if w := s.cursor.warm; w != nil {
				cp := *w
				d.WarmStart = &cp
			}
			s.cursor.mu.Unlock()
			d.ParseErrors = map[string]int64{"frames": st.parseFrames.Load(), "payload": st.parsePayload.Load(),
				"malformed_event": st.malformed.Load(), "unknown_event": st.unknownEvents.Load(),
				"dp_rank_mismatch": st.rankMismatch.Load(), "replay_buffer_overflow": st.pendingOverflow.Load()}
			d.Reconnects = st.reconnects.Load()
			d.JoinReplays = st.joinReplays.Load()
			d.ReconnectChecks = st.reconnectChecks.Load()
			d.LateDuplicates = st.lateDuplicates.Load()
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Worker != out[j].Worker {
			return out[i].Worker < out[j].Worker
		}
		return out[i].DPRank < out[j].DPRank
	})
	return out
}
