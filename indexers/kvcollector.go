package indexers

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// CollectorConfig describes collector mode: kvgate binds one SUB socket and every worker's
// publisher connects to it (vLLM's ZmqEventPublisher connects when its endpoint has no "*",
// as in llm-d's centralized deployments that point every pod at one collector). Each message is
// attributed to a worker by its topic and to a rank by its batch's data_parallel_rank.
type CollectorConfig struct {
	// Listen is the address the SUB binds, e.g. tcp://127.0.0.1:5557 or tcp://*:5557.
	Listen string
	// Targets are the worker+ranks fed through the collector. Topic must be the worker's exact
	// topic (e.g. llm-d's "kv@<pod-ip>:<port>@<model>"); every rank of a worker has the same
	// topic. Endpoint and Bind are ignored; ReplayEndpoint is each rank's own replay ROUTER.
	Targets []SubscriberConfig
	// RcvHWM, MaxMsgSize, ReconnectMin and ReconnectMax are as in SubscriberConfig (same
	// defaults).
	RcvHWM                     int
	MaxMsgSize                 int64
	ReconnectMin, ReconnectMax time.Duration
	// Access is who may publish (collector_access.go); nil = anyone who reaches Listen.
	Access *CollectorAccess
}

// maxUnknownTopics bounds the unknown topics remembered for GET /debug/workers.
const maxUnknownTopics = 16

// collectorFeed is a running collector.
type collectorFeed struct {
	cfg    CollectorConfig
	cancel context.CancelFunc
	done   chan struct{}

	byTopic map[string]map[int]*Subscriber // topic → dp rank → target
	guard   *collectorGuard                // nil: no access control

	unknownTopic, unknownRank, bindErrors atomic.Int64
	state                                 atomic.Value // string

	mu     sync.Mutex
	recent []string // most recent unknown topics, newest last, at most maxUnknownTopics
}

// CollectorDebug is a collector's entry in GET /debug/workers.
type CollectorDebug struct {
	Listen       string `json:"listen"`
	State        string `json:"state"`
	Targets      int    `json:"targets"`
	UnknownTopic int64  `json:"unknown_topic_messages"`
	UnknownRank  int64  `json:"unknown_rank_messages"`
	// WrongSender counts messages whose sender is not an address of their topic's worker;
	// RefusedConnections the publishers the ZAP handler turned away.
	WrongSender        int64    `json:"wrong_sender_messages"`
	RefusedConnections int64    `json:"refused_connections"`
	RecentUnknown      []string `json:"recent_unknown_topics,omitempty"`
}

func (c *collectorFeed) noteUnknown(topic string) {
	c.unknownTopic.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, t := range c.recent {
		if t == topic {
			c.recent = append(c.recent[:i], c.recent[i+1:]...)
			break
		}
	}
	if len(c.recent) >= maxUnknownTopics {
		c.recent = c.recent[1:]
	}
	c.recent = append(c.recent, topic)
}

// route attributes a message: topic → worker, data_parallel_rank → rank (0 when absent).
func (c *collectorFeed) route(m LiveMessage) *Subscriber {
	ranks := c.byTopic[m.Topic]
	if ranks == nil {
		c.noteUnknown(m.Topic)
		return nil
	}
	rank := 0
	r, err := BatchDPRank(m.Payload)
	switch {
	case err != nil && len(ranks) == 1:
		for _, s := range ranks {
			return s.live() // the payload error is counted when it is applied
		}
	case err != nil:
		c.unknownRank.Add(1)
		return nil
	case r.Set:
		rank = int(r.V)
	}
	s := ranks[rank].live()
	if s == nil {
		c.unknownRank.Add(1)
	}
	return s
}

// StartCollector binds cfg.Listen and follows every target's stream through it until ctx
// ends or Close. The targets show in Snapshot and EventsHealthy like subscribed ones; Stop on
// one of them only forgets it.
func (m *Subscribers) StartCollector(ctx context.Context, cfg CollectorConfig) error {
	if cfg.Listen == "" {
		return fmt.Errorf("kv-events collector: no listen address")
	}
	c := &collectorFeed{cfg: cfg, byTopic: map[string]map[int]*Subscriber{}, done: make(chan struct{})}
	c.state.Store(StateConnecting)
	subs := make([]*Subscriber, 0, len(cfg.Targets))
	consumer := m.getConsumer()
	for _, tc := range cfg.Targets {
		if tc.Consumer == nil {
			tc.Consumer = consumer
		}
		if err := m.ix.AddTarget(tc.Target); err != nil {
			return err
		}
		ranks := c.byTopic[tc.Topic]
		if ranks == nil {
			ranks = map[int]*Subscriber{}
			c.byTopic[tc.Topic] = ranks
		}
		if ranks[tc.Target.DPRank] != nil {
			return fmt.Errorf("kv-events collector: topic %q rank %d configured twice", tc.Topic, tc.Target.DPRank)
		}
		tc.Endpoint, tc.Bind = cfg.Listen, true
		if cfg.MaxMsgSize != 0 {
			tc.MaxMsgSize = cfg.MaxMsgSize
		}
		s := NewSubscriber(m.zctx, m.ix, tc, m.log)
		ranks[tc.Target.DPRank] = s
		subs = append(subs, s)
	}
	sctx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	if cfg.Access != nil {
		if err := m.guardCollector(sctx, c); err != nil {
			cancel()
			return err
		}
	}
	m.mu.Lock()
	for _, s := range subs {
		if old := m.subs[s.cfg.Target]; old != nil {
			m.mu.Unlock()
			m.Stop(s.cfg.Target, false)
			m.mu.Lock()
		}
		m.subs[s.cfg.Target] = &running{sub: s, cancel: func() {}, done: nil, shared: true}
	}
	m.collectors = append(m.collectors, c)
	m.publishLocked()
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(c.done)
		m.runCollector(sctx, c, subs)
	}()
	return nil
}

// runCollector binds and runs the shared feed, retrying with backoff after socket errors.
func (m *Subscribers) runCollector(ctx context.Context, c *collectorFeed, subs []*Subscriber) {
	d := SubscriberConfig{RcvHWM: c.cfg.RcvHWM, ReconnectMin: c.cfg.ReconnectMin, ReconnectMax: c.cfg.ReconnectMax,
		MaxMsgSize: c.cfg.MaxMsgSize}
	d.defaults()
	log := m.log.With("component", "kv-events", "collector", c.cfg.Listen)
	setAll := func(st string) {
		c.state.Store(st)
		for _, s := range subs {
			s.setState(st)
		}
	}
	defer setAll(StateStopped)
	backoff := d.ReconnectMin
	for ctx.Err() == nil {
		setAll(StateConnecting)
		err := m.collectorSession(ctx, c, subs, d)
		for _, s := range subs {
			s.closeDealer()
		}
		if ctx.Err() != nil {
			return
		}
		c.bindErrors.Add(1)
		for _, s := range subs {
			s.stats.reconnects.Add(1)
		}
		log.Warn("kv-events collector failed; retrying", "err", err, "backoff", backoff)
		setAll(StateBackoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, d.ReconnectMax)
	}
}

func (m *Subscribers) collectorSession(ctx context.Context, c *collectorFeed, subs []*Subscriber, d SubscriberConfig) error {
	sub, err := m.zctx.NewSocket(zmq.SUB)
	if err != nil {
		return fmt.Errorf("sub socket: %w", err)
	}
	defer sub.Close()
	subOptions(sub, d.RcvHWM, d.ReconnectMin, d.ReconnectMax, d.MaxMsgSize)
	if err := sub.SetSubscribe(""); err != nil { // every topic: unknown ones are counted
		return fmt.Errorf("subscribe: %w", err)
	}
	f := &feed{sub: sub, streams: subs, route: c.route, shared: true}
	if g := c.guard; g != nil {
		if err := g.secure(sub); err != nil {
			return err
		}
		f.sender = func(s *Subscriber, peer string) bool {
			if g.senderOK(s.cfg.Target.Worker, peer) {
				return true
			}
			if g.sender.Add(1) == 1 || g.sender.Load()%1000 == 0 {
				m.log.Warn("kv-events collector: a message under a worker's topic came from another address; dropped",
					"worker", s.cfg.Target.Worker, "from", peer, "count", g.sender.Load())
			}
			return false
		}
	}
	f.mon = openMonitor(m.zctx, sub, fmt.Sprintf("inproc://kvgate-kv-collector-%p", c), m.log)
	defer f.closeMonitor()
	if err := sub.Bind(c.cfg.Listen); err != nil {
		return fmt.Errorf("bind %s: %w", c.cfg.Listen, err)
	}
	c.state.Store(StateLive)
	return f.run(ctx)
}

// guardCollector sets c's access control up: the context's ZAP handler (started with the
// first guarded collector), the workers' addresses resolved once now and every 30 s after.
func (m *Subscribers) guardCollector(ctx context.Context, c *collectorFeed) error {
	m.mu.Lock()
	if m.zap == nil {
		h, err := startZAP(m.zctx, m.log.With("component", "kv-events", "zap", true))
		if err != nil {
			m.mu.Unlock()
			return fmt.Errorf("kv-events collector: %w", err)
		}
		m.zap = h
	}
	h := m.zap
	m.mu.Unlock()
	g := newCollectorGuard(*c.cfg.Access, "kvgate-collector "+c.cfg.Listen, c.cfg.Targets, m.log.With("component", "kv-events", "collector", c.cfg.Listen))
	g.refresh(ctx)
	c.guard = g
	h.add(g)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		g.run(ctx)
		h.remove(g.domain)
	}()
	return nil
}

// Collectors returns every collector's state and unknown-topic counters.
func (m *Subscribers) Collectors() []CollectorDebug {
	m.mu.Lock()
	cs := append([]*collectorFeed(nil), m.collectors...)
	m.mu.Unlock()
	out := make([]CollectorDebug, 0, len(cs))
	for _, c := range cs {
		d := CollectorDebug{Listen: c.cfg.Listen, Targets: len(c.cfg.Targets),
			UnknownTopic: c.unknownTopic.Load(), UnknownRank: c.unknownRank.Load()}
		if c.guard != nil {
			d.WrongSender, d.RefusedConnections = c.guard.sender.Load(), c.guard.refused.Load()
		}
		d.State, _ = c.state.Load().(string)
		c.mu.Lock()
		d.RecentUnknown = append([]string(nil), c.recent...)
		c.mu.Unlock()
		out = append(out, d)
	}
	return out
}
