package indexers

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Collector access control. A collector's SUB is bound for the workers' publishers to connect
// to, so without a check anyone who reaches the port can publish batches under a worker's
// topic and steer routing. The collector's socket therefore gets a ZAP domain, and a ZAP
// handler (RFC 27, https://rfc.zeromq.org/spec/27/) answers libzmq's handshake requests:
// a connection is accepted only from an allowed address (the CIDRs of kv_events.allow, or by
// default the workers' own addresses) and, with CURVE keys, only with an allowed client key.
// Then every message's sender (the "Peer-Address" property libzmq attaches) must be an address
// of the worker its topic names; others are dropped and counted.
//
// The handler is our own REP socket on inproc://zeromq.zap.01 in the Subscribers' ZMQ context,
// not pebbe/zmq4's AuthStart: that one keeps its allow lists and handler in package-level
// state on the default context (one per process, shared by every user of the library), which
// would neither see sockets of our own context nor let two gateways in one process (tests)
// have different lists. libzmq consults the ZAP endpoint of the socket's own context, one per
// context, so one handler serves every collector of a Subscribers, told apart by domain.

// zapEndpoint is libzmq's fixed ZAP endpoint (RFC 27).
const zapEndpoint = "inproc://zeromq.zap.01"

// addrRefresh is how often the workers' addresses are resolved again.
const addrRefresh = 30 * time.Second

// CollectorAccess is who may publish to a collector. A nil *CollectorAccess in CollectorConfig
// turns the checks off (the library's tests of attribution); the gateway always sets one.
type CollectorAccess struct {
	// Allow are the networks publishers may connect from; empty = the workers' addresses
	// (each worker's URL and replay endpoint hosts, resolved, and what Addresses adds).
	Allow []netip.Prefix
	// MatchSender requires a message's sender to be an address of the worker its topic names.
	MatchSender bool
	// CurveSecretKey, when set (Z85, 40 characters), makes the collector a CURVE server:
	// publishers must connect as CURVE clients with a public key in CurveClientKeys.
	CurveSecretKey  string
	CurveClientKeys []string
	// Addresses, when set, adds addresses for a worker (discovery knows its pods' IPs);
	// called from a background goroutine every 30 s and at start.
	Addresses func(worker string) []netip.Addr
	// Resolve looks a host name up (nil: net.DefaultResolver).
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
}

// workerAddrs is a snapshot of every worker's addresses.
type workerAddrs map[string]map[netip.Addr]bool

// collectorGuard enforces one collector's CollectorAccess.
type collectorGuard struct {
	acc     CollectorAccess
	domain  string
	workers []collectorWorker
	addrs   atomic.Pointer[workerAddrs]
	refused atomic.Int64 // connections refused by the ZAP handler
	sender  atomic.Int64 // messages whose sender is not their topic's worker
	log     *slog.Logger
}

// collectorWorker is a worker fed through the collector and the hosts it publishes from.
type collectorWorker struct {
	url   string
	hosts []string
}

func newCollectorGuard(acc CollectorAccess, domain string, targets []SubscriberConfig, log *slog.Logger) *collectorGuard {
	g := &collectorGuard{acc: acc, domain: domain, log: log}
	seen := map[string]int{}
	for _, t := range targets {
		i, ok := seen[t.Target.Worker]
		if !ok {
			i = len(g.workers)
			seen[t.Target.Worker] = i
			g.workers = append(g.workers, collectorWorker{url: t.Target.Worker, hosts: []string{hostOf(t.Target.Worker)}})
		}
		if h := hostOf(t.ReplayEndpoint); h != "" {
			g.workers[i].hosts = append(g.workers[i].hosts, h)
		}
	}
	empty := workerAddrs{}
	g.addrs.Store(&empty)
	return g
}

// hostOf is the host of a URL or ZMQ endpoint ("" when none).
func hostOf(s string) string {
	if s == "" {
		return ""
	}
	if u, err := url.Parse(s); err == nil && u.Host != "" {
		return u.Hostname()
	}
	return ""
}

// refresh resolves every worker's hosts (bounded by ctx) and adds Addresses' answers.
func (g *collectorGuard) refresh(ctx context.Context) {
	resolve := g.acc.Resolve
	if resolve == nil {
		resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	next := workerAddrs{}
	for _, w := range g.workers {
		set := map[netip.Addr]bool{}
		for _, h := range w.hosts {
			if a, err := netip.ParseAddr(h); err == nil {
				set[a.Unmap()] = true
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			as, err := resolve(rctx, h)
			cancel()
			if err != nil {
				g.log.Warn("kv-events collector: cannot resolve a worker's host; its publisher is refused until it resolves", "worker", w.url, "host", h, "err", err)
			}
			for _, a := range as {
				set[a.Unmap()] = true
			}
		}
		if g.acc.Addresses != nil {
			for _, a := range g.acc.Addresses(w.url) {
				set[a.Unmap()] = true
			}
		}
		next[w.url] = set
	}
	g.addrs.Store(&next)
}

// run refreshes the addresses every addrRefresh until ctx ends.
func (g *collectorGuard) run(ctx context.Context) {
	t := time.NewTicker(addrRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.refresh(ctx)
		}
	}
}

// allowed reports whether a publisher may connect from addr.
func (g *collectorGuard) allowed(addr netip.Addr) bool {
	addr = addr.Unmap()
	if len(g.acc.Allow) > 0 {
		for _, p := range g.acc.Allow {
			if p.Contains(addr) {
				return true
			}
		}
		return false
	}
	for _, set := range *g.addrs.Load() {
		if set[addr] {
			return true
		}
	}
	return false
}

// senderOK reports whether a message of worker's topic may come from peer (the message's
// Peer-Address property; "" over ipc, where file permissions guard the socket).
func (g *collectorGuard) senderOK(worker, peer string) bool {
	if !g.acc.MatchSender || peer == "" {
		return true
	}
	a, err := netip.ParseAddr(peer)
	if err != nil {
		return false
	}
	return (*g.addrs.Load())[worker][a.Unmap()]
}

// curveKeyAllowed reports whether a CURVE client's public key (32 bytes) is listed.
func (g *collectorGuard) curveKeyAllowed(key []byte) bool {
	z := zmq.Z85encode(string(key))
	for _, k := range g.acc.CurveClientKeys {
		if k == z {
			return true
		}
	}
	return false
}

// secure sets the collector's socket up for ZAP (and CURVE).
func (g *collectorGuard) secure(sock *zmq.Socket) error {
	if err := sock.SetZapDomain(g.domain); err != nil {
		return fmt.Errorf("zap domain: %w", err)
	}
	if g.acc.CurveSecretKey != "" {
		if err := sock.SetCurveServer(1); err != nil {
			return fmt.Errorf("curve server: %w", err)
		}
		if err := sock.SetCurveSecretkey(g.acc.CurveSecretKey); err != nil {
			return fmt.Errorf("curve secret key: %w", err)
		}
	}
	return nil
}

// zapHandler answers ZAP requests for every collector of one ZMQ context.
type zapHandler struct {
	mu     sync.Mutex
	guards map[string]*collectorGuard // by domain
	log    *slog.Logger
	stop   context.CancelFunc
	done   chan struct{}
}

// startZAP binds the context's ZAP endpoint and serves it until stop.
func startZAP(zctx *zmq.Context, log *slog.Logger) (*zapHandler, error) {
	sock, err := zctx.NewSocket(zmq.REP)
	if err != nil {
		return nil, fmt.Errorf("zap socket: %w", err)
	}
	_ = sock.SetLinger(0)
	if err := sock.Bind(zapEndpoint); err != nil {
		sock.Close()
		return nil, fmt.Errorf("zap bind: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	h := &zapHandler{guards: map[string]*collectorGuard{}, log: log, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		defer sock.Close()
		poller := zmq.NewPoller()
		poller.Add(sock, zmq.POLLIN)
		for ctx.Err() == nil {
			polled, err := poller.Poll(100 * time.Millisecond)
			if err != nil || len(polled) == 0 {
				continue
			}
			req, err := sock.RecvMessageBytes(0)
			if err != nil {
				continue
			}
			_, _ = sock.SendMessage(h.answer(req))
		}
	}()
	return h, nil
}

func (h *zapHandler) add(g *collectorGuard) {
	h.mu.Lock()
	h.guards[g.domain] = g
	h.mu.Unlock()
}

func (h *zapHandler) remove(domain string) {
	h.mu.Lock()
	delete(h.guards, domain)
	h.mu.Unlock()
}

// answer is the reply to one ZAP request: [version, request id, domain, address, identity,
// mechanism, credentials...] → [version, request id, status code, status text, user id,
// metadata] (RFC 27).
func (h *zapHandler) answer(req [][]byte) [][]byte {
	if len(req) < 6 || string(req[0]) != "1.0" {
		return [][]byte{[]byte("1.0"), {}, []byte("500"), []byte("malformed ZAP request"), {}, {}}
	}
	reply := func(code, text string) [][]byte {
		return [][]byte{req[0], req[1], []byte(code), []byte(text), {}, {}}
	}
	address, mechanism := string(req[3]), string(req[5])
	h.mu.Lock()
	g := h.guards[string(req[2])]
	h.mu.Unlock()
	if g == nil {
		return reply("400", "unknown domain")
	}
	deny := func(why string) [][]byte {
		g.refused.Add(1)
		h.log.Warn("kv-events collector: publisher refused", "from", address, "reason", why)
		return reply("400", why)
	}
	if address != "" { // ipc has no address
		a, err := netip.ParseAddr(strings.Trim(address, "[]"))
		if err != nil || !g.allowed(a) {
			return deny("address not allowed")
		}
	}
	switch {
	case g.acc.CurveSecretKey != "" && mechanism != "CURVE":
		return deny("CURVE required")
	case mechanism == "CURVE" && (len(req) < 7 || !g.curveKeyAllowed(req[6])):
		return deny("CURVE key not allowed")
	case mechanism != "CURVE" && mechanism != "NULL":
		return deny("mechanism " + mechanism + " not supported")
	}
	return reply("200", "OK")
}

func (h *zapHandler) close() {
	h.stop()
	<-h.done
}
