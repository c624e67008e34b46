package sim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/zeebo/xxh3"
)

// maxBodyBytes bounds a request body (vLLM has no limit; the simulator must stay bounded).
const maxBodyBytes = 32 << 20

func (w *Worker) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(rw http.ResponseWriter, r *http.Request) { w.handleCompletion(rw, r, true) })
	mux.HandleFunc("POST /v1/completions", func(rw http.ResponseWriter, r *http.Request) { w.handleCompletion(rw, r, false) })
	mux.HandleFunc("POST /v1/messages", func(rw http.ResponseWriter, r *http.Request) { w.handleMessages(rw, r, false) })
	mux.HandleFunc("POST /v1/messages/count_tokens", func(rw http.ResponseWriter, r *http.Request) { w.handleMessages(rw, r, true) })
	mux.HandleFunc("GET /v1/models", w.handleModels)
	if w.opts.AllowRuntimeLoRAUpdating {
		mux.HandleFunc("POST /v1/load_lora_adapter", w.handleLoadLoRA)
		mux.HandleFunc("POST /v1/unload_lora_adapter", w.handleUnloadLoRA)
	}
	mux.HandleFunc("POST /v1/responses", w.handleResponses)
	mux.HandleFunc("GET /v1/responses/{id}", w.handleResponseGet)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", w.handleResponseCancel)
	mux.HandleFunc("POST /v1/embeddings", w.handleEmbeddings)
	mux.HandleFunc("GET /health", func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /ping", func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusOK) })
	mux.HandleFunc("POST /reset_prefix_cache", w.handleReset)
	mux.HandleFunc("POST /tokenize", w.handleTokenize)
	mux.HandleFunc("POST /detokenize", w.handleDetokenize)
	mux.HandleFunc("GET /load", func(rw http.ResponseWriter, _ *http.Request) {
		var n int64
		for _, e := range w.engines {
			n += e.inflight.Load()
		}
		writeJSON(rw, http.StatusOK, map[string]int64{"server_load": n})
	})
	mux.HandleFunc("GET /version", func(rw http.ResponseWriter, _ *http.Request) {
		writeJSON(rw, http.StatusOK, map[string]string{"version": version})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(w.metrics.reg, promhttp.HandlerOpts{}))
	if len(w.opts.APIKeys) == 0 {
		return mux
	}
	return requireAPIKey(w.opts.APIKeys, mux)
}

// requireAPIKey answers 401 {"error": "Unauthorized"} to a /v1/* request without
// "Authorization: Bearer KEY" for one of keys, as vLLM's AuthenticationMiddleware does
// (vllm/entrypoints/openai/server_utils.py): OPTIONS and paths outside /v1 pass, and the
// comparison is of SHA-256 digests in constant time.
func requireAPIKey(keys []string, next http.Handler) http.Handler {
	digests := make([][sha256.Size]byte, len(keys))
	for i, k := range keys {
		digests[i] = sha256.Sum256([]byte("Bearer " + k))
	}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodOptions || (r.URL.Path != "/v1" && !strings.HasPrefix(r.URL.Path, "/v1/")) {
			next.ServeHTTP(rw, r)
			return
		}
		got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
		ok := 0
		for i := range digests {
			ok |= subtle.ConstantTimeCompare(got[:], digests[i][:])
		}
		if ok != 1 {
			writeJSON(rw, http.StatusUnauthorized, map[string]string{"error": "Unauthorized"})
			return
		}
		next.ServeHTTP(rw, r)
	})
}

func writeJSON(rw http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encode response","type":"InternalServerError","param":null,"code":500}}`)
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(status)
	_, _ = rw.Write(b)
}

// writeError sends vLLM's error body {"error":{message,type,param,code}}.
func writeError(rw http.ResponseWriter, status int, msg string) {
	typ := map[int]string{400: "BadRequestError", 404: "NotFoundError", 501: "NotImplementedError", 503: "ServiceUnavailableError"}[status]
	if typ == "" {
		typ = "InternalServerError"
	}
	writeJSON(rw, status, errorBody{Error: errorInfo{Message: msg, Type: typ, Code: status}})
}

func (w *Worker) handleModels(rw http.ResponseWriter, _ *http.Request) {
	card := func(id string, parent *string) modelCard {
		return modelCard{ID: id, Object: "model", Created: w.created, OwnedBy: "vllm", Root: w.opts.Model, Parent: parent,
			MaxModelLen: w.opts.MaxModelLen, Permission: []modelPermission{{ID: "modelperm-" + w.newID(), Object: "model_permission",
				Created: w.created, AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*"}}}
	}
	list := modelList{Object: "list", Data: []modelCard{card(w.opts.ServedModelName, nil)}}
	names, paths := w.loras.list()
	for i, name := range names {
		c := card(name, &w.opts.ServedModelName)
		c.Root = paths[i] // vLLM: a LoRA card's root is the adapter's path
		list.Data = append(list.Data, c)
	}
	writeJSON(rw, http.StatusOK, list)
}

func (w *Worker) handleReset(rw http.ResponseWriter, r *http.Request) {
	ok, err := w.ResetPrefixCache(r.Context())
	switch {
	case err != nil:
		writeError(rw, http.StatusServiceUnavailable, err.Error())
	case !ok:
		writeError(rw, http.StatusBadRequest, "Failed to reset prefix cache because some blocks are not freed yet")
	default:
		rw.WriteHeader(http.StatusOK)
	}
}

// newID returns a fresh 32-hex-digit request id.
func (w *Worker) newID() string {
	var b [24]byte
	binary.BigEndian.PutUint64(b[:8], uint64(w.created))
	binary.BigEndian.PutUint64(b[8:16], w.idSalt)
	binary.BigEndian.PutUint64(b[16:], w.idSeq.Add(1))
	h := xxh3.Hash128(b[:])
	return fmt.Sprintf("%016x%016x", h.Hi, h.Lo)
}

// admission is a validated request ready for an engine.
type admission struct {
	body   completionBody
	tokens []uint32
	salt   string
	lora   string
	maxTok int
	usage  bool
	// continuous is stream_options.continuous_usage_stats: usage on every chunk.
	continuous bool
	session    string
	chat       bool
	// priority is the body's priority (0 when absent).
	priority int64
}

// apiError is a client-facing failure: an HTTP status and vLLM's message text.
type apiError struct {
	status int
	msg    string
}

func apiErrorf(status int, format string, args ...any) *apiError {
	return &apiError{status: status, msg: fmt.Sprintf(format, args...)}
}

// parseRequest reads and checks an OpenAI body; prompt, when set, computes the prompt tokens
// in place of tokenizing the body (the Responses endpoint renders its own conversation).
func (w *Worker) parseRequest(r *http.Request, chat bool, prompt func(ctx context.Context, body []byte, salt string) ([]uint32, error)) (*admission, *apiError) {
	raw, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
	if err != nil {
		return nil, apiErrorf(http.StatusBadRequest, "read body: %v", err)
	}
	a := &admission{chat: chat}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&a.body); err != nil {
		return nil, apiErrorf(http.StatusBadRequest, "invalid JSON body: %v", err)
	}
	b := &a.body
	if b.Model != "" && b.Model != w.opts.ServedModelName {
		if _, ok := w.loras.id(b.Model); !ok {
			return nil, apiErrorf(http.StatusNotFound, "The model `%s` does not exist.", b.Model)
		}
		a.lora = b.Model
	}
	if chat && len(b.Messages) == 0 {
		return nil, apiErrorf(http.StatusBadRequest, "Field required: messages")
	}
	if !chat && len(b.Prompt) == 0 {
		return nil, apiErrorf(http.StatusBadRequest, "Field required: prompt")
	}
	if b.StreamOptions != nil && !b.Stream {
		return nil, apiErrorf(http.StatusBadRequest, "Stream options can only be defined when `stream=True`.")
	}
	if chat && !fromMessages(r) && isEmptyJSONArray(b.Tools) {
		// vLLM's chat endpoint refuses it (chat_completion/protocol.py,
		// ChatCompletionRequest.check_tool_usage); its Anthropic path assigns the empty list
		// after validation, so a Messages request with "tools": [] renders tools=[].
		return nil, apiErrorf(http.StatusBadRequest, "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.")
	}
	if len(b.CacheSalt) > 0 && string(b.CacheSalt) != "null" {
		if err := json.Unmarshal(b.CacheSalt, &a.salt); err != nil || a.salt == "" {
			return nil, apiErrorf(http.StatusBadRequest, "Parameter 'cache_salt' must be a non-empty string if provided.")
		}
	}
	if a.priority, err = parsePriority(b.Priority); err != nil {
		return nil, apiErrorf(http.StatusBadRequest, "%v", err)
	}
	if m := b.VLLMXargs.KVCacheReportMode; m != "" && m != "incremental" && m != "full" {
		return nil, apiErrorf(http.StatusBadRequest, "kv_cache_report_mode must be 'incremental' or 'full', got %q", m)
	}
	if b.N != nil && *b.N != 1 {
		return nil, apiErrorf(http.StatusBadRequest, "vllm-sim supports only n=1")
	}
	a.usage = b.Stream && b.StreamOptions != nil && (b.StreamOptions.IncludeUsage == nil || *b.StreamOptions.IncludeUsage)
	a.continuous = a.usage && b.StreamOptions.ContinuousUsageStats
	a.session = r.Header.Get("X-Session-ID")
	if a.session == "" {
		a.session = b.SessionID
	}
	if a.session == "" {
		a.session = b.VLLMXargs.SessionID
	}
	if prompt != nil {
		a.tokens, err = prompt(r.Context(), raw, a.salt)
	} else {
		a.tokens, err = w.tok.tokenizeRequest(r.Context(), raw)
	}
	if err != nil {
		var bad *badRequestError
		if errors.As(err, &bad) {
			return nil, apiErrorf(http.StatusBadRequest, "%s", bad.msg)
		}
		return nil, apiErrorf(http.StatusInternalServerError, "tokenize: %v", err)
	}
	if len(a.tokens) == 0 {
		return nil, apiErrorf(http.StatusBadRequest, "The prompt is empty.")
	}
	p := len(a.tokens)
	limit := b.MaxCompletionTokens
	if limit == nil {
		limit = b.MaxTokens
	}
	// One sequence must fit in the usable KV pool, or it would preempt itself forever.
	capacity := (w.opts.NumGPUBlocks - 1) * w.opts.BlockSize
	switch {
	case limit == nil:
		a.maxTok = min(w.opts.MaxModelLen, capacity) - p
	case *limit < 1:
		return nil, apiErrorf(http.StatusBadRequest, "max_tokens must be at least 1, got %d.", *limit)
	default:
		a.maxTok = *limit
	}
	if p+a.maxTok > w.opts.MaxModelLen || a.maxTok < 1 {
		return nil, apiErrorf(http.StatusBadRequest, "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			w.opts.MaxModelLen, p+a.maxTok, p, a.maxTok)
	}
	if p+a.maxTok > capacity {
		return nil, apiErrorf(http.StatusBadRequest, "This request needs %d tokens of KV cache but the cache holds %d (--num-gpu-blocks %d, --block-size %d).",
			p+a.maxTok, capacity, w.opts.NumGPUBlocks, w.opts.BlockSize)
	}
	return a, nil
}

// naturalLength is the deterministic EOS position of a prompt's filler output.
func (w *Worker) naturalLength(tokens []uint32) int {
	if w.opts.OutputLen <= 0 {
		return 0
	}
	var h uint64 = 14695981039346656037
	for _, t := range tokens {
		h = (h ^ uint64(t)) * 1099511628211
	}
	lo := max(w.opts.OutputLen/2, 1)
	return lo + int(h%uint64(w.opts.OutputLen))
}

func (w *Worker) handleCompletion(rw http.ResponseWriter, r *http.Request, chat bool) {
	if f := w.opts.Faults; f.StallHeadersFor > 0 && w.faultRand.hit(f.StallHeadersRate) {
		w.injected.Add(1)
		t := time.NewTimer(time.Duration(float64(f.StallHeadersFor) / w.opts.Speedup))
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	if w.opts.FailBeforeFirstByte || w.faultRand.hit(w.opts.Faults.FailRate) {
		w.injected.Add(1)
		if s := w.opts.Faults.FailStatus; s != 0 {
			writeError(rw, s, "vllm-sim: injected failure")
			return
		}
		panic(http.ErrAbortHandler) // close the connection without a response
	}
	a, aerr := w.parseRequest(r, chat, nil)
	if aerr != nil {
		writeError(rw, aerr.status, aerr.msg)
		return
	}
	req, e := w.admit(rw, r, a, a.body.IgnoreEOS)
	if req == nil {
		return
	}
	if a.body.Stream {
		w.stream(rw, r, a, req, e)
	} else {
		w.respond(rw, r, a, req, e)
	}
}

// admit queues a parsed request on an engine (the rank X-data-parallel-rank names, else the
// least loaded one). Unless ignoreEOS, it stops at its natural length. An invalid rank or a
// full waiting queue is answered here, and admit returns nil.
func (w *Worker) admit(rw http.ResponseWriter, r *http.Request, a *admission, ignoreEOS bool) (*simRequest, *engineCore) {
	e, err := w.pickEngine(r.Header)
	if err != nil {
		writeError(rw, http.StatusBadRequest, err.Error())
		return nil, nil
	}
	req := newSimRequest(w.newID())
	loraID, _ := w.loras.id(a.lora)
	req.seq = seqState{tokens: a.tokens, salt: a.salt, loraName: a.lora, loraID: loraID}
	req.promptLen = len(a.tokens)
	req.maxTokens = a.maxTok
	if !ignoreEOS {
		req.stopAt = w.naturalLength(a.tokens)
	}
	req.sessionID = a.session
	req.priority = a.priority
	req.reportFull = a.body.VLLMXargs.KVCacheReportMode == "full"
	if !e.enqueue(req) {
		writeError(rw, http.StatusServiceUnavailable, "vllm-sim: waiting queue full")
		return nil, nil
	}
	w.requests.Add(1)
	return req, e
}

// wait blocks until the request has new output or ends; false when the client went away.
func (w *Worker) wait(r *http.Request, req *simRequest) bool {
	select {
	case <-req.notify:
		return true
	case <-r.Context().Done():
		w.abandon(req)
		return false
	}
}

// abandon tells the engine the client is gone (it frees the request's blocks at its next
// step, as vLLM aborts a request on disconnect) and counts the cancel once.
func (w *Worker) abandon(req *simRequest) {
	if req.cancelled.CompareAndSwap(false, true) {
		w.cancelled.Add(1)
	}
}

func (w *Worker) usageOf(a *admission, req *simRequest, completion int) *usageInfo {
	u := &usageInfo{PromptTokens: len(a.tokens), CompletionTokens: completion, TotalTokens: len(a.tokens) + completion}
	if !w.opts.HidePromptTokensDetails && req.cached > 0 {
		u.PromptTokensDetails = &promptTokensDetails{CachedTokens: req.cached}
	}
	return u
}

// observeFirstToken records TTFT and the prompt tokens when the first token reaches the
// frontend, as vLLM does (vllm/v1/metrics/stats.py: TTFT at the iteration that produced the
// first token, prompt tokens when the prefill completed), not when the request finishes.
func (w *Worker) observeFirstToken(e *engineCore, req *simRequest, first time.Time) {
	labels := []string{w.opts.ServedModelName, e.label()}
	w.metrics.ttft.WithLabelValues(labels...).Observe(first.Sub(req.arrival).Seconds())
	w.metrics.promptTokens.WithLabelValues(labels...).Add(float64(req.promptLen))
}

// observe records the end-to-end latency of a finished request.
func (w *Worker) observe(e *engineCore, req *simRequest) {
	w.metrics.e2e.WithLabelValues(w.opts.ServedModelName, e.label()).Observe(time.Since(req.arrival).Seconds())
}

func (w *Worker) respond(rw http.ResponseWriter, r *http.Request, a *admission, req *simRequest, e *engineCore) {
	var first time.Time
	for {
		if !w.wait(r, req) {
			return
		}
		out, finished, finish, err := req.snapshot()
		if first.IsZero() && len(out) > 0 {
			first = time.Now()
			w.observeFirstToken(e, req, first)
		}
		if !finished {
			continue
		}
		if errors.Is(err, errEngineRestarted) {
			// vLLM's launcher answers EngineDeadError with a bare 500 (no body).
			rw.WriteHeader(http.StatusInternalServerError)
			return
		}
		if err != nil {
			writeError(rw, http.StatusInternalServerError, err.Error())
			return
		}
		var text strings.Builder
		for i := range out {
			text.WriteString(w.filler.text(i))
		}
		resp := completionResponse{Created: time.Now().Unix(), Model: a.body.Model, Usage: *w.usageOf(a, req, len(out))}
		if resp.Model == "" {
			resp.Model = w.opts.ServedModelName
		}
		if a.chat {
			resp.ID, resp.Object = "chatcmpl-"+req.id, "chat.completion"
			resp.Choices = []chatChoice{{Message: chatMessage{Role: "assistant", Content: text.String(), ToolCalls: []any{}}, FinishReason: finish}}
		} else {
			resp.ID, resp.Object = "cmpl-"+req.id, "text_completion"
			resp.Choices = []textChoice{{Text: text.String(), FinishReason: finish}}
		}
		w.observe(e, req)
		w.completed.Add(1)
		writeJSON(rw, http.StatusOK, resp)
		return
	}
}

func (w *Worker) stream(rw http.ResponseWriter, r *http.Request, a *admission, req *simRequest, e *engineCore) {
	model := a.body.Model
	if model == "" {
		model = w.opts.ServedModelName
	}
	chunk := streamChunk{Created: time.Now().Unix(), Model: model}
	if a.chat {
		chunk.ID, chunk.Object = "chatcmpl-"+req.id, "chat.completion.chunk"
	} else {
		chunk.ID, chunk.Object = "cmpl-"+req.id, "text_completion"
	}
	flusher, _ := rw.(http.Flusher)
	var buf bytes.Buffer
	send := func(v any) bool {
		buf.Reset()
		buf.WriteString("data: ")
		if s, ok := v.(string); ok {
			buf.WriteString(s)
		} else {
			b, _ := json.Marshal(v)
			buf.Write(b)
		}
		buf.WriteString("\n\n")
		if _, err := rw.Write(buf.Bytes()); err != nil {
			return false
		}
		return true
	}
	started := false
	sent := 0
	var first time.Time
	for {
		if !w.wait(r, req) {
			return
		}
		out, finished, finish, err := req.snapshot()
		if !started {
			if errors.Is(err, errEngineRestarted) {
				// vLLM's launcher answers EngineDeadError with a bare 500 (no body).
				rw.WriteHeader(http.StatusInternalServerError)
				return
			}
			if err != nil {
				writeError(rw, http.StatusInternalServerError, err.Error())
				return
			}
			if len(out) == 0 && !finished {
				continue
			}
			started, first = true, time.Now()
			if len(out) > 0 {
				w.observeFirstToken(e, req, first)
			}
			h := rw.Header()
			h.Set("Content-Type", "text/event-stream; charset=utf-8")
			h.Set("Cache-Control", "no-cache")
			rw.WriteHeader(http.StatusOK)
			if a.chat {
				c := chunk
				c.Choices = []chatChunkChoice{{Delta: chatDelta{Role: "assistant"}}}
				if a.continuous {
					c.Usage = w.usageOf(a, req, 0)
				}
				if !send(c) {
					w.abandon(req)
					return
				}
			}
		}
		for sent < len(out) {
			if w.opts.DieMidStreamAfter > 0 && sent >= w.opts.DieMidStreamAfter {
				req.cancelled.Store(true)
				w.diedMidStream.Add(1)
				if flusher != nil {
					flusher.Flush()
				}
				panic(http.ErrAbortHandler) // drop the connection mid-stream, like a crash
			}
			c := chunk
			var fr *string
			var stop *stopField
			if finished && sent == len(out)-1 {
				fr, stop = &finish, &stopField{}
			}
			if a.chat {
				c.Choices = []chatChunkChoice{{Delta: chatDelta{Content: w.filler.text(sent)}, FinishReason: fr, StopReason: stop}}
			} else {
				c.Choices = []textChunkChoice{{Text: w.filler.text(sent), FinishReason: fr, StopReason: stop}}
			}
			if a.continuous {
				c.Usage = w.usageOf(a, req, sent+1)
			}
			if !send(c) {
				w.abandon(req)
				return
			}
			sent++
		}
		if finished {
			if err != nil {
				send(`{"error": {"message": "` + jsonEscape(err.Error()) + `", "type": "InternalServerError", "param": null, "code": 500}}`)
			} else if a.usage {
				c := chunk
				c.Choices = []any{}
				c.Usage = w.usageOf(a, req, len(out))
				send(c)
			}
			send("[DONE]")
			if flusher != nil {
				flusher.Flush()
			}
			if err == nil {
				w.observe(e, req)
				w.completed.Add(1)
			}
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
}

// jsonEscape escapes s for a JSON string body (without the quotes).
func jsonEscape(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}

// messagesKey marks a request context as a Messages request converted to chat.
type messagesKey struct{}

// fromMessages reports whether r is a Messages request converted to chat (handleMessages).
func fromMessages(r *http.Request) bool { return r.Context().Value(messagesKey{}) != nil }

// isEmptyJSONArray reports whether raw is the JSON array [] (whitespace allowed).
func isEmptyJSONArray(raw json.RawMessage) bool {
	var v []json.RawMessage
	return len(raw) > 0 && raw[0] == '[' && json.Unmarshal(raw, &v) == nil && len(v) == 0
}

// parsePriority reads a body's priority field (vLLM's PriorityRequestMixin and its
// Responses counterpart, vllm/entrypoints/openai/engine/protocol.py: an integer within
// int64, default 0). vLLM reads it under either policy; under fcfs it is accepted and has no
// effect (vLLM v1 keeps no check against the policy: the error the field's description
// promises lived in the removed v0 engine).
func parsePriority(raw json.RawMessage) (int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		if p, err := n.Int64(); err == nil {
			return p, nil
		}
		// pydantic's lax int also takes a float with no fractional part (3.0)
		if f, err := n.Float64(); err == nil && f == math.Trunc(f) && f >= math.MinInt64 && f < math.MaxInt64 {
			return int64(f), nil
		}
	}
	return 0, fmt.Errorf("priority: Input should be a valid integer within int64, got %s", raw)
}
