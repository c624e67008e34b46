package server

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/configs"
)

const (
	pathMessages    = string(apireq.Messages)
	pathCountTokens = string(apireq.MessagesCountTokens)
)

// isAnthropicPath reports whether path is an Anthropic Messages route: /v1/messages or
// anything under it (count_tokens, and unknown subpaths that get a 404).
func isAnthropicPath(path string) bool {
	return path == pathMessages || strings.HasPrefix(path, pathMessages+"/")
}

// anthropicRoute reports whether c is on an Anthropic Messages route. The route, not the
// code that fails, decides the error shape: the auth middleware, body and concurrency limits,
// routing (no worker), a model check, 404 and 405 all answer through writeError, which asks
// this, so every error a client of /v1/messages* sees is Anthropic's
// {"type": "error", "error": {"type", "message"}} (https://docs.claude.com/en/api/errors).
func anthropicRoute(c *gin.Context) bool { return isAnthropicPath(c.Request.URL.Path) }

type anthropicErrorBody struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// anthropicErrorType is the Anthropic error type of an HTTP status
// (https://docs.claude.com/en/api/errors): other 4xx are invalid_request_error, other 5xx
// api_error; 503 (the gateway or its workers have no capacity) is overloaded_error, as
// Anthropic's own 529.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, statusOverloaded:
		return "overloaded_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// statusOverloaded is Anthropic's 529 "overloaded".
const statusOverloaded = 529

func anthropicError(e *apiError) []byte {
	var b anthropicErrorBody
	b.Type = "error"
	b.Error.Type = anthropicErrorType(e.Status)
	b.Error.Message = e.Message
	data, _ := json.Marshal(b)
	return data
}

// anthropicSSEError is the event that ends a Messages stream that failed after it started
// (serving.py, message_stream_converter: an "error" event), typed as Anthropic types it.
func anthropicSSEError(e *apiError) []byte {
	data := anthropicError(e)
	return append(append([]byte("event: error\ndata: "), data...), '\n', '\n')
}

// registerMessages adds the Anthropic Messages routes.
func (s *Server) registerMessages(e *gin.Engine) {
	e.POST(pathMessages, s.handleCompletion(pathMessages))
	if s.cfg.Anthropic.CountTokens == configs.CountTokensForward {
		e.POST(pathCountTokens, s.handleCompletion(pathCountTokens))
		return
	}
	e.POST(pathCountTokens, s.handleCountTokens)
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
	p, in, rreq, e := s.prepare(c.Request.Context(), endpoint, body, c.Request.Header, tenantOf(c))
	if e != nil {
		code = e.Status
		writeError(c, e)
		return
	}
	if p.Enricher == nil || rreq.BlockHashes == nil && rreq.PromptTokens == 0 {
		// Forwarded to a worker: a request like any other for the key's limits (counted
		// locally it costs no worker anything and is not limited).
		release, e := s.admitLimits(c, tenantOf(c), tokenEstimate(in, rreq.PromptTokens))
		if e != nil {
			code = e.Status
			writeError(c, e)
			return
		}
		defer release()
		end := p.Router.Start(rreq)
		defer end()
		code = s.proxy(c, p, in, rreq, start, false)
		return
	}
	code = http.StatusOK
	n := rreq.PromptTokens
	c.JSON(http.StatusOK, gin.H{"input_tokens": n, "context_management": gin.H{"original_input_tokens": n}})
}

// anthropicWorkerError gives a worker's error body on /v1/messages* Anthropic's shape: vLLM
// answers its request-validation failures (FastAPI's handler, before its Anthropic router
// translates anything) and its auth middleware's 401 in OpenAI's or its own shape
// (vllm/entrypoints/openai/server_utils.py). A body already Anthropic-shaped, or one that is not
// a JSON error at all, is left alone (ok false).
func anthropicWorkerError(status int, body []byte) ([]byte, bool) {
	var v struct {
		Type   string          `json:"type"`
		Error  json.RawMessage `json:"error"`
		Detail json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &v) != nil || v.Type == "error" {
		return nil, false
	}
	var msg string
	var inner struct {
		Message string `json:"message"`
	}
	switch {
	case json.Unmarshal(v.Error, &inner) == nil && inner.Message != "":
		msg = inner.Message
	case json.Unmarshal(v.Error, &msg) == nil && msg != "":
	case len(v.Detail) > 0:
		if json.Unmarshal(v.Detail, &msg) != nil || msg == "" {
			msg = string(v.Detail)
		}
	default:
		return nil, false
	}
	return anthropicError(&apiError{Status: status, Message: msg}), true
}
