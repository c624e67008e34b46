package server

import (
	"errors"

	"github.com/gin-gonic/gin"

	"github.com/kvgate/kvgate/apireq"
)

// forwardPriority writes the request's priority into the body the worker gets, as vLLM's
// priority field, when proxy.forward_priority is on: the workers then run vLLM's priority
// scheduling policy, whose waiting queue is ordered by (priority, arrival) and which preempts
// the least urgent running request under KV pressure (vllm/v1/core/sched/scheduler.py,
// Scheduler.schedule), so an urgent request overtakes the requests already queued on the
// worker, not only those queued at the gateway.
//
// The priority is the flow class's (classify, flow_priority.go): the one the gateway queue
// used when the request went through it (t), else classified here. kvgate's larger priority is
// more urgent and vLLM's smaller one is earlier, so vLLM's value is its negation. A client's
// own body priority is kept only when it is later than that (apireq.Request.SetVLLMPriority):
// it cannot lift a request over its key's ceiling.
func (s *Server) forwardPriority(c *gin.Context, in *apireq.Request, t *flowTicket) *apiError {
	if !s.cfg.Proxy.ForwardPriority || !carriesPriority(in.Endpoint) {
		return nil
	}
	var cls flowClass
	if t != nil {
		cls = t.class
	} else {
		var e *apiError
		if cls, e = s.classify(c.Request.Header, tenantOf(c), ""); e != nil {
			return e
		}
	}
	if _, err := in.SetVLLMPriority(-int64(cls.priority)); err != nil {
		var ae *apireq.Error
		if errors.As(err, &ae) {
			return badRequest(ae.Param, ae.Message)
		}
		return badRequest("priority", err.Error())
	}
	return nil
}

// carriesPriority reports whether the endpoint's vLLM request takes a priority: chat
// completions, completions and Responses do (PriorityRequestMixin and ResponsesRequest in
// vllm/entrypoints/openai); vLLM's Messages request (vllm/entrypoints/anthropic/protocol.py,
// AnthropicMessagesRequest) has no such field today and drops it, but it is written there too
// so that a worker which reads it gets it. count_tokens and the stored-response paths run
// nothing.
func carriesPriority(e apireq.Endpoint) bool {
	switch e {
	case apireq.ChatCompletions, apireq.Completions, apireq.Responses, apireq.Messages:
		return true
	}
	return false
}
