package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/sessions"
	"github.com/kvgate/kvgate/workers"
)

// routeDebug is the body of POST /debug/route: the decision record (fixed fields; README,
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
// session. The endpoint is ?endpoint=chat|completions, else chat when the body has "messages".
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
	d, rreq, err := s.decide(c.Request.Context(), endpoint, body, c.Request.Header)
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
	case "":
	default:
		return "", badRequest("endpoint", fmt.Sprintf("endpoint %q is not chat or completions", q))
	}
	var keys map[string]json.RawMessage
	if json.Unmarshal(bytes.TrimSpace(body), &keys) != nil {
		return pathChat, nil // the chat parser reports what is wrong with the body
	}
	if _, ok := keys["messages"]; !ok {
		if _, ok := keys["prompt"]; ok {
			return pathCompletions, nil
		}
	}
	return pathChat, nil
}

// targetView is one worker+rank in GET /debug/workers.
type targetView struct {
	Worker    string `json:"worker"`
	DPRank    int    `json:"dp_rank"`
	Healthy   bool   `json:"healthy"`
	State     string `json:"state"` // health: unknown, healthy, ejected
	LastError string `json:"last_error,omitempty"`
	InFlight  int    `json:"in_flight"`
	// Mode is how the KV-aware policy scores the target: "events" (the KV-event index) or
	// "approximate" (predicted from the gateway's own routing). Empty for other policies.
	Mode string `json:"mode,omitempty"`
	// KVEvents is the configured event endpoint ("" = none: approximate mode only).
	KVEvents string `json:"kv_events,omitempty"`
	// Subscription is the KV-event stream and index state of this target (nil without events).
	Subscription *indexers.TargetDebug `json:"subscription,omitempty"`
	// IndexBlocks is how many blocks the event index holds for the target.
	IndexBlocks int `json:"index_blocks"`
	// ApproximateBlocks is how many blocks approximate mode assumes cached there.
	ApproximateBlocks *int       `json:"approximate_blocks,omitempty"`
	Load              *loadView  `json:"load,omitempty"`
	Metrics           *metricsMV `json:"metrics,omitempty"`
}

type loadView struct {
	PrefillTokens   int `json:"prefill_tokens"`
	PrefillRequests int `json:"prefill_requests"`
	Requests        int `json:"requests"`
	ActiveBlocks    int `json:"active_blocks"`
}

type metricsMV struct {
	Running      float64 `json:"running"`
	Waiting      float64 `json:"waiting"`
	KVUsage      float64 `json:"kv_usage"`
	NumGPUBlocks int     `json:"num_gpu_blocks,omitempty"`
	AgeSeconds   float64 `json:"age_seconds"`
}

// workersDebug is the body of GET /debug/workers.
type workersDebug struct {
	Policy    string          `json:"policy"`
	BlockSize int             `json:"block_size"`
	Targets   []targetView    `json:"targets"`
	Sessions  *sessions.Stats `json:"sessions,omitempty"`
	// Collectors are the KV-event collectors (kv_events.listen), with the messages they could
	// not attribute to a configured worker+rank.
	Collectors []indexers.CollectorDebug `json:"kv_collectors,omitempty"`
}

// kvParts returns the engine and KV policy behind the server's policy, when there are any.
func (s *Server) kvParts() (*router.Engine, *router.KVPolicy) {
	var eng *router.Engine
	var p router.Policy = s.router
	if e, ok := p.(*router.Engine); ok {
		eng, p = e, e.Policy()
	}
	kv, _ := p.(*router.KVPolicy)
	return eng, kv
}

// handleDebugWorkers answers GET /debug/workers: per worker+rank its health, load, scoring
// mode and KV-event subscription (state, sequence, gaps, replays, resets, index size).
func (s *Server) handleDebugWorkers(c *gin.Context) {
	subs := map[workers.Target]*indexers.TargetDebug{}
	if s.events != nil {
		snap := s.events.Snapshot()
		for i := range snap {
			subs[workers.Target{Worker: snap[i].Worker, DPRank: snap[i].DPRank}] = &snap[i]
		}
	}
	eng, kv := s.kvParts()
	out := workersDebug{Policy: s.router.Name(), BlockSize: s.cfg.BlockSize, Targets: []targetView{}}
	if s.sessions != nil {
		st := s.sessions.Stats()
		out.Sessions = &st
	}
	if s.events != nil {
		out.Collectors = s.events.Collectors()
	}
	now := time.Now()
	for _, w := range s.reg.Workers() {
		st := w.Status()
		for rank := range w.DPSize() {
			t := workers.Target{Worker: w.URL(), DPRank: rank}
			v := targetView{Worker: t.Worker, DPRank: rank, Healthy: st.Healthy, State: st.State,
				LastError: st.LastError, InFlight: w.InFlight(rank), KVEvents: w.Config().KVEvents}
			if sub := subs[t]; sub != nil {
				v.Subscription, v.IndexBlocks = sub, sub.IndexBlocks
			}
			if kv != nil {
				v.Mode = kv.Mode(t)
				if a := kv.Approx(); a != nil {
					n := a.Resident(t)
					v.ApproximateBlocks = &n
				}
			}
			if eng != nil {
				l := eng.Load().Load(t)
				v.Load = &loadView{PrefillTokens: l.PrefillTokens, PrefillRequests: l.PrefillRequests,
					Requests: l.Requests, ActiveBlocks: l.ActiveBlocks}
				// The last reading, however old; its age tells whether scoring still uses it.
				if m, ok := eng.Load().Metrics(t, 365*24*time.Hour); ok {
					v.Metrics = &metricsMV{Running: m.Running, Waiting: m.Waiting, KVUsage: m.KVUsage,
						NumGPUBlocks: m.NumGPUBlocks, AgeSeconds: now.Sub(m.At).Seconds()}
				}
			}
			out.Targets = append(out.Targets, v)
		}
	}
	c.JSON(http.StatusOK, out)
}

// handleDebugSession answers GET /debug/sessions/{id}: the session's parent, affinity,
// frontiers per worker+rank, sibling group and the hints its next request would get. With
// ?lineage=true every frontier lists its block lineage. Unknown sessions are 404.
func (s *Server) handleDebugSession(c *gin.Context) {
	id := strings.TrimPrefix(c.Param("id"), "/")
	if id == "" {
		writeError(c, &apiError{Status: http.StatusNotFound, Message: "no session id: use /debug/sessions/{id}"})
		return
	}
	if s.sessions == nil {
		writeError(c, &apiError{Status: http.StatusNotFound,
			Message: fmt.Sprintf("session %q is not tracked: sessions are tracked only with the kv and kv_no_load policies (policy is %s)", id, s.router.Name())})
		return
	}
	lineage := c.Query("lineage") == "true" || c.Query("lineage") == "1"
	view, ok := s.sessions.Debug(id, lineage)
	if !ok {
		writeError(c, &apiError{Status: http.StatusNotFound, Message: fmt.Sprintf("unknown session %q (never seen, closed, or evicted)", id)})
		return
	}
	c.JSON(http.StatusOK, view)
}
