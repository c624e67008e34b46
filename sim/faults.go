package sim

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// lockedRand is a seeded random source shared by HTTP handlers (fault dice).
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newLockedRand(seed int64) *lockedRand {
	if seed == 0 {
		seed = 1
	}
	return &lockedRand{r: rand.New(rand.NewPCG(uint64(seed), 0x5eed))}
}

// hit reports true with probability p.
func (l *lockedRand) hit(p float64) bool {
	if p <= 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64() < p
}

// faults runs the engine-level fault injections between steps: stalls and restarts. Times are
// simulated time (wall time multiplied by Speedup). It returns an error only when ctx ends.
func (e *engineCore) faults(ctx context.Context) error {
	f := e.o.Faults
	now := time.Now()
	simSince := func(t time.Time) time.Duration { return time.Duration(float64(now.Sub(t)) * e.o.Speedup) }
	if f.StallEvery > 0 && f.StallFor > 0 && simSince(e.lastStall) >= f.StallEvery {
		e.o.Logger.Info("vllm-sim fault: engine stall", "dp_rank", e.rank, "for", f.StallFor)
		t := time.NewTimer(time.Duration(float64(f.StallFor) / e.o.Speedup))
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
		e.lastStall = time.Now()
		e.next = e.lastStall
	}
	if f.RestartPublisherEvery > 0 && simSince(e.lastReset) >= f.RestartPublisherEvery {
		e.restart(ctx)
		e.lastReset = time.Now()
	}
	return nil
}

// restart simulates an engine restart: in-flight requests fail, the prefix cache and host tier
// are lost without events, and the publisher starts again at sequence 0 with an empty buffer.
func (e *engineCore) restart(ctx context.Context) {
	e.o.Logger.Info("vllm-sim: engine restart", "dp_rank", e.rank)
	// A restarted vLLM is a new process: its process_start_time_seconds moves on.
	e.w.started.Store(math.Float64bits(unixSeconds(time.Now())))
	// Requests already on the engine die with it; queued ones wait for the new engine.
	for _, r := range e.running {
		e.kv.free(&r.seq)
		e.finishRequest(r, "error", errEngineRestarted)
	}
	e.running = nil
	e.waiting = slices.DeleteFunc(e.waiting, func(r *simRequest) bool {
		if !r.scheduled {
			return false // never reached the old engine: the new one serves it
		}
		e.kv.free(&r.seq) // preempted: it had started, so it dies too
		e.finishRequest(r, "error", errEngineRestarted)
		return true
	})
	onCached := e.kv.pool.onCached
	e.kv.pool = newBlockPool(e.o.NumGPUBlocks, e.o.BlockSize, e.kv.caching)
	e.kv.pool.onCached = onCached
	if e.kv.host != nil {
		e.kv.host.reset()
	}
	if e.pub != nil {
		e.pub.restart(ctx)
	}
	e.publishGauges()
}
