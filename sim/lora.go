package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
)

// loraSet is the worker's LoRA adapters: those of Options.LoRAModules, and those loaded or
// unloaded at runtime (POST /v1/load_lora_adapter, /v1/unload_lora_adapter) when
// Options.AllowRuntimeLoRAUpdating is set, as vLLM's OpenAIServingModels keeps them
// (vllm/entrypoints/openai/serving_models.py): each adapter gets the next integer id, never
// reused; /v1/models lists them in load order.
type loraSet struct {
	mu     sync.RWMutex
	ids    map[string]int
	paths  map[string]string
	order  []string
	nextID int
}

func newLoRASet(names []string) *loraSet {
	s := &loraSet{ids: map[string]int{}, paths: map[string]string{}}
	for _, n := range names {
		s.load(n, n)
	}
	return s
}

// id returns the adapter's integer id, false when no such adapter is loaded.
func (s *loraSet) id(name string) (int, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	id, ok := s.ids[name]
	return id, ok
}

// list lists the loaded adapters in load order, with their paths.
func (s *loraSet) list() (names, paths []string) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, n := range s.order {
		names, paths = append(names, n), append(paths, s.paths[n])
	}
	return names, paths
}

// load adds an adapter; false when one of that name is loaded already.
func (s *loraSet) load(name, path string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.ids[name]; dup {
		return false
	}
	s.nextID++
	s.ids[name], s.paths[name] = s.nextID, path
	s.order = append(s.order, name)
	return true
}

func (s *loraSet) unload(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.ids[name]; !ok {
		return false
	}
	delete(s.ids, name)
	delete(s.paths, name)
	s.order = slices.DeleteFunc(s.order, func(n string) bool { return n == name })
	return true
}

// loraRequest is vLLM's LoadLoRAAdapterRequest and UnloadLoRAAdapterRequest
// (vllm/entrypoints/openai/protocol.py).
type loraRequest struct {
	LoRAName string `json:"lora_name"`
	LoRAPath string `json:"lora_path"`
}

func readLoRARequest(rw http.ResponseWriter, r *http.Request) (loraRequest, bool) {
	var req loraRequest
	raw, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err == nil {
		err = json.Unmarshal(raw, &req)
	}
	if err != nil {
		writeError(rw, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return req, false
	}
	return req, true
}

// handleLoadLoRA answers POST /v1/load_lora_adapter as vLLM's api_server does (routed only
// with VLLM_ALLOW_RUNTIME_LORA_UPDATING): 200 with a plain-text success line, or 400 with an
// InvalidUserInput error. The simulator has no weights: any path loads.
func (w *Worker) handleLoadLoRA(rw http.ResponseWriter, r *http.Request) {
	req, ok := readLoRARequest(rw, r)
	if !ok {
		return
	}
	if req.LoRAName == "" || req.LoRAPath == "" {
		writeTypedError(rw, http.StatusBadRequest, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided.")
		return
	}
	if !w.loras.load(req.LoRAName, req.LoRAPath) {
		writeTypedError(rw, http.StatusBadRequest, "InvalidUserInput", fmt.Sprintf("The lora adapter '%s' has already been loaded.", req.LoRAName))
		return
	}
	rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
	rw.WriteHeader(http.StatusOK)
	_, _ = fmt.Fprintf(rw, "Success: LoRA adapter '%s' added successfully.", req.LoRAName)
}

// handleUnloadLoRA answers POST /v1/unload_lora_adapter: 200 with a plain-text line, or 404
// NotFoundError for an adapter not loaded.
func (w *Worker) handleUnloadLoRA(rw http.ResponseWriter, r *http.Request) {
	req, ok := readLoRARequest(rw, r)
	if !ok {
		return
	}
	if req.LoRAName == "" {
		writeTypedError(rw, http.StatusBadRequest, "InvalidUserInput", "either 'lora_name' and 'lora_int_id' needs to be provided.")
		return
	}
	if !w.loras.unload(req.LoRAName) {
		writeTypedError(rw, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The lora adapter '%s' cannot be found.", req.LoRAName))
		return
	}
	rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
	rw.WriteHeader(http.StatusOK)
	_, _ = fmt.Fprintf(rw, "Success: LoRA adapter '%s' removed successfully.", req.LoRAName)
}

// writeTypedError sends vLLM's error body with an explicit type.
func writeTypedError(rw http.ResponseWriter, status int, typ, msg string) {
	writeJSON(rw, status, errorBody{Error: errorInfo{Message: msg, Type: typ, Code: status}})
}
