package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvgate/kvgate/workers"
)

// handleModels answers GET /v1/models from the workers' own /v1/models: the cards of every
// routable worker of every model's pool (base models, aliases and LoRA adapters, loaded at
// start or at runtime), merged by id in pool and fleet order, exactly as the workers wrote
// them.
func (s *Server) handleModels(c *gin.Context) {
	cards, e := s.mergedModels(c.Request.Context())
	if e != nil {
		writeError(c, e)
		return
	}
	data := make([]json.RawMessage, len(cards))
	for i, card := range cards {
		data[i] = card.raw
	}
	c.JSON(http.StatusOK, gin.H{"object": "list", "data": data})
}

// handleModel answers GET /v1/models/{id} (the OpenAI clients' models.retrieve), which vLLM
// itself does not serve: the card of that id from the merged list of handleModels, else
// OpenAI's 404 model_not_found.
func (s *Server) handleModel(c *gin.Context) {
	id := strings.TrimPrefix(c.Param("id"), "/") // a catch-all: ids like org/name have slashes
	cards, e := s.mergedModels(c.Request.Context())
	if e != nil {
		writeError(c, e)
		return
	}
	for _, card := range cards {
		if card.id == id {
			c.Data(http.StatusOK, "application/json", card.raw)
			return
		}
	}
	writeError(c, modelNotFound(id))
}

// modelCard is one worker's model card and its id.
type modelCard struct {
	id  string
	raw json.RawMessage
}

// mergedModels asks every routable worker of every pool for its /v1/models and merges the
// cards by id in pool and fleet order.
func (s *Server) mergedModels(ctx context.Context) ([]modelCard, *apiError) {
	var ws []*workers.Worker
	for _, w := range s.allWorkers() {
		if w.Routable() {
			ws = append(ws, w)
		}
	}
	if len(ws) == 0 {
		return nil, &apiError{Status: http.StatusServiceUnavailable, Message: "no healthy worker to list models"}
	}
	ctx, cancel := context.WithTimeout(ctx, max(s.cfg.Health.Timeout.D(), 5*time.Second))
	defer cancel()
	lists := make([][]json.RawMessage, len(ws))
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() { lists[i], errs[i] = fetchModels(ctx, w) })
	}
	wg.Wait()

	seen := map[string]bool{}
	cards := []modelCard{}
	var failures []string
	for i, list := range lists {
		if errs[i] != nil {
			failures = append(failures, errs[i].Error())
			continue
		}
		for _, card := range list {
			var id struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(card, &id) != nil || seen[id.ID] {
				continue
			}
			seen[id.ID] = true
			cards = append(cards, modelCard{id: id.ID, raw: card})
		}
	}
	if len(failures) == len(ws) {
		return nil, &apiError{Status: http.StatusBadGateway, Message: "no worker answered /v1/models: " + strings.Join(failures, "; ")}
	}
	return cards, nil
}

func fetchModels(ctx context.Context, w *workers.Worker) ([]json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.Endpoint("/v1/models", ""), nil)
	if err != nil {
		return nil, err
	}
	w.Authorize(req.Header)
	resp, err := w.Client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", w.URL(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: status %d", w.URL(), resp.StatusCode)
	}
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("%s: %w", w.URL(), err)
	}
	return list.Data, nil
}

// handleHealth is 200 while at least one worker is routable, else 503 with the reason.
func (s *Server) handleHealth(c *gin.Context) {
	type workerState struct {
		URL       string `json:"url"`
		State     string `json:"state"`
		InFlight  []int  `json:"in_flight"`
		LastError string `json:"last_error,omitempty"`
	}
	var states []workerState
	routable := 0
	var reasons []string
	for _, w := range s.allWorkers() {
		st := w.Status()
		states = append(states, workerState{URL: st.URL, State: st.State, InFlight: st.InFlight, LastError: st.LastError})
		if st.Healthy {
			routable++
		} else {
			reasons = append(reasons, fmt.Sprintf("%s: %s", st.URL, st.LastError))
		}
	}
	body := gin.H{"status": "ok", "routable_workers": routable, "workers": states}
	if degraded := s.addDetails(body); len(degraded) > 0 {
		body["degraded"] = degraded
	}
	code := http.StatusOK
	if routable == 0 {
		code = http.StatusServiceUnavailable
		body["status"] = "unavailable"
		body["reason"] = fmt.Sprintf("no healthy worker (0 of %d routable): %s", len(states), strings.Join(reasons, "; "))
	}
	c.JSON(code, body)
}

// addDetails puts every HealthDetail into body under its name and returns the degraded ones'
// names.
func (s *Server) addDetails(body gin.H) []string {
	var degraded []string
	for _, d := range s.details {
		name, detail, bad := d.HealthDetail()
		body[name] = detail
		if bad {
			degraded = append(degraded, name)
		}
	}
	return degraded
}
