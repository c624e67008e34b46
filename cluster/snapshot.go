package cluster

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/kvkey"
)

// Index warm start over NATS: a replica whose target has no index state asks its peers for a
// snapshot of that target (the bytes are opaque here: indexers encodes, checks and installs
// them). Three core-NATS request-reply exchanges, each bounded by the caller's context:
//
//  1. offer: a request on kvgate.v1.<fleet>.snap.offer, which every replica subscribes to
//     (fan-out); only peers whose state of the target is exact answer, with their cursor. The
//     first answer wins; the replica's own responder ignores its requests. No answer within a
//     fifth of the wait (the offer window) means no peer has one: ErrNoPeer.
//  2. open: a request to that peer (kvgate.v1.<fleet>.snap.<peer>.open), which encodes the
//     target's state once and pins it for SnapshotPinTTL under a random id, so that every chunk
//     comes from the same state; the reply is the manifest (id, seq, size, chunk count).
//  3. chunk: one request per chunk (kvgate.v1.<fleet>.snap.<peer>.chunk), at most SnapshotChunk
//     bytes each (under NATS's default 1 MiB max_payload), a lost reply retried.
//
// Requests and replies are at-most-once core NATS messages (nats.go Conn.RequestWithContext,
// Msg.Respond), so a failure at any step is the caller's fallback: the worker's replay ring
// alone, as without a cluster.

// SnapshotChunk is the largest chunk a snapshot is cut into.
const SnapshotChunk = 512 << 10

// SnapshotPinTTL is how long a responder keeps an opened snapshot for its chunk requests.
const SnapshotPinTTL = 30 * time.Second

// maxPinned bounds the snapshots a responder keeps pinned at once (the oldest goes first).
const maxPinned = 16

// maxSnapshotBytes bounds a snapshot a replica accepts (1,048,576 blocks per target at about
// 40 bytes each fit several times over).
const maxSnapshotBytes = 256 << 20

// chunkAttempts bounds the requests spent on one chunk.
const chunkAttempts = 3

// ErrNoPeer is returned by FetchSnapshot when no peer offered an exact snapshot in time.
var ErrNoPeer = errors.New("cluster: no peer offered an exact snapshot")

// SnapshotSource is what a replica serves its peers from: its exact per-target index state
// (*indexers.Subscribers).
type SnapshotSource interface {
	// SnapshotOffer reports whether the replica holds an exact state of t, and its last seq.
	SnapshotOffer(t kvkey.Target) (seq uint64, ok bool)
	// EncodeSnapshot encodes it with its cursor.
	EncodeSnapshot(t kvkey.Target) ([]byte, error)
}

// Snapshots serves this replica's index snapshots to its peers and fetches theirs. It is safe
// for concurrent use.
type Snapshots struct {
	node *Node
	src  SnapshotSource
	log  *slog.Logger
	subs []*nats.Subscription

	mu     sync.Mutex
	pinned map[string]*pinnedSnapshot
	order  []string // pinned ids, oldest first

	served, servedBytes, fetchedBytes prometheus.Counter
	fetches                           *prometheus.CounterVec
}

type pinnedSnapshot struct {
	data    []byte
	expires time.Time
}

// snapTarget names a target in a request.
type snapTarget struct {
	Worker string `json:"worker"`
	DPRank int    `json:"dp_rank"`
	From   string `json:"from"`
}

type snapOffer struct {
	Replica string `json:"replica"`
	Seq     uint64 `json:"seq"`
}

type snapManifest struct {
	ID     string `json:"id,omitempty"`
	Seq    uint64 `json:"seq"`
	Bytes  int    `json:"bytes"`
	Chunks int    `json:"chunks"`
	// SHA256 is the whole snapshot's digest (hex): the chunks put together must match it.
	SHA256 string `json:"sha256,omitempty"`
	Error  string `json:"error,omitempty"`
}

type snapChunkReq struct {
	ID    string `json:"id"`
	Chunk int    `json:"chunk"`
}

// errHeader carries a responder's error on a chunk reply.
const errHeader = "Kvgate-Error"

// Fetch results (the result label of kvgate_cluster_snapshot_fetches_total).
const (
	fetchOK      = "ok"
	fetchNoPeer  = "no_peer"
	fetchTimeout = "timeout"
	fetchFailed  = "failed"
)

// NewSnapshots starts serving src's snapshots to the peers over node's connection and
// registers the kvgate_cluster_snapshot* metrics with reg (nil: not registered). Close stops
// serving.
func NewSnapshots(node *Node, src SnapshotSource, reg prometheus.Registerer, log *slog.Logger) (*Snapshots, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Snapshots{node: node, src: src, log: log.With("component", "cluster-snapshots", "replica", node.ReplicaID()),
		pinned: map[string]*pinnedSnapshot{},
		served: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_cluster_snapshots_served_total",
			Help: "Index snapshots this replica opened for a peer's warm start."}),
		servedBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_cluster_snapshot_served_bytes_total",
			Help: "Snapshot chunk bytes this replica sent to peers."}),
		fetchedBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_cluster_snapshot_fetched_bytes_total",
			Help: "Snapshot bytes this replica received from peers."}),
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_cluster_snapshot_fetches_total",
			Help: "Snapshot fetches for a target's warm start, by result: ok, no_peer, timeout, failed."}, []string{"result"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{s.served, s.servedBytes, s.fetchedBytes, s.fetches} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("cluster: snapshot metrics: %w", err)
			}
		}
	}
	id := node.ReplicaID()
	for _, h := range []struct {
		subj string
		cb   nats.MsgHandler
	}{
		{node.Subject("snap", "offer"), s.onOffer},
		{node.Subject("snap", id, "open"), s.onOpen},
		{node.Subject("snap", id, "chunk"), s.onChunk},
	} {
		sub, err := node.Conn().Subscribe(h.subj, h.cb)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("cluster: subscribe %s: %w", h.subj, err)
		}
		s.subs = append(s.subs, sub)
	}
	return s, nil
}

// Close stops serving snapshots.
func (s *Snapshots) Close() {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	s.subs = nil
	s.mu.Lock()
	s.pinned, s.order = map[string]*pinnedSnapshot{}, nil
	s.mu.Unlock()
}

// respond answers request m with data (and hdr, if any), signed with the fleet key.
func (s *Snapshots) respond(m *nats.Msg, data []byte, hdr nats.Header) error {
	r := &nats.Msg{Subject: m.Reply, Data: data, Header: hdr}
	s.node.key.signMsg(r)
	return m.RespondMsg(r)
}

// request sends a signed request to subj and returns the reply once its signature checks.
func (s *Snapshots) request(ctx context.Context, subj string, body []byte) (*nats.Msg, error) {
	req := &nats.Msg{Subject: subj, Data: body}
	// The reply subject is part of what is signed, so it is drawn first.
	req.Reply = s.node.Conn().NewRespInbox()
	s.node.key.signMsg(req)
	sub, err := s.node.Conn().SubscribeSync(req.Reply)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := s.node.Conn().PublishMsg(req); err != nil {
		return nil, err
	}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return nil, fmt.Errorf("%w (%w)", err, nats.ErrTimeout)
			}
			return nil, err
		}
		if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
			return nil, nats.ErrNoResponders
		}
		if s.node.authentic(m, "snapshot") {
			return m, nil
		}
		// An unsigned answer (an outsider racing the peer) is dropped: wait for the real one.
	}
}

func (s *Snapshots) onOffer(m *nats.Msg) {
	var req snapTarget
	if m.Reply == "" || !s.node.authentic(m, "snapshot") {
		return
	}
	if err := json.Unmarshal(m.Data, &req); err != nil || req.From == s.node.ReplicaID() {
		return
	}
	seq, ok := s.src.SnapshotOffer(kvkey.Target{Worker: req.Worker, DPRank: req.DPRank})
	if !ok {
		return // only peers that can serve answer: the first answer is the one to take
	}
	b, _ := json.Marshal(snapOffer{Replica: s.node.ReplicaID(), Seq: seq})
	if err := s.respond(m, b, nil); err != nil {
		s.node.CountError("snapshot", err)
	}
}

func (s *Snapshots) onOpen(m *nats.Msg) {
	if !s.node.authentic(m, "snapshot") {
		return // no snapshot leaves for a requester without the fleet key
	}
	var req snapTarget
	reply := func(man snapManifest) {
		b, _ := json.Marshal(man)
		if err := s.respond(m, b, nil); err != nil {
			s.node.CountError("snapshot", err)
		}
	}
	if err := json.Unmarshal(m.Data, &req); err != nil {
		reply(snapManifest{Error: "bad request: " + err.Error()})
		return
	}
	t := kvkey.Target{Worker: req.Worker, DPRank: req.DPRank}
	data, err := s.src.EncodeSnapshot(t)
	if err != nil {
		reply(snapManifest{Error: err.Error()})
		return
	}
	var idb [12]byte
	_, _ = rand.Read(idb[:])
	id := hex.EncodeToString(idb[:])
	seq, _ := s.src.SnapshotOffer(t)
	now := time.Now()
	s.mu.Lock()
	s.expireLocked(now)
	for len(s.order) >= maxPinned {
		delete(s.pinned, s.order[0])
		s.order = s.order[1:]
	}
	s.pinned[id] = &pinnedSnapshot{data: data, expires: now.Add(SnapshotPinTTL)}
	s.order = append(s.order, id)
	s.mu.Unlock()
	s.served.Inc()
	s.log.Info("serving an index snapshot to a peer", "peer", req.From, "target", t.String(), "bytes", len(data))
	chunk := s.chunkSize()
	sum := sha256.Sum256(data)
	reply(snapManifest{ID: id, Seq: seq, Bytes: len(data), Chunks: (len(data) + chunk - 1) / chunk, SHA256: hex.EncodeToString(sum[:])})
}

// expireLocked drops pinned snapshots past their TTL; s.mu must be held.
func (s *Snapshots) expireLocked(now time.Time) {
	keep := s.order[:0]
	for _, id := range s.order {
		if p := s.pinned[id]; p != nil && now.Before(p.expires) {
			keep = append(keep, id)
		} else {
			delete(s.pinned, id)
		}
	}
	s.order = keep
}

// chunkSize is SnapshotChunk, or less when the server's max_payload is smaller.
func (s *Snapshots) chunkSize() int {
	c := SnapshotChunk
	if mp := int(s.node.Conn().MaxPayload()); mp > 0 && mp-4096 < c {
		c = max(mp-4096, 1024)
	}
	return c
}

func (s *Snapshots) onChunk(m *nats.Msg) {
	if !s.node.authentic(m, "snapshot") {
		return
	}
	fail := func(msg string) {
		h := nats.Header{}
		h.Set(errHeader, msg)
		if err := s.respond(m, nil, h); err != nil {
			s.node.CountError("snapshot", err)
		}
	}
	var req snapChunkReq
	if err := json.Unmarshal(m.Data, &req); err != nil {
		fail("bad request: " + err.Error())
		return
	}
	s.mu.Lock()
	p := s.pinned[req.ID]
	s.mu.Unlock()
	if p == nil {
		fail("unknown or expired snapshot " + req.ID)
		return
	}
	chunk := s.chunkSize()
	lo := req.Chunk * chunk
	if req.Chunk < 0 || lo >= len(p.data) {
		fail("no chunk " + strconv.Itoa(req.Chunk))
		return
	}
	part := p.data[lo:min(lo+chunk, len(p.data))]
	if err := s.respond(m, part, nil); err != nil {
		s.node.CountError("snapshot", err)
		return
	}
	s.servedBytes.Add(float64(len(part)))
}

// FetchSnapshot asks the peers for a snapshot of t and returns it with the peer's replica id;
// ErrNoPeer when none offered one. Everything is bounded by ctx.
func (s *Snapshots) FetchSnapshot(ctx context.Context, t kvkey.Target) (data []byte, peer string, err error) {
	defer func() {
		res := fetchOK
		switch {
		case errors.Is(err, ErrNoPeer):
			res = fetchNoPeer
		case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
			res = fetchTimeout
		case err != nil:
			res = fetchFailed
		}
		s.fetches.WithLabelValues(res).Inc()
		if err != nil && res != fetchNoPeer {
			s.node.CountError("snapshot", err)
		}
	}()
	if !s.node.Connected() {
		return nil, "", errors.New("cluster: snapshot: NATS not connected")
	}
	// A seed whose routes are still forming cannot hear its peers' offers yet.
	s.node.AwaitRoutes(ctx, s.node.Config().SnapshotTimeout.D()/2)
	req, _ := json.Marshal(snapTarget{Worker: t.Worker, DPRank: t.DPRank, From: s.node.ReplicaID()})
	offer, err := s.offer(ctx, req)
	if errors.Is(err, ErrNoPeer) && s.node.HasPeerRoutes() {
		// Routes just formed may not carry the peers' interest yet: ask once more.
		offer, err = s.offer(ctx, req)
	}
	if err != nil {
		return nil, "", err
	}
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	msg, err := s.request(octx, s.node.Subject("snap", offer.Replica, "open"), req)
	if err != nil {
		return nil, offer.Replica, fmt.Errorf("cluster: snapshot open at %s: %w", offer.Replica, err)
	}
	var man snapManifest
	if err := json.Unmarshal(msg.Data, &man); err != nil {
		return nil, offer.Replica, fmt.Errorf("cluster: snapshot manifest from %s: %w", offer.Replica, err)
	}
	switch {
	case man.Error != "":
		return nil, offer.Replica, fmt.Errorf("cluster: snapshot open at %s: %s", offer.Replica, man.Error)
	case man.Bytes <= 0 || man.Bytes > maxSnapshotBytes || man.Chunks <= 0 || man.Chunks > man.Bytes:
		return nil, offer.Replica, fmt.Errorf("cluster: snapshot manifest from %s: %d bytes in %d chunks", offer.Replica, man.Bytes, man.Chunks)
	}
	data = make([]byte, 0, man.Bytes)
	for i := range man.Chunks {
		part, err := s.chunk(ctx, offer.Replica, snapChunkReq{ID: man.ID, Chunk: i})
		if err != nil {
			return nil, offer.Replica, err
		}
		if len(data)+len(part) > man.Bytes {
			return nil, offer.Replica, fmt.Errorf("cluster: snapshot from %s: more than the %d bytes announced", offer.Replica, man.Bytes)
		}
		data = append(data, part...)
	}
	if len(data) != man.Bytes {
		return nil, offer.Replica, fmt.Errorf("cluster: snapshot from %s: %d of %d bytes", offer.Replica, len(data), man.Bytes)
	}
	if sum := sha256.Sum256(data); man.SHA256 != "" && man.SHA256 != hex.EncodeToString(sum[:]) || man.SHA256 == "" && s.node.Authenticated() {
		return nil, offer.Replica, fmt.Errorf("cluster: snapshot from %s: its chunks do not match the manifest's digest", offer.Replica)
	}
	s.fetchedBytes.Add(float64(len(data)))
	return data, offer.Replica, nil
}

// offer waits for the first peer's offer, within a fifth of what ctx leaves (the offer
// window): only peers that can serve answer, so silence is the answer "none".
func (s *Snapshots) offer(ctx context.Context, req []byte) (snapOffer, error) {
	window := time.Second
	if dl, ok := ctx.Deadline(); ok {
		window = time.Until(dl) / 5
	}
	octx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	inbox := s.node.Conn().NewRespInbox()
	sub, err := s.node.Conn().SubscribeSync(inbox)
	if err != nil {
		return snapOffer{}, fmt.Errorf("cluster: snapshot offer: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	om := &nats.Msg{Subject: s.node.Subject("snap", "offer"), Reply: inbox, Data: req}
	s.node.key.signMsg(om)
	if err := s.node.Conn().PublishMsg(om); err != nil {
		return snapOffer{}, fmt.Errorf("cluster: snapshot offer: %w", err)
	}
	for {
		m, err := sub.NextMsgWithContext(octx)
		if err != nil {
			if ctx.Err() == nil && octx.Err() != nil {
				return snapOffer{}, ErrNoPeer
			}
			return snapOffer{}, fmt.Errorf("cluster: snapshot offer: %w", err)
		}
		if !s.node.authentic(m, "snapshot") {
			continue // only a replica holding the fleet key may offer
		}
		var o snapOffer
		if json.Unmarshal(m.Data, &o) == nil && o.Replica != "" && o.Replica != s.node.ReplicaID() && validToken(o.Replica) {
			return o, nil
		}
	}
}

// chunk fetches one chunk, asking again after a lost reply.
func (s *Snapshots) chunk(ctx context.Context, peer string, req snapChunkReq) ([]byte, error) {
	body, _ := json.Marshal(req)
	subj := s.node.Subject("snap", peer, "chunk")
	var last error
	for attempt := 0; attempt < chunkAttempts; attempt++ {
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= 0 {
			break
		}
		// Each attempt gets its share of what is left, so that one lost reply does not use it all.
		actx, cancel := ctx, context.CancelFunc(func() {})
		if dl, ok := ctx.Deadline(); ok {
			actx, cancel = context.WithTimeout(ctx, time.Until(dl)/time.Duration(chunkAttempts-attempt))
		}
		m, err := s.request(actx, subj, body)
		cancel()
		switch {
		case err == nil && m.Header.Get(errHeader) != "":
			return nil, fmt.Errorf("cluster: snapshot chunk %d from %s: %s", req.Chunk, peer, m.Header.Get(errHeader))
		case err == nil:
			return m.Data, nil
		case errors.Is(err, nats.ErrNoResponders):
			return nil, fmt.Errorf("cluster: snapshot chunk %d: peer %s is gone: %w", req.Chunk, peer, err)
		}
		last = err
	}
	if last == nil {
		last = ctx.Err()
	}
	return nil, fmt.Errorf("cluster: snapshot chunk %d from %s: %w", req.Chunk, peer, last)
}

// validToken reports whether s can be a subject token (a replica id: letters, digits, - and _).
func validToken(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return s != ""
}
