package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/router"
)

const (
	pathResponses = string(apireq.Responses)
	// pathResponseByID is the metrics label (and the Request endpoint) of GET/DELETE
	// /v1/responses/{id} and POST /v1/responses/{id}/cancel: one label, whatever the id.
	pathResponseByID = pathResponses + "/{id}"
)

// responseNotFound is vLLM's answer for a response id it does not hold
// (vllm/entrypoints/openai/responses/serving.py, _make_not_found_error).
func responseNotFound(id string) *apiError {
	return &apiError{Status: http.StatusNotFound, Param: "response_id", errType: "invalid_request_error",
		Message: fmt.Sprintf("Response with id '%s' not found.", id)}
}

// handleResponseByID serves GET and DELETE /v1/responses/{id} and POST
// /v1/responses/{id}/cancel: the request goes, unchanged, to the worker that produced the
// response (the router's hard pin), or is answered with vLLM's 404 when that worker is unknown
// or gone.
func (s *Server) handleResponseByID(c *gin.Context) {
	start := time.Now()
	code := 0
	s.m.inFlight.WithLabelValues(pathResponseByID).Inc()
	defer func() {
		s.m.inFlight.WithLabelValues(pathResponseByID).Dec()
		s.m.requests.WithLabelValues(pathResponseByID, strconv.Itoa(code)).Inc()
		s.m.duration.WithLabelValues(pathResponseByID).Observe(time.Since(start).Seconds())
	}()
	body, e := s.readBody(c)
	if e != nil {
		code = e.Status
		writeError(c, e)
		return
	}
	id := c.Param("id")
	in := &apireq.Request{Endpoint: apireq.Endpoint(pathResponseByID), Body: body,
		Stream: c.Query("stream") == "true"}
	// The id names no model: the pool whose router pinned it serves it (the last pool asked
	// answers vLLM's 404 when none did).
	for i, p := range s.pools {
		rreq := &router.Request{Model: p.Model, BlockSize: p.BlockSize, PinResponseID: id,
			Owner: tenantOf(c).owner(), Stream: in.Stream, Header: c.Request.Header}
		if code = s.proxy(c, p, in, rreq, start, i < len(s.pools)-1); code != errPinElsewhere {
			return
		}
	}
}

// upstreamTarget is the method and path a request is sent to the worker with: the client's
// own for the by-id Responses routes, else POST to the endpoint.
func upstreamTarget(c *gin.Context, in *apireq.Request) (method, path string) {
	if string(in.Endpoint) == pathResponseByID {
		return c.Request.Method, c.Request.URL.Path
	}
	return http.MethodPost, string(in.Endpoint)
}

// responseIDs reports a stored response's id as soon as the worker names it: the non-stream
// body's "id", or the stream's response.created event (vLLM's responses_stream_generator
// sends it first); and, once the response is complete, the ids of its output items (the body's
// "output", or response.completed's), which later requests may reference (itemrefs.go).
// Methods on a nil value do nothing.
type responseIDs struct {
	found func(id string)
	items func(response string, items []string) // nil: output items are not noted
	done  bool
}

func (r *responseIDs) fromEvent(ev []byte) {
	if r == nil {
		return
	}
	if !r.done && bytes.Contains(ev, []byte("response.created")) {
		var e struct {
			Type     string `json:"type"`
			Response struct {
				ID string `json:"id"`
			} `json:"response"`
		}
		if json.Unmarshal(sseData(ev), &e) == nil && e.Type == "response.created" && e.Response.ID != "" {
			r.done = true
			r.found(e.Response.ID)
		}
		return
	}
	if r.items != nil && bytes.Contains(ev, []byte("response.completed")) {
		var e struct {
			Type     string `json:"type"`
			Response struct {
				ID     string `json:"id"`
				Output []struct {
					ID string `json:"id"`
				} `json:"output"`
			} `json:"response"`
		}
		if json.Unmarshal(sseData(ev), &e) == nil && e.Type == "response.completed" {
			r.items(e.Response.ID, outputItemIDs(e.Response.Output))
		}
	}
}

func (r *responseIDs) fromBody(body []byte) {
	if r == nil || r.done || len(body) == 0 {
		return
	}
	var b struct {
		ID     string `json:"id"`
		Object string `json:"object"`
		Output []struct {
			ID string `json:"id"`
		} `json:"output"`
	}
	if json.Unmarshal(body, &b) == nil && b.Object == "response" && b.ID != "" {
		r.done = true
		r.found(b.ID)
		if r.items != nil {
			r.items(b.ID, outputItemIDs(b.Output))
		}
	}
}

// isResponsesEnd reports whether an SSE event ends a Responses stream: vLLM ends it with
// response.completed (or response.failed / response.incomplete in newer versions) and sends
// no [DONE].
func isResponsesEnd(ev []byte) bool {
	if !bytes.Contains(ev, []byte("event: response.")) && !bytes.Contains(ev, []byte(`"type":"response.`)) && !bytes.Contains(ev, []byte(`"type": "response.`)) {
		return false
	}
	for _, t := range responsesEndTypes() {
		if bytes.Contains(ev, []byte("event: "+t+"\n")) || bytes.Contains(ev, []byte(`"type":"`+t+`"`)) || bytes.Contains(ev, []byte(`"type": "`+t+`"`)) {
			return true
		}
	}
	return false
}

// isResponsesToken reports whether a Responses stream event carries the response's first
// output: a delta of any kind (output text, reasoning, a function call's arguments, a
// refusal), or the end or an error when none came. vLLM sends response.created and
// response.in_progress before the prefill, and opens an output item only with its first delta
// (responses_stream_generator and its SimpleStreamingEventProcessor,
// vllm/entrypoints/openai/responses/serving.py), so the first byte is no first token.
func isResponsesToken(ev []byte) bool {
	t := sseEventType(ev)
	ends := responsesEndTypes()
	return strings.HasSuffix(t, ".delta") || t == "error" || slices.Contains(ends[:], t)
}

// responsesEndTypes are the event types that end a Responses stream (isResponsesEnd).
func responsesEndTypes() [3]string {
	return [3]string{"response.completed", "response.failed", "response.incomplete"}
}

// sseEventType is an event's type: its "event:" field, else its data's JSON "type".
func sseEventType(ev []byte) string {
	for line := range bytes.Lines(ev) {
		if v, ok := bytes.CutPrefix(line, []byte("event:")); ok {
			return string(bytes.TrimSpace(v))
		}
	}
	var typed struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(sseData(ev), &typed) != nil {
		return ""
	}
	return typed.Type
}

// debugPins is GET /debug/sessions/ (no id): the Responses API pins.
type debugPins struct {
	ResponsePins []router.PinView `json:"response_pins"`
}
