package server

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/configs"
)

// tokenizeSlots caps concurrent tokenizations (limits.max_concurrent_tokenizations): a request
// waits for a slot in a bounded queue (limits.tokenize_queue) for at most
// limits.tokenize_queue_timeout, else it gets 503 with Retry-After.
type tokenizeSlots struct {
	sem      chan struct{}
	waiting  atomic.Int64
	maxQueue int64
	timeout  time.Duration
}

func newTokenizeSlots(l configs.Limits) *tokenizeSlots {
	n := l.MaxConcurrentTokenizations
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	return &tokenizeSlots{sem: make(chan struct{}, n), maxQueue: int64(l.TokenizeQueue), timeout: l.TokenizeQueueTimeout.D()}
}

// retryAfterBusy is the Retry-After, in seconds, of a 503 for a busy tokenizer.
const retryAfterBusy = 1

// acquire takes a slot, waiting while ctx lasts, the queue has room and the timeout has not
// passed. The error is the response to send (a 499 when the client left).
func (t *tokenizeSlots) acquire(ctx context.Context) (release func(), e *apiError) {
	release = func() { <-t.sem }
	select {
	case t.sem <- struct{}{}:
		return release, nil
	default:
	}
	busy := func(why string) *apiError {
		return &apiError{
			Status:     http.StatusServiceUnavailable,
			Message:    fmt.Sprintf("the gateway is busy tokenizing other requests (%s); retry later", why),
			RetryAfter: retryAfterBusy,
		}
	}
	if t.waiting.Add(1) > t.maxQueue {
		t.waiting.Add(-1)
		return nil, busy(fmt.Sprintf("%d requests already waiting, limits.tokenize_queue", t.maxQueue))
	}
	defer t.waiting.Add(-1)
	var timeout <-chan time.Time
	if t.timeout > 0 {
		timer := time.NewTimer(t.timeout)
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case t.sem <- struct{}{}:
		return release, nil
	case <-timeout:
		return nil, busy(fmt.Sprintf("no slot within limits.tokenize_queue_timeout %s", t.timeout))
	case <-ctx.Done():
		return nil, &apiError{Status: codeClientGone, Message: "client went away while waiting to be tokenized"}
	}
}

// maxModelLen is the context length prompts are checked against: limits.max_model_len, else
// the largest max_model_len the workers list for model; 0 when unknown.
func (s *Server) maxModelLen(model string) int {
	if n := s.cfg.Limits.MaxModelLen; n > 0 {
		return n
	}
	return s.reg.MaxModelLen(model)
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
