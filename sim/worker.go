package sim

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/apireq"
)

// Worker is one simulated vLLM server: the HTTP surface plus one engine per DP rank.
type Worker struct {
	opts       Options
	engines    []*engineCore
	rankLabels []string
	tok        promptTokenizer
	filler     *filler
	metrics    *simMetrics
	loras      *loraSet
	created    int64
	idSalt     uint64 // random per worker: ids never repeat across workers

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error

	idSeq                         atomic.Uint64
	requests, cancelled, injected atomic.Int64
	completed, diedMidStream      atomic.Int64
	faultRand                     *lockedRand
	stored                        *responseStore // the Responses API store (store: true)
	responses                     *apireq.Parser // maps Responses bodies as the gateway does
	// started is process_start_time_seconds (float64 bits): when the simulated process started,
	// moved on by every engine restart (Restart, or the restart fault).
	started atomic.Uint64
}

// Stats are counters tests use to observe the worker from outside.
type Stats struct {
	// Requests counts completion requests that reached an engine.
	Requests int64
	// Cancelled counts requests whose client disconnected before the response ended.
	Cancelled int64
	// Completed counts responses that ended normally.
	Completed int64
	// InjectedFailures counts requests failed on purpose before the first byte.
	InjectedFailures int64
	// DiedMidStream counts streams cut on purpose (DieMidStreamAfter).
	DiedMidStream int64
	// Running and Waiting are the current engine queues summed over DP ranks.
	Running, Waiting int
	// EventBatches and Events count published KV-event messages and the events in them;
	// EventsDropped counts messages the drop fault withheld from the PUB socket.
	EventBatches, Events, EventsDropped int64
}

// New builds a worker and starts its engines (and event publishers). Close stops them.
func New(opts Options) (*Worker, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	w := &Worker{opts: o, loras: newLoRASet(o.LoRAModules), created: time.Now().Unix(),
		faultRand: newLockedRand(o.Faults.Seed), stored: newResponseStore(),
		responses: apireq.NewParser(apireq.IdentityConfig{})}
	var salt [8]byte
	_, _ = rand.Read(salt[:]) // crypto/rand.Read never fails (Go >= 1.24)
	w.idSalt = binary.BigEndian.Uint64(salt[:])
	w.started.Store(math.Float64bits(unixSeconds(time.Now())))
	w.tok, err = loadTokenizer(o)
	if err != nil {
		return nil, err
	}
	w.filler = newFiller(w.tok)
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	for rank := range o.DataParallelSize {
		w.rankLabels = append(w.rankLabels, strconv.Itoa(rank))
		w.engines = append(w.engines, newEngineCore(w, rank))
	}
	w.metrics = newSimMetrics(w)
	if o.eventsEnabled() {
		for _, e := range w.engines {
			p, err := newPublisher(o, e.rank)
			if err != nil {
				cancel()
				w.closePublishers()
				return nil, fmt.Errorf("kv events for dp rank %d: %w", e.rank, err)
			}
			e.pub = p
		}
	}
	for _, e := range w.engines {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			e.run(ctx)
		}()
	}
	return w, nil
}

// Handler returns the worker's HTTP API (vLLM's OpenAI server surface).
func (w *Worker) Handler() http.Handler { return w.routes() }

// Close stops the engines (in-flight requests end with an error) and the publishers.
func (w *Worker) Close() error {
	w.closeOnce.Do(func() {
		w.cancel()
		w.wg.Wait()
		w.closeErr = w.closePublishers()
	})
	return w.closeErr
}

func (w *Worker) closePublishers() error {
	var errs []error
	for _, e := range w.engines {
		if e.pub != nil {
			errs = append(errs, e.pub.close())
		}
	}
	return errors.Join(errs...)
}

// Stats returns the worker's counters.
func (w *Worker) Stats() Stats {
	s := Stats{Requests: w.requests.Load(), Cancelled: w.cancelled.Load(), Completed: w.completed.Load(),
		InjectedFailures: w.injected.Load(), DiedMidStream: w.diedMidStream.Load()}
	for _, e := range w.engines {
		s.Running += int(e.numRunning.Load())
		s.Waiting += int(e.numWaiting.Load())
		if e.pub != nil {
			s.EventBatches += e.pub.batches.Load()
			s.Events += e.pub.events.Load()
			s.EventsDropped += e.pub.dropped.Load()
		}
	}
	return s
}

// EventEndpoints returns, per DP rank, the PUB endpoint and replay endpoint actually bound or
// connected (after the DP port offset and with port 0 resolved); nil when events are off.
func (w *Worker) EventEndpoints() []EventEndpoint {
	var out []EventEndpoint
	for _, e := range w.engines {
		if e.pub != nil {
			out = append(out, EventEndpoint{DPRank: e.rank, Endpoint: e.pub.endpoint, Replay: e.pub.replayEndpoint})
		}
	}
	return out
}

// EventEndpoint is one DP rank's event sockets.
type EventEndpoint struct {
	DPRank           int
	Endpoint, Replay string
}

// Restart simulates a fast restart of the whole vLLM process, with no /health flap: every rank
// fails its running requests, loses its prefix cache without events, and publishes from seq 0
// with an empty replay buffer; process_start_time_seconds moves on. The sockets stay bound (a
// real restart also drops and re-accepts the ZMQ connections).
func (w *Worker) Restart(ctx context.Context) error {
	for _, e := range w.engines {
		done := make(chan struct{})
		select {
		case e.restarts <- done:
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// ResetPrefixCache clears every rank's prefix cache like POST /reset_prefix_cache; it reports
// false if some rank still had blocks in use.
func (w *Worker) ResetPrefixCache(ctx context.Context) (bool, error) {
	ok := true
	for _, e := range w.engines {
		done := make(chan bool, 1)
		select {
		case e.resets <- done:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		select {
		case r := <-done:
			ok = ok && r
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	return ok, nil
}

// pickEngine honours vLLM's X-data-parallel-rank header, else takes the least loaded rank.
func (w *Worker) pickEngine(h http.Header) (*engineCore, error) {
	if v := h.Get("X-data-parallel-rank"); v != "" {
		r, err := strconv.Atoi(v)
		if err != nil || r < 0 || r >= len(w.engines) {
			return nil, fmt.Errorf("invalid X-data-parallel-rank %q (data parallel size %d)", v, len(w.engines))
		}
		return w.engines[r], nil
	}
	best := w.engines[0]
	for _, e := range w.engines[1:] {
		if e.inflight.Load() < best.inflight.Load() {
			best = e
		}
	}
	return best, nil
}
