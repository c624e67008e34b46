package sim

import (
	"bytes"
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"
)

// This file is the simulator's OpenAI Responses API (vllm/entrypoints/openai/responses/): its
// own, deliberately plain conversion of a Responses body into the chat messages vLLM's
// construct_input_messages builds (independent of the gateway's mapping, so the two check
// each other), an in-memory store like OpenAIServingResponses' response_store and msg_store
// (bounded here), and vLLM's response object and stream event names.

// maxStoredResponses bounds the simulator's response store (vLLM's never evicts).
const maxStoredResponses = 4096

type storedResponse struct {
	id       string
	messages []json.RawMessage // the input messages this response was generated from
	output   string            // the assistant text it produced
	object   []byte            // the response object as served
}

// responseStore is a bounded LRU of stored responses.
type responseStore struct {
	mu  sync.Mutex
	lru *list.List
	ids map[string]*list.Element
}

func newResponseStore() *responseStore {
	return &responseStore{lru: list.New(), ids: map[string]*list.Element{}}
}

func (s *responseStore) put(r *storedResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids[r.id] = s.lru.PushFront(r)
	for s.lru.Len() > maxStoredResponses {
		old := s.lru.Back()
		s.lru.Remove(old)
		delete(s.ids, old.Value.(*storedResponse).id)
	}
}

func (s *responseStore) get(id string) (*storedResponse, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.ids[id]
	if !ok {
		return nil, false
	}
	s.lru.MoveToFront(el)
	return el.Value.(*storedResponse), true
}

// writeResponseNotFound is vLLM's _make_not_found_error body.
func writeResponseNotFound(rw http.ResponseWriter, id string) {
	param := "response_id"
	writeJSON(rw, http.StatusNotFound, errorBody{Error: errorInfo{
		Message: fmt.Sprintf("Response with id '%s' not found.", id), Type: "invalid_request_error", Param: &param, Code: 404}})
}

type responsesBody struct {
	Model              string                   `json:"model"`
	Input              json.RawMessage          `json:"input"`
	Instructions       *string                  `json:"instructions"`
	PreviousResponseID *string                  `json:"previous_response_id"`
	Store              *bool                    `json:"store"`
	Stream             bool                     `json:"stream"`
	MaxOutputTokens    *int                     `json:"max_output_tokens"`
	IgnoreEOS          bool                     `json:"ignore_eos"`
	ChatTemplateKwargs json.RawMessage          `json:"chat_template_kwargs"`
	Reasoning          *struct{ Effort string } `json:"reasoning"`
	CacheSalt          json.RawMessage          `json:"cache_salt"`
}

type inputItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Status    string          `json:"status"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
	Content   json.RawMessage `json:"content"`
	Summary   []struct {
		Text string `json:"text"`
	} `json:"summary"`
	Encrypted *string `json:"encrypted_content"`
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// chatMessages converts the input the way construct_input_messages does for a non-Harmony
// model; prev is the stored response a follow-up continues (nil for none).
func chatMessages(b *responsesBody, prev *storedResponse) ([]json.RawMessage, []json.RawMessage, bool, error) {
	var sys []json.RawMessage
	if b.Instructions != nil && *b.Instructions != "" {
		sys = append(sys, mustJSON(map[string]string{"role": "system", "content": *b.Instructions}))
	}
	var msgs []map[string]any // built messages (nil raw) or passed-through ones (raw set)
	var raws []json.RawMessage
	add := func(m map[string]any, raw json.RawMessage) {
		msgs = append(msgs, m)
		raws = append(raws, raw)
	}
	if prev != nil {
		for _, m := range prev.messages {
			var role struct{ Role string }
			_ = json.Unmarshal(m, &role)
			if role.Role != "system" {
				add(nil, m)
			}
		}
		add(map[string]any{"role": "assistant", "content": prev.output}, nil)
	}
	cont := false
	var s string
	if json.Unmarshal(b.Input, &s) == nil {
		add(map[string]any{"role": "user", "content": s}, nil)
	} else {
		var items []json.RawMessage
		if err := json.Unmarshal(b.Input, &items); err != nil {
			return nil, nil, false, errors.New("input must be a string or a list of items")
		}
		lastAssistant := func() map[string]any {
			if n := len(msgs); n > 0 && msgs[n-1] != nil && msgs[n-1]["role"] == "assistant" {
				return msgs[n-1]
			}
			return nil
		}
		for i, raw := range items {
			var it inputItem
			if err := json.Unmarshal(raw, &it); err != nil {
				return nil, nil, false, fmt.Errorf("input[%d]: %v", i, err)
			}
			cont = (it.Type == "reasoning" || it.Role == "assistant") && (it.Status == "in_progress" || it.Status == "incomplete")
			switch {
			case it.Type == "function_call":
				call := map[string]any{"id": it.CallID, "type": "function", "function": map[string]any{"name": it.Name, "arguments": it.Arguments}}
				if m := lastAssistant(); m != nil {
					calls, _ := m["tool_calls"].([]any)
					m["tool_calls"] = append(calls, call)
				} else {
					add(map[string]any{"role": "assistant", "tool_calls": []any{call}}, nil)
				}
			case it.Type == "function_call_output":
				add(map[string]any{"role": "tool", "content": it.Output, "tool_call_id": it.CallID}, nil)
			case it.Type == "reasoning":
				if it.Encrypted != nil {
					return nil, nil, false, &badRequestError{msg: "Encrypted content is not supported."}
				}
				text := firstPartText(it.Content)
				if text == "" && len(it.Summary) > 0 {
					text = it.Summary[0].Text
				}
				if m := lastAssistant(); m != nil && m["reasoning"] == nil {
					m["reasoning"] = text
				} else {
					add(map[string]any{"role": "assistant", "reasoning": text}, nil)
				}
			case it.Type == "message" && it.Role == "assistant" && bytes.HasPrefix(bytes.TrimSpace(it.Content), []byte("[")):
				text := firstPartText(it.Content)
				if m := lastAssistant(); m != nil && m["content"] == nil {
					m["content"] = text
				} else {
					add(map[string]any{"role": "assistant", "content": text}, nil)
				}
			default:
				add(nil, raw)
			}
		}
	}
	out := sys
	for i, m := range msgs {
		if m == nil {
			out = append(out, raws[i])
		} else {
			out = append(out, mustJSON(m))
		}
	}
	return out, out[len(sys):], cont, nil
}

func firstPartText(content json.RawMessage) string {
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(content, &parts) != nil || len(parts) == 0 {
		return ""
	}
	return parts[0].Text
}

// handleResponses serves POST /v1/responses: the prompt is rendered as a chat body with
// add_special_tokens true (vLLM's Responses default), generated by the engine, and answered as
// a response object or its event stream; store (default true) keeps it for a follow-up.
func (w *Worker) handleResponses(rw http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
	if err != nil {
		writeError(rw, http.StatusBadRequest, "read body: "+err.Error())
		return
	}
	var b responsesBody
	if err := json.Unmarshal(raw, &b); err != nil {
		writeError(rw, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	var prev *storedResponse
	if b.PreviousResponseID != nil && *b.PreviousResponseID != "" {
		p, ok := w.stored.get(*b.PreviousResponseID)
		if !ok {
			writeResponseNotFound(rw, *b.PreviousResponseID)
			return
		}
		prev = p
	}
	all, _, cont, err := chatMessages(&b, prev)
	if err != nil {
		writeError(rw, http.StatusBadRequest, err.Error())
		return
	}
	chatBody := map[string]any{"model": b.Model, "messages": all, "add_special_tokens": true,
		"add_generation_prompt": !cont, "continue_final_message": cont}
	if b.MaxOutputTokens != nil {
		chatBody["max_tokens"] = *b.MaxOutputTokens
	}
	if len(b.ChatTemplateKwargs) > 0 {
		chatBody["chat_template_kwargs"] = b.ChatTemplateKwargs
	}
	if b.Reasoning != nil && b.Reasoning.Effort != "" {
		chatBody["reasoning_effort"] = b.Reasoning.Effort
	}
	if len(b.CacheSalt) > 0 {
		chatBody["cache_salt"] = b.CacheSalt
	}
	r2 := r.Clone(r.Context())
	r2.Body = io.NopCloser(bytes.NewReader(mustJSON(chatBody)))
	a, aerr := w.parseRequest(r2, true)
	if aerr != nil {
		writeError(rw, aerr.status, aerr.msg)
		return
	}
	e, err := w.pickEngine(r.Header)
	if err != nil {
		writeError(rw, http.StatusBadRequest, err.Error())
		return
	}
	req := newSimRequest(w.newID())
	req.seq = seqState{tokens: a.tokens, salt: a.salt, loraName: a.lora, loraID: w.loras[a.lora]}
	req.promptLen, req.maxTokens, req.sessionID = len(a.tokens), a.maxTok, a.session
	if !b.IgnoreEOS {
		req.stopAt = w.naturalLength(a.tokens)
	}
	if !e.enqueue(req) {
		writeError(rw, http.StatusServiceUnavailable, "vllm-sim: waiting queue full")
		return
	}
	w.requests.Add(1)
	store := b.Store == nil || *b.Store
	model := b.Model
	if model == "" {
		model = w.opts.ServedModelName
	}
	id := "resp_" + req.id
	obj := func(status, text string, out []uint32) map[string]any {
		o := map[string]any{"id": id, "created_at": w.created, "incomplete_details": nil, "instructions": b.Instructions,
			"metadata": nil, "model": model, "object": "response", "output": []any{}, "parallel_tool_calls": true,
			"tool_choice": "auto", "tools": []any{}, "background": false, "max_output_tokens": b.MaxOutputTokens,
			"previous_response_id": b.PreviousResponseID, "status": status, "store": store}
		if status == "completed" {
			o["output"] = []any{outputMessage(req.id, text)}
			o["usage"] = map[string]any{"input_tokens": len(a.tokens), "input_tokens_details": map[string]int{"cached_tokens": req.cached},
				"output_tokens": len(out), "output_tokens_details": map[string]int{"reasoning_tokens": 0}, "total_tokens": len(a.tokens) + len(out)}
		}
		return o
	}
	finish := func(text string, out []uint32) []byte {
		body := mustJSON(obj("completed", text, out))
		if store {
			w.stored.put(&storedResponse{id: id, messages: all, output: text, object: body})
		}
		w.observe(e, req)
		w.completed.Add(1)
		return body
	}
	if !b.Stream {
		out, text, ok := w.generate(r, req, e, nil)
		if !ok {
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write(finish(text, out))
		return
	}
	rw.Header().Set("Content-Type", "text/event-stream")
	rw.WriteHeader(http.StatusOK)
	flusher, _ := rw.(http.Flusher)
	seq := 0
	send := func(typ string, fields map[string]any) {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		fmt.Fprintf(rw, "event: %s\ndata: %s\n\n", typ, mustJSON(fields))
		if flusher != nil {
			flusher.Flush()
		}
	}
	send("response.created", map[string]any{"response": obj("in_progress", "", nil)})
	send("response.in_progress", map[string]any{"response": obj("in_progress", "", nil)})
	itemID := "msg_" + req.id
	send("response.output_item.added", map[string]any{"output_index": 0, "item": map[string]any{"id": itemID, "content": []any{}, "role": "assistant", "status": "in_progress", "type": "message"}})
	send("response.content_part.added", map[string]any{"output_index": 0, "item_id": itemID, "content_index": 0, "part": map[string]any{"annotations": []any{}, "text": "", "type": "output_text"}})
	out, text, ok := w.generate(r, req, e, func(delta string) {
		send("response.output_text.delta", map[string]any{"output_index": 0, "item_id": itemID, "content_index": 0, "delta": delta, "logprobs": []any{}})
	})
	if !ok {
		return
	}
	send("response.output_text.done", map[string]any{"output_index": 0, "item_id": itemID, "content_index": 0, "text": text, "logprobs": []any{}})
	send("response.content_part.done", map[string]any{"output_index": 0, "item_id": itemID, "content_index": 0, "part": map[string]any{"annotations": []any{}, "text": text, "type": "output_text"}})
	send("response.output_item.done", map[string]any{"output_index": 0, "item": outputMessage(req.id, text)})
	var done map[string]any
	_ = json.Unmarshal(finish(text, out), &done)
	send("response.completed", map[string]any{"response": done})
}

func outputMessage(id, text string) map[string]any {
	return map[string]any{"id": "msg_" + id, "content": []any{map[string]any{"annotations": []any{}, "text": text, "type": "output_text", "logprobs": nil}},
		"role": "assistant", "status": "completed", "type": "message"}
}

// generate waits for the request's output, calling delta with each new token's text; ok is
// false when the client left or the engine failed (the answer is then written).
func (w *Worker) generate(r *http.Request, req *simRequest, e *engineCore, delta func(string)) ([]uint32, string, bool) {
	var first time.Time
	sent := 0
	var text strings.Builder
	for {
		if !w.wait(r, req) {
			return nil, "", false
		}
		out, finished, _, err := req.snapshot()
		if first.IsZero() && len(out) > 0 {
			first = time.Now()
			w.observeFirstToken(e, req, first)
		}
		for ; sent < len(out); sent++ {
			t := w.filler.text(sent)
			text.WriteString(t)
			if delta != nil {
				delta(t)
			}
		}
		if finished {
			if err != nil {
				return nil, "", false
			}
			return out, text.String(), true
		}
	}
}

// handleResponseGet serves GET /v1/responses/{id}: the stored object, or vLLM's 404.
func (w *Worker) handleResponseGet(rw http.ResponseWriter, r *http.Request) {
	s, ok := w.stored.get(r.PathValue("id"))
	if !ok {
		writeResponseNotFound(rw, r.PathValue("id"))
		return
	}
	rw.Header().Set("Content-Type", "application/json")
	_, _ = rw.Write(s.object)
}

// handleResponseCancel serves POST /v1/responses/{id}/cancel: 404 when unknown; the simulator
// runs no background responses, so a stored one is synchronous (vLLM's 400).
func (w *Worker) handleResponseCancel(rw http.ResponseWriter, r *http.Request) {
	if _, ok := w.stored.get(r.PathValue("id")); !ok {
		writeResponseNotFound(rw, r.PathValue("id"))
		return
	}
	writeJSON(rw, http.StatusBadRequest, errorBody{Error: errorInfo{
		Message: "Cannot cancel a synchronous response.", Type: "invalid_request_error", Code: 400}})
}

// handleEmbeddings serves POST /v1/embeddings with deterministic unit vectors computed from
// each input's token ids (no model: the same text always gets the same vector).
func (w *Worker) handleEmbeddings(rw http.ResponseWriter, r *http.Request) {
	var b struct {
		Model string          `json:"model"`
		Input json.RawMessage `json:"input"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBodyBytes)).Decode(&b); err != nil {
		writeError(rw, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	var inputs []string
	var one string
	if json.Unmarshal(b.Input, &one) == nil {
		inputs = []string{one}
	} else if json.Unmarshal(b.Input, &inputs) != nil || len(inputs) == 0 {
		writeError(rw, http.StatusBadRequest, "input must be a string or a non-empty list of strings")
		return
	}
	data := make([]any, len(inputs))
	total := 0
	for i, text := range inputs {
		ids, err := w.tok.tokenizeRequest(r.Context(), mustJSON(map[string]any{"prompt": text}))
		if err != nil {
			writeError(rw, http.StatusBadRequest, err.Error())
			return
		}
		total += len(ids)
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": embedVector(ids)}
	}
	model := b.Model
	if model == "" {
		model = w.opts.ServedModelName
	}
	writeJSON(rw, http.StatusOK, map[string]any{"id": "embd-" + w.newID(), "object": "list", "created": w.created,
		"model": model, "data": data, "usage": map[string]int{"prompt_tokens": total, "total_tokens": total}})
}

// embedVector is a 16-dimensional unit vector hashed from token ids.
func embedVector(ids []uint32) []float64 {
	v := make([]float64, 16)
	var h uint64 = 1469598103934665603
	for _, id := range ids {
		h = (h ^ uint64(id)) * 1099511628211
		v[h%16] += float64(int64(h>>20)%2001-1000) / 1000
	}
	n := 0.0
	for _, x := range v {
		n += x * x
	}
	if n > 0 {
		n = math.Sqrt(n)
		for i := range v {
			v[i] /= n
		}
	}
	return v
}
