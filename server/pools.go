package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"slices"

	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/workers"
)

// Pool is one served model's fleet and routing. The server picks a request's pool by its
// "model" (the pool's name, an alias, or a LoRA adapter one of the pool's workers lists);
// everything below that choice (the registry, the router with its index, load, sessions and
// latency fit, the enricher with its tokenizer) is the pool's own.
type Pool struct {
	// Model is the served model name (vllm serve --served-model-name).
	Model string
	// Aliases are further names routed to this pool as its base model.
	Aliases []string
	// BlockSize is the workers' KV block size.
	BlockSize int
	Registry  *workers.Registry
	Router    router.Router
	Enricher  RequestEnricher // optional
}

// pool is a Pool as the server holds it.
type pool struct {
	Pool
	names []string  // Model, then Aliases
	flow  *flowGate // nil: flow control off (or the router has no Capacity)
}

// newPools checks the pools and indexes them; with none, the single pool is built from the
// options' Config, Registry, Router and Enricher.
func newPools(opts Options) ([]*pool, error) {
	ps := opts.Pools
	if len(ps) == 0 {
		ps = []Pool{{Model: opts.Config.Model, BlockSize: opts.Config.BlockSize, Registry: opts.Registry,
			Router: opts.Router, Enricher: opts.Enricher}}
	}
	seen := map[string]bool{}
	out := make([]*pool, 0, len(ps))
	for _, p := range ps {
		if p.Registry == nil || p.Router == nil {
			return nil, errors.New("server: registry and router are required")
		}
		pp := &pool{Pool: p, names: append([]string{p.Model}, p.Aliases...)}
		for _, n := range pp.names {
			if n != "" && seen[n] {
				return nil, fmt.Errorf("server: model name %q is served by two pools", n)
			}
			seen[n] = true
		}
		out = append(out, pp)
	}
	return out, nil
}

// resolvePool picks the pool serving model: a pool's name or alias first, then a model one of
// a pool's workers lists (a LoRA adapter, refreshed by the health probes). An absent model goes
// to the first pool (vLLM then serves its default model). Anything else is OpenAI's 404
// model_not_found.
func (s *Server) resolvePool(model string) (*pool, *apiError) {
	if model == "" {
		return s.pools[0], nil
	}
	for _, p := range s.pools {
		if slices.Contains(p.names, model) {
			return p, nil
		}
	}
	for _, p := range s.pools {
		if slices.Contains(p.Registry.Models(), model) {
			return p, nil
		}
	}
	return nil, modelNotFound(model)
}

// modelNotFound is OpenAI's answer for a model it does not serve: 404,
// invalid_request_error, code model_not_found.
func modelNotFound(model string) *apiError {
	return &apiError{Status: http.StatusNotFound, Param: "model", errType: "invalid_request_error", code: "model_not_found",
		Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", model)}
}

// passthroughPool picks the pool of a passthrough request by the "model" of a JSON body (as
// vLLM's own endpoints read it), and returns that model; a body without one, or not JSON, goes
// to the first pool.
func (s *Server) passthroughPool(contentType string, body []byte) (*pool, string, *apiError) {
	if mt, _, _ := mime.ParseMediaType(contentType); mt != "application/json" || len(bytes.TrimSpace(body)) == 0 {
		return s.pools[0], "", nil
	}
	var probe struct {
		Model json.RawMessage `json:"model"`
	}
	if json.Unmarshal(body, &probe) != nil {
		return s.pools[0], "", nil // the worker answers the malformed body itself
	}
	var model string
	if json.Unmarshal(probe.Model, &model) != nil {
		return s.pools[0], "", nil
	}
	p, e := s.resolvePool(model)
	return p, model, e
}

// allWorkers lists every pool's workers, pool by pool in configured order.
func (s *Server) allWorkers() []*workers.Worker {
	var out []*workers.Worker
	for _, p := range s.pools {
		out = append(out, p.Registry.Workers()...)
	}
	return out
}
