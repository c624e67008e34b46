package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"
)

// apiError is an OpenAI/vLLM error response: HTTP status plus
// {"error": {"message", "type", "param", "code"}} (vLLM's ErrorResponse,
// vllm/entrypoints/openai/protocol.py).
type apiError struct {
	Status  int
	Message string
	Param   string // empty → null
	// RetryAfter, when > 0, is sent as the Retry-After header (seconds).
	RetryAfter int
	// engineRestart marks a worker's bare 500 (its engine died or restarted): the same worker
	// may be tried again after a pause when no other one is left.
	engineRestart bool
	// errType replaces the type derived from Status (vLLM's own type for some answers, e.g.
	// invalid_request_error for an unknown response id).
	errType string
	// code replaces the numeric code with OpenAI's string code (model_not_found).
	code string
}

func (e *apiError) Error() string { return e.Message }

func badRequest(param, msg string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Message: msg, Param: param}
}

// errorType names the error the way vLLM does: BadRequestError, NotFoundError, ...
func errorType(status int) string {
	if status == http.StatusInternalServerError {
		return "InternalServerError"
	}
	text := strings.ReplaceAll(http.StatusText(status), " ", "")
	text = strings.ReplaceAll(text, "-", "")
	if text == "" {
		text = "Unknown"
	}
	return text + "Error"
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

type errorBody struct {
	Error errorInfo `json:"error"`
}

func (e *apiError) body() errorBody {
	info := errorInfo{Message: e.Message, Type: errorType(e.Status), Code: e.Status}
	if e.errType != "" {
		info.Type = e.errType
	}
	if e.Param != "" {
		p := e.Param
		info.Param = &p
	}
	return errorBody{Error: info}
}

// wireBody is the error body as sent: vLLM's numeric code, or OpenAI's string code where the
// gateway answers as OpenAI does (model_not_found).
type wireBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    any     `json:"code"`
	} `json:"error"`
}

func (e *apiError) wire() wireBody {
	b := e.body()
	var w wireBody
	w.Error.Message, w.Error.Type, w.Error.Param, w.Error.Code = b.Error.Message, b.Error.Type, b.Error.Param, b.Error.Code
	if e.code != "" {
		w.Error.Code = e.code
	}
	return w
}

// writeError sends e as a JSON error response and stops the gin chain.
func writeError(c *gin.Context, e *apiError) {
	c.Header("Content-Type", "application/json")
	if e.RetryAfter > 0 {
		c.Header("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	c.AbortWithStatus(e.Status)
	if anthropicRoute(c) {
		_, _ = c.Writer.Write(anthropicError(e))
		return
	}
	data, _ := json.Marshal(e.wire())
	_, _ = c.Writer.Write(data)
}

// sseErrorEvent is the event that ends a stream that failed after it started: vLLM sends
// `data: {"error": {...}}` (json.dumps spacing) and then `data: [DONE]`
// (vllm/entrypoints/openai/serving_chat.py, chat_completion_stream_generator).
func sseErrorEvent(e *apiError) []byte {
	b := e.body()
	param := "null"
	if b.Error.Param != nil {
		p, _ := json.Marshal(*b.Error.Param)
		param = string(p)
	}
	msg, _ := json.Marshal(b.Error.Message)
	typ, _ := json.Marshal(b.Error.Type)
	var sb strings.Builder
	sb.WriteString(`data: {"error": {"message": `)
	sb.Write(msg)
	sb.WriteString(`, "type": `)
	sb.Write(typ)
	sb.WriteString(`, "param": `)
	sb.WriteString(param)
	code, _ := json.Marshal(e.wire().Error.Code)
	sb.WriteString(`, "code": `)
	sb.Write(code)
	sb.WriteString("}}\n\ndata: [DONE]\n\n")
	return []byte(sb.String())
}

// BadRequest returns an error that the server answers with HTTP 400 and this message (param
// names the field at fault, "" for none). A RequestEnricher returns it for requests the worker
// would reject too, such as a chat template error.
func BadRequest(param, message string) error { return badRequest(param, message) }

// StatusOf returns the HTTP status a request error stands for: the request error's own
// status, else 500.
func StatusOf(err error) int {
	var e *apiError
	if errors.As(err, &e) {
		return e.Status
	}
	return http.StatusInternalServerError
}

// WriteError answers with err as an OpenAI error body (status from StatusOf); for handlers
// other packages add to Engine, e.g. a dry-run route.
func WriteError(c *gin.Context, err error) {
	var e *apiError
	if !errors.As(err, &e) {
		e = &apiError{Status: http.StatusInternalServerError, Message: err.Error()}
	}
	writeError(c, e)
}
