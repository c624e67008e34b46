package server

import (
	"container/list"
	"context"
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/kvgate/kvgate/configs"
)

// tokenizeSlots caps the requests parsed and tokenized at once
// (limits.max_concurrent_tokenizations). A request takes one slot per started bodyUnit of its
// body (at most all of them), so memory in use stays proportional to the slots: a body of
// tens of MiB runs alone. Requests wait in FIFO order in a bounded queue
// (limits.tokenize_queue) for at most limits.tokenize_queue_timeout, else get 503 with
// Retry-After.
type tokenizeSlots struct {
	mu       sync.Mutex
	size     int
	used     int
	queue    list.List // of *slotWaiter, oldest first
	maxQueue int
	timeout  time.Duration
}

type slotWaiter struct {
	n     int
	ready chan struct{} // closed once the slots are granted
}

// bodyUnit is how many body bytes one slot stands for: parsing and tokenizing a request holds
// a few times its body in memory.
const bodyUnit = 4 << 20

// freeOSMemoryBody is the body size from which the memory a request used is returned to the
// OS as soon as it is done.
const freeOSMemoryBody = 16 << 20

func newTokenizeSlots(l configs.Limits) *tokenizeSlots {
	n := l.MaxConcurrentTokenizations
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	return &tokenizeSlots{size: n, maxQueue: l.TokenizeQueue, timeout: l.TokenizeQueueTimeout.D()}
}

// retryAfterBusy is the Retry-After, in seconds, of a 503 for a busy tokenizer.
const retryAfterBusy = 1

// weight is the number of slots a body of n bytes takes.
func (t *tokenizeSlots) weight(n int) int {
	return min(1+n/bodyUnit, t.size)
}

// acquire takes the slots of a body of bodyLen bytes, waiting while ctx lasts, the queue has
// room and the timeout has not passed. The error is the response to send (499 when the client
// left).
func (t *tokenizeSlots) acquire(ctx context.Context, bodyLen int) (release func(), e *apiError) {
	n := t.weight(bodyLen)
	release = func() {
		t.release(n)
		if bodyLen >= freeOSMemoryBody {
			// A huge body leaves garbage of a few times its size: collect it and hand the
			// pages back now, or the next one stacks on top of it and RSS stays high for
			// minutes (the scavenger is slow). This costs one GC cycle per such request,
			// small next to parsing and tokenizing tens of megabytes.
			debug.FreeOSMemory()
		}
	}
	t.mu.Lock()
	if t.queue.Len() == 0 && t.used+n <= t.size {
		t.used += n
		t.mu.Unlock()
		return release, nil
	}
	busy := func(why string) *apiError {
		return &apiError{
			Status:     http.StatusServiceUnavailable,
			Message:    fmt.Sprintf("the gateway is busy tokenizing other requests (%s); retry later", why),
			RetryAfter: retryAfterBusy,
		}
	}
	if t.queue.Len() >= t.maxQueue {
		t.mu.Unlock()
		return nil, busy(fmt.Sprintf("%d requests already waiting, limits.tokenize_queue", t.maxQueue))
	}
	w := &slotWaiter{n: n, ready: make(chan struct{})}
	elem := t.queue.PushBack(w)
	t.mu.Unlock()

	var timeout <-chan time.Time
	if t.timeout > 0 {
		timer := time.NewTimer(t.timeout)
		defer timer.Stop()
		timeout = timer.C
	}
	var fail *apiError
	select {
	case <-w.ready:
		return release, nil
	case <-timeout:
		fail = busy(fmt.Sprintf("no slot within limits.tokenize_queue_timeout %s", t.timeout))
	case <-ctx.Done():
		fail = &apiError{Status: codeClientGone, Message: "client went away while waiting to be tokenized"}
	}
	t.mu.Lock()
	select {
	case <-w.ready: // granted just now: give the slots back
		t.used -= n
	default:
		t.queue.Remove(elem)
	}
	t.grant()
	t.mu.Unlock()
	return nil, fail
}

// queued is the number of waiting requests.
func (t *tokenizeSlots) queued() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.queue.Len()
}

func (t *tokenizeSlots) release(n int) {
	t.mu.Lock()
	t.used -= n
	t.grant()
	t.mu.Unlock()
}

// grant must be called with mu held: it hands free slots to the waiters in FIFO order.
func (t *tokenizeSlots) grant() {
	for e := t.queue.Front(); e != nil; e = t.queue.Front() {
		w := e.Value.(*slotWaiter)
		if t.used+w.n > t.size {
			return
		}
		t.used += w.n
		t.queue.Remove(e)
		close(w.ready)
	}
}

// maxModelLen is the context length prompts are checked against: limits.max_model_len, else
// the largest max_model_len p's workers list for model; 0 when unknown.
func (s *Server) maxModelLen(p *pool, model string) int {
	if n := s.cfg.Limits.MaxModelLen; n > 0 {
		return n
	}
	return p.Registry.MaxModelLen(model)
}

// ContextLengthError is vLLM's 400 for a prompt that leaves no room in the model's context
// (vllm/entrypoints/openai/serving_engine.py, OpenAIServing._validate_input). exact false
// means tokenizing stopped early and tokens is a lower bound. A RequestEnricher returns it.
func ContextLengthError(maxModelLen, tokens int, exact bool) error {
	n := fmt.Sprint(tokens)
	if !exact {
		n = "at least " + n
	}
	return badRequest("", fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %s input tokens. Please reduce the length of the input messages.", maxModelLen, n))
}
