package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/cluster"
	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/server"
	"github.com/kvgate/kvgate/sessions"
	"github.com/kvgate/kvgate/tokenize"
	"github.com/kvgate/kvgate/workers"
)

// routing is everything that decides where a request goes: the policy (wrapped in a
// router.Dispatcher that accounts load and closes the loop on usage), the optional request enricher
// (tokenizer → block hashes), the session tracker, the KV-event subscriptions, and the
// background work they need, stopped by close.
type routing struct {
	dispatcher *router.Dispatcher // the server's router.Router
	enricher   server.RequestEnricher
	sessions   *sessions.Tracker
	events     *indexers.Subscribers
	bindings   *cluster.Bindings // the fleet's shared bindings and pins (nil: one replica)
	close      func()
}

// buildRouting assembles the routing for cfg. This is the one place where the KV-aware
// policies' dependencies (tokenizer, event index, sessions, metrics scraper) get wired in; the
// simple policies need none of them. node is the replica's cluster membership (nil: one
// replica, nothing shared). Background work runs until close is called.
func buildRouting(ctx context.Context, cfg configs.Config, reg *workers.Registry, prom prometheus.Registerer, log *slog.Logger, node *cluster.Node) (*routing, error) {
	return buildRoutingWith(ctx, cfg, reg, prom, log, node, loadTokenizer)
}

// tokenizerLoader loads the tokenizer of a pool's config (loadTokenizer, for the gateway).
type tokenizerLoader func(cfg configs.Config) (*tokenize.Tokenizer, error)

// buildRoutingWith is buildRouting with the tokenizer loaded by load: the end-to-end tests pass
// one that shares a loaded tokenizer across the gateways of a test binary (a load takes seconds
// under -race).
func buildRoutingWith(ctx context.Context, cfg configs.Config, reg *workers.Registry, prom prometheus.Registerer, log *slog.Logger, node *cluster.Node, load tokenizerLoader) (rt *routing, err error) {
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	var closers []func()
	closeAll := func() {
		stop()
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	rt = &routing{close: closeAll}
	defer func() {
		if err != nil {
			closeAll() // a failed return has already set rt to nil
			rt = nil
		}
	}()

	kvcfg := cfg.Router.KV
	opts := router.Options{Seed: cfg.Router.Seed, KV: kvcfg}
	dispOpts := router.DispatcherOptions{Registerer: prom, Log: log, Busy: kvcfg,
		Pins: router.PinConfig{MaxPins: cfg.Router.Responses.MaxPins, TTL: cfg.Router.Responses.PinTTL.D()}}
	// Several replicas: session bindings and Responses pins are shared through the fleet's
	// JetStream buckets (cluster.Bindings), read from a local cache and written behind.
	var bindings *cluster.Bindings
	var kv *kvParts
	if node != nil {
		if bindings, err = cluster.NewBindings(node, cluster.BindingsOptions{MaxEntries: cfg.Sessions.MaxSessions,
			PinTTL: cfg.Router.Responses.PinTTL.D(), MaxRequestAge: cfg.Router.KV.LoadExpiry.D(),
			Registerer: prom, Log: log}); err != nil {
			return nil, err
		}
		bindings.Start(bg)
		closers = append(closers, bindings.Close)
		rt.bindings = bindings
		dispOpts.SharedPins = bindings
	}
	if configs.KVAware(cfg.Router.Policy) {
		k, err := buildKV(bg, cfg, kvcfg, reg, prom, log, node, load)
		if err != nil {
			return nil, err
		}
		kv = k
		closers = append(closers, k.close)
		rt.enricher, rt.sessions, rt.events = k.enricher, k.sessions, k.events
		opts.KVDeps = k.deps
		dispOpts.Targets = func() []kvkey.Target { return allTargets(reg) }
		dispOpts.MetricsClient = scrapeClient(cfg, reg)
		dispOpts.MetricsInterval = kvcfg.MetricsInterval.D()
	}
	var disp *router.Dispatcher
	// A worker whose process_start_time_seconds changed restarted, /health flap or not: the
	// same check as a flap (below), without waiting for its first new event.
	dispOpts.OnWorkerRestart = func(url string) {
		for _, w := range reg.Workers() {
			if w.URL() != url {
				continue
			}
			log.Info("worker restarted (process_start_time_seconds changed); checking its KV-event state", "worker", url)
			if rt.events != nil {
				rt.events.WorkerRestarted(url)
			}
			for rank := range w.DPSize() {
				t := kvkey.Target{Worker: url, DPRank: rank}
				if rt.sessions != nil {
					rt.sessions.ApplyCleared(t)
				}
				disp.Forget(t)
			}
		}
	}
	if bindings != nil && rt.sessions != nil {
		rt.sessions.SetShared(bindings)
	}
	dispOpts.Sessions, dispOpts.Events = rt.sessions, rt.events
	disp, err = router.Build(cfg.Router.Policy, opts, dispOpts)
	if err != nil {
		return nil, fmt.Errorf("router.policy: %w", err)
	}
	rt.dispatcher = disp
	if prom != nil {
		mc := newMemoryCollector(func() int { return len(allTargets(reg)) }, disp, nil, nil, rt.sessions)
		if kv != nil {
			mc.tok, mc.index = kv.tok, kv.index
		}
		if err := prom.Register(mc); err != nil {
			return nil, fmt.Errorf("memory metrics: %w", err)
		}
	}
	if node != nil {
		// In-flight load (and approximate-mode routing) shared with the peer replicas, for the
		// targets of this replica's fleet as it is at each message.
		known := func(t kvkey.Target) bool {
			w := reg.Get(t.Worker)
			return w != nil && t.DPRank >= 0 && t.DPRank < w.DPSize()
		}
		ls, err := cluster.StartLoadSync(bg, node, cluster.LoadSyncOptions{Approx: opts.KVDeps.Approx,
			KnownTarget: known, Registerer: prom, Log: log})
		if err != nil {
			return nil, err
		}
		closers = append(closers, ls.Close)
		disp.SetFleet(ls.Fleet())
	}
	// A worker whose /health flapped may have restarted with an empty cache: what approximate
	// mode assumed about it is void (the event streams check the worker's replay ring and reset
	// only if the engine restarted, see buildKV).
	reg.OnChange(func(w *workers.Worker, change string) {
		if change == workers.ChangeReadmitted {
			for rank := range w.DPSize() {
				disp.Forget(kvkey.Target{Worker: w.URL(), DPRank: rank})
			}
		}
	})
	followMembership(bg, reg, disp, kv, log)
	done := make(chan struct{})
	go func() { defer close(done); disp.Run(bg) }()
	closers = append(closers, func() { <-done })
	return rt, nil
}

// sessionsConfig maps the sessions section (sessionsconfig.Config) onto the tracker's config.
// Both take every value as given (0 credit = that hint off), so the keys copy over unchanged;
// the identity headers go to the server's identity parser, not here.
func sessionsConfig(s configs.Sessions) sessions.Config {
	c := sessions.Defaults()
	c.MaxSessions = s.MaxSessions
	c.MaxNodes = s.MaxNodes
	c.AffinityBlocks = s.AffinityBlocks
	c.ParentAware = s.ParentAware
	c.ParentMode = s.ParentMode
	c.ParentBlocks = s.ParentBlocks
	c.GroupTargets = s.GroupTargets
	c.SiblingPrefix = s.SiblingPrefix
	c.PendingTTL = s.PendingTTL.D()
	return c
}

// kvParts are the KV-aware policies' collaborators built by buildKV.
type kvParts struct {
	deps     router.KVDeps
	enricher server.RequestEnricher
	sessions *sessions.Tracker
	events   *indexers.Subscribers
	tok      *tokenize.Tokenizer
	index    *indexers.Index
	// subscribe starts following a worker's KV events; it returns how many streams it started.
	subscribe func(ctx context.Context, w configs.Worker) (int, error)
	close     func()
}

// buildKV loads the tokenizer, creates the event index with the session tracker listening to
// it, subscribes to every worker+rank that publishes KV events, and ties health flaps to the
// subscriptions' restart handling. With a cluster node, the subscriptions warm-start from
// peers' index snapshots and serve this replica's (warmstart.go).
func buildKV(ctx context.Context, cfg configs.Config, kvcfg router.KVConfig, reg *workers.Registry, prom prometheus.Registerer, log *slog.Logger, node *cluster.Node, load tokenizerLoader) (*kvParts, error) {
	start := time.Now()
	tok, err := load(cfg)
	if err != nil {
		return nil, err
	}
	log.Info("tokenizer loaded", "dir", cfg.Tokenizer, "took", time.Since(start).Round(time.Millisecond))

	// The subscriptions hand the sessions layer every change set the index applied, strictly
	// after applying it and after releasing the index's lock; the sessions layer reads the index
	// for its route-time updates. The feed is wired before any subscription starts, so no event
	// can miss it.
	ix := indexers.NewIndex(indexers.Options{BlockSize: cfg.BlockSize})
	sm, err := sessions.New(sessionsConfig(cfg.Sessions), ix, log)
	if err != nil {
		return nil, fmt.Errorf("sessions: %w", err)
	}
	mgr, err := indexers.NewSubscribers(ix, log)
	if err != nil {
		return nil, err
	}
	mgr.SetConsumer(&sessionFeed{m: sm})
	parts := &kvParts{sessions: sm, events: mgr, tok: tok, index: ix, close: func() {
		if err := mgr.Close(); err != nil {
			log.Warn("closing KV-event subscriptions", "err", err)
		}
	}}
	if prom != nil {
		if err := mgr.Register(prom); err != nil {
			parts.close()
			return nil, fmt.Errorf("kv-event metrics: %w", err)
		}
	}
	if node != nil {
		stop, err := wireWarmStart(node, mgr, prom, log)
		if err != nil {
			parts.close()
			return nil, err
		}
		closeMgr := parts.close
		parts.close = func() { stop(); closeMgr() }
	}
	// subscribe follows one worker's KV events (every DP rank), for the static workers here
	// and for each worker discovery adds later (followMembership). A worker without an event
	// endpoint is routed in approximate mode.
	parts.subscribe = func(ctx context.Context, w configs.Worker) (int, error) {
		if w.KVEvents == "" {
			return 0, nil
		}
		subs, err := indexers.TargetConfigs(w.URL, w.DPSize, w.KVEvents, w.Replay, w.Topic)
		if err != nil {
			return 0, fmt.Errorf("kv_events: %w", err)
		}
		for i, sc := range subs {
			sc.MaxMsgSize, sc.SettleTime = int64(cfg.KVEvents.MaxMsgSize), cfg.KVEvents.Settle.D()
			if err := mgr.Start(ctx, sc); err != nil {
				for _, started := range subs[:i] {
					mgr.Stop(started.Target, true)
				}
				return 0, fmt.Errorf("subscribe %s: %w", sc.Endpoint, err)
			}
		}
		return len(subs), nil
	}
	subscribed := 0
	for i, w := range cfg.Workers {
		n, err := parts.subscribe(ctx, w)
		if err != nil {
			parts.close()
			return nil, fmt.Errorf("workers[%d]: %w", i, err)
		}
		subscribed += n
	}
	if cfg.KVEvents.Listen != "" {
		access, err := collectorAccess(cfg.KVEvents)
		if err != nil {
			parts.close()
			return nil, err
		}
		cc := indexers.CollectorConfig{Listen: cfg.KVEvents.Listen, MaxMsgSize: int64(cfg.KVEvents.MaxMsgSize), Access: access}
		for i, w := range cfg.Workers {
			if !cfg.CollectorWorker(w) {
				continue
			}
			subs, err := indexers.CollectorTargets(w.URL, w.DPSize, w.Replay, w.Topic)
			if err != nil {
				parts.close()
				return nil, fmt.Errorf("workers[%d].replay: %w", i, err)
			}
			for _, sc := range subs {
				sc.SettleTime = cfg.KVEvents.Settle.D()
				cc.Targets = append(cc.Targets, sc)
			}
		}
		if err := mgr.StartCollector(ctx, cc); err != nil {
			parts.close()
			return nil, fmt.Errorf("kv_events.listen: %w", err)
		}
		subscribed += len(cc.Targets)
	}
	// A readmitted worker's /health flapped: it may have restarted with an empty cache and a
	// new event sequence. Its event streams check that against the worker's replay ring and
	// reset their index state only if the engine did restart (indexers.Sequencer).
	reg.OnChange(func(w *workers.Worker, change string) {
		if change == workers.ChangeReadmitted {
			log.Info("worker health flapped; checking its KV-event state", "worker", w.URL())
			mgr.WorkerRestarted(w.URL())
			for rank := range w.DPSize() {
				sm.ApplyCleared(kvkey.Target{Worker: w.URL(), DPRank: rank})
			}
		}
	})
	parts.deps = router.KVDeps{
		Events: router.SubscriberHealth(mgr),
		Approx: router.NewApproxIndex(kvcfg.Approximate),
		Load:   router.NewLoadTracker(kvcfg.LoadExpiry.D()),
		Hints:  sm,
	}
	if subscribed > 0 || cfg.Discovery.Events() {
		parts.deps.Matcher = ix
	}
	parts.enricher = &enricher{tok: tok, blockSize: cfg.BlockSize, baseModel: cfg.Model}
	if tok.Harmony() {
		log.Warn("gpt-oss (Harmony) model: /v1/responses requests are routed without block hashes (vLLM renders them with Harmony, not the chat template, and the gateway does not reproduce it)",
			"model", cfg.Model)
	}
	log.Info("KV-aware routing ready", "policy", cfg.Router.Policy, "event_streams", subscribed,
		"approximate_workers", len(cfg.Workers)-eventWorkers(cfg))
	return parts, nil
}

func eventWorkers(cfg configs.Config) int {
	n := 0
	for _, w := range cfg.Workers {
		if w.KVEvents != "" || cfg.CollectorWorker(w) {
			n++
		}
	}
	return n
}

// allTargets lists every worker+rank of the fleet (routable or not: a worker's /metrics is
// worth reading even while it is ejected).
func allTargets(reg *workers.Registry) []kvkey.Target {
	var out []kvkey.Target
	for _, w := range reg.Workers() {
		for rank := range w.DPSize() {
			out = append(out, kvkey.Target{Worker: w.URL(), DPRank: rank})
		}
	}
	return out
}

// scrapeClient reads the workers' /metrics directly (never through an environment proxy), with
// the proxy's dial timeout and each worker's API key; the scraper bounds each scrape by its
// interval.
func scrapeClient(cfg configs.Config, reg *workers.Registry) *http.Client {
	return &http.Client{Transport: reg.AuthTransport(&http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: cfg.Proxy.DialTimeout.D()}).DialContext,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     cfg.Proxy.IdleConnTimeout.D(),
	})}
}

// sessionFeed passes the index's residency changes to the session tracker. It runs on the
// subscriber goroutine that applied the event, after the index applied it and released its
// lock (indexers.ChangeConsumer).
type sessionFeed struct{ m *sessions.Tracker }

var _ indexers.ChangeConsumer = (*sessionFeed)(nil)

// IndexChanged replays one change set, in order, into the session tracker.
func (f *sessionFeed) IndexChanged(cs *indexers.ChangeSet) {
	for i := range cs.Changes {
		c := &cs.Changes[i]
		switch c.Kind {
		case indexers.ChangeStoredRun:
			f.BlocksStoredFrom(cs.Target, c.Tier, c.Hashes, c.Parent, c.HasParent, c.SessionID)
		case indexers.ChangeRemoved:
			f.BlocksRemoved(cs.Target, c.Tier, c.Hashes)
		case indexers.ChangeCleared:
			f.Cleared(cs.Target, c.AllTiers)
		}
		// ChangeStored is not forwarded: the ChangeStoredRun that follows it for the same event
		// carries the whole run with its parent and session, which the session tracker needs.
	}
}

// BlocksStoredFrom hears each token-carrying store as a whole run: the blocks in chain order
// (our hashes), our hash of the parent block (hasParent false for block 0 of a prompt) and the
// event's session_id (vLLM attributes events to the X-Session-ID the gateway forwards). GPU
// stores advance that session's frontier and graft the session forest.
func (f *sessionFeed) BlocksStoredFrom(t kvkey.Target, tier indexers.Tier, hashes []kvkey.BlockHash, parent kvkey.BlockHash, hasParent bool, sessionID string) {
	if tier != indexers.G1 || f.m == nil {
		return
	}
	if !hasParent {
		parent = 0 // sessions: 0 means the first block is a prompt's block 0
	}
	// A rejected update (conflicting or cyclic parentage) changed nothing and is counted by the
	// session tracker; the physical index already applied the event.
	// The id is the hashed one the gateway forwarded; a worker that echoes a body session_id
	// instead reports the client's own, which is hashed here to the same key (HashSessionID leaves an
	// already hashed id alone).
	_ = f.m.ApplyStored(t, hashes, parent, kvkey.HashSessionID(sessionID))
}

// BlocksRemoved recedes session frontiers past evicted GPU blocks.
func (f *sessionFeed) BlocksRemoved(t kvkey.Target, tier indexers.Tier, hashes []kvkey.BlockHash) {
	if tier == indexers.G1 && f.m != nil {
		f.m.ApplyRemoved(t, hashes)
	}
}

// Cleared drops the target's session frontiers (AllBlocksCleared, or a reset of the target).
func (f *sessionFeed) Cleared(t kvkey.Target, _ bool) {
	if f.m != nil {
		f.m.ApplyCleared(t)
	}
}
