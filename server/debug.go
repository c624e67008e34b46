package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
)

// routeDebug is the body of POST /debug/route: the decision record (fixed fields; docs/operations.md,
// "POST /debug/route") plus what the gateway read from the request.
type routeDebug struct {
	router.Decision
	Endpoint        string `json:"endpoint"`
	BlockSize       int    `json:"block_size"`
	SessionID       string `json:"session_id,omitempty"`
	ParentSessionID string `json:"parent_session_id,omitempty"`
}

// handleDebugRoute answers POST /debug/route: the routing decision for a chat or completions
// body (and its session headers) without sending anything, accounting any load or changing any
// session. The endpoint is ?endpoint=chat|completions|responses, else chat when the body has
// "messages", completions when it has "prompt", responses when it has "input".
func (s *Server) handleDebugRoute(c *gin.Context) {
	body, e := s.readBody(c)
	if e != nil {
		writeError(c, e)
		return
	}
	endpoint, e := debugEndpoint(c.Query("endpoint"), body)
	if e != nil {
		writeError(c, e)
		return
	}
	// ?as_key=NAME shows the decision as that client key gets it (its cache salt and pins).
	var tn *tenant
	if name := c.Query("as_key"); name != "" {
		if tn = s.tenants.byName[name]; tn == nil {
			writeError(c, badRequest("as_key", fmt.Sprintf("no client key is named %q (auth.keys[].name, or the derived key-… name of a plain key)", name)))
			return
		}
	}
	d, rreq, err := s.decide(c.Request.Context(), endpoint, body, c.Request.Header, tn)
	if err != nil {
		WriteError(c, err)
		return
	}
	c.JSON(http.StatusOK, routeDebug{Decision: d, Endpoint: endpoint, BlockSize: rreq.BlockSize,
		SessionID: rreq.SessionID, ParentSessionID: rreq.ParentSessionID})
}

func debugEndpoint(q string, body []byte) (string, *apiError) {
	switch q {
	case "chat", pathChat:
		return pathChat, nil
	case "completions", pathCompletions:
		return pathCompletions, nil
	case "messages", pathMessages:
		return pathMessages, nil
	case "responses", pathResponses:
		return pathResponses, nil
	case "":
	default:
		return "", badRequest("endpoint", fmt.Sprintf("endpoint %q is not chat, completions, messages or responses", q))
	}
	var keys map[string]json.RawMessage
	if json.Unmarshal(bytes.TrimSpace(body), &keys) != nil {
		return pathChat, nil // the chat parser reports what is wrong with the body
	}
	if apireq.LooksLikeMessages(body) {
		return pathMessages, nil
	}
	if _, ok := keys["messages"]; !ok {
		if _, ok := keys["prompt"]; ok {
			return pathCompletions, nil
		}
		if _, ok := keys["input"]; ok {
			return pathResponses, nil
		}
	}
	return pathChat, nil
}

// targetView is one worker+rank in GET /debug/workers: its health (the registry's) and what
// routing knows of it (the router's view).
type targetView struct {
	Worker    string `json:"worker"`
	DPRank    int    `json:"dp_rank"`
	Healthy   bool   `json:"healthy"`
	State     string `json:"state"` // health: unknown, healthy, ejected
	LastError string `json:"last_error,omitempty"`
	InFlight  int    `json:"in_flight"`
	// Mode is the router's TargetView.Mode, here so that the keys keep the order docs/operations.md
	// shows (the shallower field wins over the embedded one in encoding/json).
	Mode string `json:"mode,omitempty"`
	// KVEvents is the configured event endpoint ("" = none: approximate mode only).
	KVEvents string `json:"kv_events,omitempty"`
	router.TargetView
}

// workersDebug is the body of GET /debug/workers.
type workersDebug struct {
	Model     string       `json:"model"`
	Policy    string       `json:"policy"`
	BlockSize int          `json:"block_size"`
	Targets   []targetView `json:"targets"`
	router.FleetView
	// Details are the HealthDetail components (the cluster link), by name.
	Details map[string]any `json:"details,omitempty"`
}

// handleDebugWorkers answers GET /debug/workers: per worker+rank of one model's pool
// (?model=NAME, default the first model) its health, load, scoring mode and KV-event
// subscription (state, sequence, gaps, replays, resets, index size).
func (s *Server) handleDebugWorkers(c *gin.Context) {
	p, e := s.resolvePool(c.Query("model"))
	if e != nil {
		writeError(c, e)
		return
	}
	out := workersDebug{Model: p.Model, Policy: p.Router.Name(), BlockSize: p.BlockSize, Targets: []targetView{},
		FleetView: p.Router.DebugFleet()}
	var ts []kvkey.Target
	for _, w := range p.Registry.Workers() {
		st := w.Status()
		for rank := range w.DPSize() {
			ts = append(ts, kvkey.Target{Worker: w.URL(), DPRank: rank})
			out.Targets = append(out.Targets, targetView{Worker: w.URL(), DPRank: rank, Healthy: st.Healthy,
				State: st.State, LastError: st.LastError, InFlight: w.InFlight(rank), KVEvents: w.Config().KVEvents})
		}
	}
	for i, v := range p.Router.DebugTargets(ts) {
		out.Targets[i].TargetView, out.Targets[i].Mode = v, v.Mode
	}
	if len(s.details) > 0 {
		d := gin.H{}
		s.addDetails(d)
		out.Details = d
	}
	c.JSON(http.StatusOK, out)
}

// handleDebugSession answers GET /debug/sessions/{id}: the session's parent, affinity,
// frontiers per worker+rank, sibling group and the hints its next request would get, in one
// model's pool (?model=NAME, default the first model). With ?lineage=true every frontier lists
// its block lineage. Unknown sessions are 404.
func (s *Server) handleDebugSession(c *gin.Context) {
	p, e := s.resolvePool(c.Query("model"))
	if e != nil {
		writeError(c, e)
		return
	}
	id := strings.TrimPrefix(c.Param("id"), "/")
	if id == "" {
		// No id: the Responses API pins (response id → the worker+rank storing it).
		c.JSON(http.StatusOK, debugPins{ResponsePins: p.Router.DebugPins(1000)})
		return
	}
	lineage := c.Query("lineage") == "true" || c.Query("lineage") == "1"
	// Sessions are kept under their hashed id: the client's id or the hashed one both work.
	view, err := p.Router.DebugSession(kvkey.HashSessionID(id), lineage)
	if err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, router.ErrNoSession) {
			status = http.StatusNotFound
		}
		writeError(c, &apiError{Status: status, Message: err.Error()})
		return
	}
	c.JSON(http.StatusOK, view)
}
