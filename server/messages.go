package server

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/configs"
)

const (
	pathMessages    = string(apireq.Messages)
	pathCountTokens = string(apireq.MessagesCountTokens)
)

// anthropicKey marks a gin context whose errors are answered in Anthropic's shape.
const anthropicKey = "kvgate.anthropic"

// markAnthropic makes the gateway's own errors on this route Anthropic-shaped:
// {"type": "error", "error": {"type", "message"}}, as vLLM's Anthropic router translates its
// ErrorResponse (vllm/entrypoints/anthropic/api_router.py, translate_error_response).
func markAnthropic(c *gin.Context) { c.Set(anthropicKey, true) }

type anthropicErrorBody struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func anthropicError(e *apiError) []byte {
	var b anthropicErrorBody
	b.Type = "error"
	b.Error.Type = errorType(e.Status)
	b.Error.Message = e.Message
	data, _ := json.Marshal(b)
	return data
}

// anthropicSSEError is the event that ends a Messages stream that failed after it started
// (serving.py, message_stream_converter: an "error" event).
func anthropicSSEError(e *apiError) []byte {
	var b anthropicErrorBody
	b.Type = "error"
	b.Error.Type = "internal_error"
	b.Error.Message = e.Message
	data, _ := json.Marshal(b)
	return append(append([]byte("event: error\ndata: "), data...), '\n', '\n')
}

// registerMessages adds the Anthropic Messages routes.
func (s *Server) registerMessages(e *gin.Engine) {
	e.POST(pathMessages, markAnthropic, s.handleCompletion(pathMessages))
	if s.cfg.Anthropic.CountTokens == configs.CountTokensForward {
		e.POST(pathCountTokens, markAnthropic, s.handleCompletion(pathCountTokens))
		return
	}
	e.POST(pathCountTokens, markAnthropic, s.handleCountTokens)
}

// handleCountTokens answers POST /v1/messages/count_tokens from the gateway's tokenizer: the
// body is converted and rendered as for /v1/messages and the prompt counted, the answer
// vLLM gives (serving.py, count_tokens: {"input_tokens": N, "context_management":
// {"original_input_tokens": N}}). Without a tokenizer, or if tokenizing fails, the request is
// forwarded to a worker.
func (s *Server) handleCountTokens(c *gin.Context) {
	start := time.Now()
	endpoint := pathCountTokens
	s.m.inFlight.WithLabelValues(endpoint).Inc()
	code := 0
	defer func() {
		s.m.inFlight.WithLabelValues(endpoint).Dec()
		s.m.requests.WithLabelValues(endpoint, strconv.Itoa(code)).Inc()
		s.m.duration.WithLabelValues(endpoint).Observe(time.Since(start).Seconds())
	}()
	body, e := s.readBody(c)
	if e != nil {
		code = e.Status
		writeError(c, e)
		return
	}
	in, rreq, e := s.prepare(c.Request.Context(), endpoint, body, c.Request.Header)
	if e != nil {
		code = e.Status
		writeError(c, e)
		return
	}
	if s.enricher == nil || rreq.BlockHashes == nil && rreq.PromptTokens == 0 {
		end := s.router.Start(rreq)
		defer end()
		code = s.proxy(c, in, rreq, start)
		return
	}
	code = http.StatusOK
	n := rreq.PromptTokens
	c.JSON(http.StatusOK, gin.H{"input_tokens": n, "context_management": gin.H{"original_input_tokens": n}})
}
