package server

import (
	"context"
	"errors"
	"net/http"
)

// Shutdown phases of the client listener (see Serve).
const (
	phaseServing  int32 = iota // accepting; /ready may be 200
	phaseDraining              // /ready 503, new requests still accepted (shutdown_drain_delay)
	phaseStopping              // listener closed, running requests finishing; /live 503
)

func (s *Server) phase() int32 { return s.state.Load() }

// errShutdownCut is the cancel cause of an upstream request still running when
// shutdown_timeout ended.
var errShutdownCut = errors.New("kvgate is shutting down: shutdown_timeout reached")

// msgShutdownCut is what a client whose request was cut at the shutdown deadline reads.
const msgShutdownCut = "kvgate is shutting down and shutdown_timeout ended before this response was complete; retry the request"

// watchCut makes cancel fire with errShutdownCut when the shutdown deadline cuts running
// requests; the returned stop releases the watch.
func (s *Server) watchCut(cancel context.CancelCauseFunc) (stop func() bool) {
	return context.AfterFunc(s.cutCtx, func() { cancel(errShutdownCut) })
}

// cutByShutdown reports whether ctx (an attempt's upstream context) was cancelled by the
// shutdown deadline, not by the worker or the client.
func cutByShutdown(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), errShutdownCut)
}

// shutdownCutError is the answer to a request cut before its response started.
func shutdownCutError() *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Message: msgShutdownCut}
}

// shutdownCutEvent is the last event of a stream cut at the shutdown deadline: on the
// Anthropic Messages route an `error` event of type overloaded_error (the 503's Anthropic
// type), elsewhere the OpenAI error event then [DONE], as vLLM ends a failed stream.
func shutdownCutEvent(anthropic bool) []byte {
	if anthropic {
		return anthropicSSEError(shutdownCutError())
	}
	return sseErrorEvent(shutdownCutError())
}
