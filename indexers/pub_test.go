package indexers

import (
	"errors"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// testPub is a minimal vLLM-style publisher (vllm/distributed/kv_events.py ZmqEventPublisher) for live tests: a PUB socket
// and a replay ROUTER on loopback ports chosen by the kernel, served by one goroutine that
// owns both sockets. Test code drives it through closures run on that goroutine.
type testPub struct {
	t      testing.TB
	pubEP  string
	repEP  string
	topic  string
	format ReplayFormat
	ring   *ReplayBuffer
	seq    uint64
	// connect, when set, makes the PUB connect there (a worker publishing to a collector)
	// instead of binding a loopback port.
	connect string
	// dropReplies[seq] > 0 makes the ROUTER skip that batch's reply that many times (as
	// when it drops at its HWM: never one of the first two replies of a request, which sit at
	// the head of an empty queue). Only touched on the publisher goroutine (use do).
	dropReplies map[uint64]int
	// bounces asks the publisher goroutine to close both sockets and bind new ones on the same
	// endpoints, with seq 0 and an empty ring: a worker process that restarted.
	bounces chan chan error
	cmds    chan func(pub, router *zmq.Socket)
	done    chan struct{}
}

func newTestPub(t testing.TB, zctx *zmq.Context, topic string, ringCap int, format ReplayFormat) *testPub {
	return newTestPubTo(t, zctx, topic, ringCap, format, "")
}

// newTestPubTo is newTestPub whose PUB connects to connect ("" = bind a loopback port).
func newTestPubTo(t testing.TB, zctx *zmq.Context, topic string, ringCap int, format ReplayFormat, connect string) *testPub {
	p := &testPub{t: t, topic: topic, format: format, ring: NewReplayBuffer(ringCap), connect: connect,
		dropReplies: map[uint64]int{}, cmds: make(chan func(pub, router *zmq.Socket)), done: make(chan struct{}),
		bounces: make(chan chan error)}
	ready := make(chan error, 1)
	go p.loop(zctx, ready)
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(p.cmds); <-p.done })
	return p
}

func (p *testPub) loop(zctx *zmq.Context, ready chan<- error) {
	defer close(p.done)
	pub, err := zctx.NewSocket(zmq.PUB)
	if err != nil {
		ready <- err
		return
	}
	defer func() { pub.Close() }()
	router, err := zctx.NewSocket(zmq.ROUTER)
	if err != nil {
		ready <- err
		return
	}
	defer func() { router.Close() }()
	_ = pub.SetLinger(0)
	_ = router.SetLinger(0)
	if p.connect != "" {
		err = pub.Connect(p.connect)
	} else {
		err = pub.Bind("tcp://127.0.0.1:0")
	}
	if err != nil {
		ready <- err
		return
	}
	if err := router.Bind("tcp://127.0.0.1:0"); err != nil {
		ready <- err
		return
	}
	p.pubEP, _ = pub.GetLastEndpoint()
	p.repEP, _ = router.GetLastEndpoint()
	ready <- nil
	poller := zmq.NewPoller()
	poller.Add(router, zmq.POLLIN)
	for {
		select {
		case reply := <-p.bounces:
			pub.Close()
			router.Close()
			p.seq, p.ring = 0, NewReplayBuffer(len(p.ring.seqs))
			// libzmq closes a socket's listener on its I/O thread: the port may be busy for a
			// moment after Close.
			bind := func(s *zmq.Socket, ep string) (err error) {
				for range 100 {
					if err = s.Bind(ep); err == nil {
						return nil
					}
					time.Sleep(10 * time.Millisecond)
				}
				return err
			}
			var errPub, errRouter error
			if pub, errPub = zctx.NewSocket(zmq.PUB); errPub == nil {
				_ = pub.SetLinger(0)
				errPub = bind(pub, p.pubEP)
			}
			if router, errRouter = zctx.NewSocket(zmq.ROUTER); errRouter == nil {
				_ = router.SetLinger(0)
				errRouter = bind(router, p.repEP)
			}
			poller = zmq.NewPoller()
			poller.Add(router, zmq.POLLIN)
			reply <- errors.Join(errPub, errRouter)
			continue
		case f, ok := <-p.cmds:
			if !ok {
				return
			}
			f(pub, router)
			continue
		default:
		}
		polled, _ := poller.Poll(2 * time.Millisecond)
		if len(polled) == 0 {
			continue
		}
		frames, err := router.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			continue
		}
		id, start, err := ParseReplayRequest(frames)
		if err != nil {
			continue // vLLM logs "Invalid replay request" and sends nothing
		}
		sent := 0
		p.ring.Since(start, func(seq uint64, payload []byte) {
			sent++
			if p.dropReplies[seq] > 0 && sent > 2 {
				p.dropReplies[seq]--
				return
			}
			_, _ = router.SendMessage(ReplayReplyFrames(id, p.format, p.topic, seq, payload))
		})
		_, _ = router.SendMessage(ReplayEndFrames(id, p.format))
	}
}

// do runs f on the publisher goroutine and waits for it.
func (p *testPub) do(f func(pub, router *zmq.Socket)) {
	done := make(chan struct{})
	p.cmds <- func(pub, router *zmq.Socket) { f(pub, router); close(done) }
	<-done
}

// publish sends one batch with the next seq; with lost set it only enters the replay ring (as
// when the PUB drops at its HWM).
func (p *testPub) publish(payload []byte, lost bool) {
	p.do(func(pub, _ *zmq.Socket) {
		seq := p.seq
		p.seq++
		if !lost {
			if _, err := pub.SendMessage(LiveFrames(p.topic, seq, payload)); err != nil {
				p.t.Errorf("publish: %v", err)
			}
		}
		p.ring.Add(seq, payload)
	})
}

// skip burns a sequence number no batch gets (neither sent nor in the ring).
func (p *testPub) skip() { p.do(func(_, _ *zmq.Socket) { p.seq++ }) }

// raw sends arbitrary frames on the PUB socket.
func (p *testPub) raw(frames ...[]byte) {
	p.do(func(pub, _ *zmq.Socket) { _, _ = pub.SendMessage(frames) })
}

// restart behaves like a restarted engine: seq back to 0, empty replay ring.
// bounce restarts the publisher as a new process would: both sockets closed and bound again on
// the same endpoints, seq 0, an empty ring (the subscriber's connections drop and reconnect).
func (p *testPub) bounce() {
	reply := make(chan error)
	p.bounces <- reply
	if err := <-reply; err != nil {
		p.t.Fatalf("bounce: %v", err)
	}
}

func (p *testPub) restart() {
	p.do(func(_, _ *zmq.Socket) {
		p.seq = 0
		p.ring = NewReplayBuffer(len(p.ring.seqs))
	})
}
