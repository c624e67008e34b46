package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is how root sessions are started.
type Mode string

// Replay modes.
const (
	// ModeFixed starts sessions at their trace timestamps (aiperf --fixed-schedule).
	ModeFixed Mode = "fixed"
	// ModeConcurrency keeps N session trees in flight, starting the next when one finishes.
	ModeConcurrency Mode = "concurrency"
	// ModeRate starts sessions at a constant rate per second.
	ModeRate Mode = "rate"
)

// Session header styles (aiperf's opt-in session routing headers; aiperf
// src/aiperf/endpoints/openai_chat.py).
const (
	HeadersNone   = "none"   // X-Correlation-ID only (aiperf's default)
	HeadersPlain  = "plain"  // + X-Session-ID, X-Parent-Session-ID
	HeadersDynamo = "dynamo" // + X-Dynamo-Session-ID, X-Dynamo-Parent-Session-ID
	HeadersBoth   = "both"   // plain and dynamo
)

// ReplayOptions configure a replay.
type ReplayOptions struct {
	URL string // base URL of the OpenAI server, e.g. http://127.0.0.1:8000
	// API is the request format (default APIChat).
	API         API
	Model       string // model to send; "" = the first id of GET /v1/models
	Mode        Mode
	Concurrency int     // ModeConcurrency lanes
	RequestRate float64 // ModeRate sessions per second
	// TimeScale multiplies every trace time (timestamps, delays, spawn offsets): 0.1 replays ten
	// times faster. 0 means 1.
	TimeScale float64
	// MaxRequests caps the number of requests sent (0 = the whole trace).
	MaxRequests int
	// MaxOutputTokens caps max_completion_tokens (0 = as recorded).
	MaxOutputTokens int
	SessionHeaders  string
	// NvextSession adds aiperf's dynamo_nvext session control to the body:
	// nvext.session_control {session_id, action "bind", timeout 300} on every turn but the last,
	// {session_id, action "close"} on the last.
	NvextSession bool
	IgnoreEOS    bool
	Timeout      time.Duration // per request; 0 = none
	// MaxSessions bounds the session trees in flight in fixed and rate modes (default 1024).
	MaxSessions int
	APIKey      string
	Headers     http.Header
	Client      *http.Client // nil = a pooled client with keep-alive
	Logger      *slog.Logger
	// OnRecord is called after every request (progress display); it must be fast.
	OnRecord func(r *Record)
	// CapacityBlocks is the fleet's whole GPU cache in the trace's blocks (kvbench
	// --capacity-tokens divided by the trace's block size). When
	// set, each record also gets the hit a pooled LRU cache of that size would have had
	// (Record.CapacityHit): the capacity reference next to the unlimited theoretical hit.
	CapacityBlocks int
}

// Result is a finished replay.
type Result struct {
	Records  []Record
	Start    time.Time
	Duration time.Duration
	Resets   int // weka turns whose prefix cut into earlier segments
}

type runner struct {
	opts   ReplayOptions
	synth  *Synth
	snd    *sender
	t0     time.Time
	budget atomic.Int64

	mu      sync.Mutex
	records []Record
	resets  int
	// seen counts, per namespace and hash_id, the requests sent with that block and not failed
	// before any content (theoretical prefix hit).
	seen   map[string]map[int64]int
	pooled *pooledLRU // nil without ReplayOptions.CapacityBlocks
	// accesses are the requests' blocks in the order the pooled LRU saw them, for the
	// clairvoyant reference computed when the run ends (beladyHits); nil without a capacity.
	accesses []access
}

// Replay sends the trace's requests to the endpoint and records their timings.
func Replay(ctx context.Context, tr *Trace, synth *Synth, opts ReplayOptions) (*Result, error) {
	if opts.TimeScale <= 0 {
		opts.TimeScale = 1
	}
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = 1024
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	switch opts.SessionHeaders {
	case "":
		opts.SessionHeaders = HeadersNone
	case HeadersNone, HeadersPlain, HeadersDynamo, HeadersBoth:
	default:
		return nil, fmt.Errorf("unknown session header style %q (want none, plain, dynamo or both)", opts.SessionHeaders)
	}
	api, err := ParseAPI(string(opts.API))
	if err != nil {
		return nil, err
	}
	opts.API = api
	client := opts.Client
	if client == nil {
		tp := http.DefaultTransport.(*http.Transport).Clone()
		tp.MaxIdleConnsPerHost = 256
		client = &http.Client{Transport: tp}
	}
	base := strings.TrimRight(opts.URL, "/")
	if opts.Model == "" {
		m, err := firstModel(ctx, client, base, opts.APIKey)
		if err != nil {
			return nil, err
		}
		opts.Model = m
	}
	r := &runner{opts: opts, synth: synth, seen: map[string]map[int64]int{},
		snd: &sender{client: client, url: base + api.path(), api: api, apiKey: opts.APIKey, headers: opts.Headers}}
	if opts.CapacityBlocks > 0 {
		r.pooled = newPooledLRU(opts.CapacityBlocks)
	}
	limit := int64(tr.RequestCount())
	if opts.MaxRequests > 0 {
		limit = min(limit, int64(opts.MaxRequests))
	}
	r.budget.Store(limit)
	r.t0 = time.Now()
	switch opts.Mode {
	case ModeFixed, "":
		err = r.dispatch(ctx, tr.Sessions, func(i int, s *Session) time.Duration { return r.scale(s.Start) })
	case ModeRate:
		if opts.RequestRate <= 0 {
			return nil, fmt.Errorf("request-rate mode needs a rate > 0")
		}
		err = r.dispatch(ctx, tr.Sessions, func(i int, _ *Session) time.Duration {
			return time.Duration(float64(i) / opts.RequestRate * float64(time.Second))
		})
	case ModeConcurrency:
		if opts.Concurrency <= 0 {
			return nil, fmt.Errorf("concurrency mode needs concurrency > 0")
		}
		r.lanes(ctx, tr.Sessions, opts.Concurrency)
	default:
		return nil, fmt.Errorf("unknown replay mode %q", opts.Mode)
	}
	r.optimal()
	res := &Result{Records: r.records, Start: r.t0, Duration: time.Since(r.t0), Resets: r.resets}
	sort.Slice(res.Records, func(i, j int) bool { return res.Records[i].StartOffset < res.Records[j].StartOffset })
	return res, err
}

func (r *runner) scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * r.opts.TimeScale)
}

// dispatch starts root sessions at the offsets at() gives, at most MaxSessions at once.
func (r *runner) dispatch(ctx context.Context, roots []*Session, at func(int, *Session) time.Duration) error {
	order := make([]int, len(roots))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return at(order[a], roots[order[a]]) < at(order[b], roots[order[b]]) })
	slots := make(chan struct{}, r.opts.MaxSessions)
	var wg sync.WaitGroup
	defer wg.Wait()
	for n, i := range order {
		if r.budget.Load() <= 0 {
			break
		}
		if !sleepUntil(ctx, r.t0.Add(at(n, roots[i]))) {
			return ctx.Err()
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		wg.Add(1)
		go func(s *Session) {
			defer wg.Done()
			defer func() { <-slots }()
			r.runSession(ctx, s, "")
		}(roots[i])
	}
	return nil
}

// lanes runs n workers that each replay one session tree after another.
func (r *runner) lanes(ctx context.Context, roots []*Session, n int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, len(roots)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(roots) || r.budget.Load() <= 0 || ctx.Err() != nil {
					return
				}
				r.runSession(ctx, roots[i], "")
			}
		}()
	}
	wg.Wait()
}

// runSession replays one session turn by turn, launching and joining its subagent children.
func (r *runner) runSession(ctx context.Context, s *Session, parentCorr string) {
	corr := newUUID()
	conv := newConversation(s, r.synth)
	joins := map[int][]chan struct{}{}
	spawns := map[int][]*Session{}
	done := map[*Session]chan struct{}{}
	for _, c := range s.Children {
		ch := make(chan struct{})
		done[c] = ch
		if c.JoinBefore >= 0 {
			joins[c.JoinBefore] = append(joins[c.JoinBefore], ch)
		}
		spawns[c.SpawnAfter] = append(spawns[c.SpawnAfter], c)
	}
	var children sync.WaitGroup
	defer children.Wait()
	for k := range s.Turns {
		t := &s.Turns[k]
		if k > 0 {
			wait := r.scale(t.Delay)
			if t.HasTimestamp && (r.opts.Mode == ModeFixed || r.opts.Mode == "") {
				wait = time.Until(r.t0.Add(r.scale(t.Timestamp)))
			}
			if !sleepUntil(ctx, time.Now().Add(wait)) {
				return
			}
		}
		for _, ch := range joins[k] {
			select {
			case <-ch:
			case <-ctx.Done():
				return
			}
		}
		if r.budget.Add(-1) < 0 {
			return
		}
		msgs := conv.messages(k)
		rec := r.send(ctx, s, k, corr, parentCorr, msgs)
		conv.record(k, msgs, rec.reply)
		for _, c := range spawns[k] {
			children.Add(1)
			go func(c *Session, ch chan struct{}) {
				defer children.Done()
				defer close(ch)
				if sleepUntil(ctx, time.Now().Add(r.scale(c.SpawnDelay))) {
					r.runSession(ctx, c, corr)
				}
			}(c, done[c])
		}
		if ctx.Err() != nil {
			return
		}
	}
	r.mu.Lock()
	r.resets += conv.resets
	r.mu.Unlock()
}

// send builds and posts one request and stores its record.
func (r *runner) send(ctx context.Context, s *Session, k int, corr, parentCorr string, msgs []Message) Record {
	t := &s.Turns[k]
	out := t.OutputTokens
	if out <= 0 && r.opts.API == APIMessages {
		out = defaultMaxTokens // required there
	}
	if out > 0 && r.opts.MaxOutputTokens > 0 {
		out = min(out, r.opts.MaxOutputTokens)
	}
	body := r.opts.API.body(r.opts.Model, msgs, out)
	if r.opts.IgnoreEOS {
		body["ignore_eos"] = true
	}
	if r.opts.NvextSession {
		ctl := map[string]any{"session_id": corr, "action": "bind", "timeout": 300}
		if k == len(s.Turns)-1 {
			ctl = map[string]any{"session_id": corr, "action": "close"}
		}
		body["nvext"] = map[string]any{"session_control": ctl}
	}
	for k, v := range t.Extra {
		body[k] = v // per-row extra wins (aiperf)
	}
	raw, err := json.Marshal(body)
	rec := Record{RequestID: newUUID(), CorrelationID: corr, ParentCorrID: parentCorr, ConversationID: s.ID, TurnIndex: k}
	var added []int64
	rec.TheoreticalHit, rec.TraceBlocks, rec.CapacityHit, added, rec.access = r.theoretical(s, t)
	hdr := http.Header{}
	hdr.Set("X-Request-ID", rec.RequestID)
	hdr.Set("X-Correlation-ID", corr)
	style := r.opts.SessionHeaders
	if style == HeadersPlain || style == HeadersBoth {
		hdr.Set("X-Session-ID", corr)
		if parentCorr != "" {
			hdr.Set("X-Parent-Session-ID", parentCorr)
		}
	}
	if style == HeadersDynamo || style == HeadersBoth {
		hdr.Set("X-Dynamo-Session-ID", corr)
		if parentCorr != "" {
			hdr.Set("X-Dynamo-Parent-Session-ID", parentCorr)
		}
	}
	rec.StartOffset = time.Since(r.t0)
	if err != nil {
		rec.fail(ErrBadResponse, fmt.Sprintf("encode body: %v", err))
	} else {
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if r.opts.Timeout > 0 {
			rctx, cancel = context.WithTimeout(ctx, r.opts.Timeout)
		}
		r.snd.send(rctx, raw, hdr, &rec)
		cancel()
		if !rec.OK() && rec.Latency == 0 {
			// A failed request's latency is the time to its failure (a 429 or 503, a timeout):
			// how long it waited for an answer (Summary.OldestRequestAgeMS).
			rec.Latency = time.Since(r.t0) - rec.StartOffset
		}
	}
	if !rec.OK() && rec.Chunks == 0 {
		r.unsee(s, t, added, rec.access)
	}
	if !rec.OK() {
		r.opts.Logger.Debug("request failed", "session", s.ID, "turn", k, "kind", rec.ErrorKind, "error", rec.Error)
	}
	stored := rec
	stored.reply = ""
	r.mu.Lock()
	r.records = append(r.records, stored)
	r.mu.Unlock()
	if r.opts.OnRecord != nil {
		r.opts.OnRecord(&stored)
	}
	return rec
}

// theoretical counts the request's leading blocks already seen in its namespace (aiperf's
// "Theoretical Prefix Cache Hit") and, with a capacity, those the pooled LRU still holds;
// incremental sessions are not counted (their hash_ids are deltas). added are the blocks the
// request brought into the pooled LRU (unsee takes them out again); acc is 1 + the request's
// index in runner.accesses (0: none).
func (r *runner) theoretical(s *Session, t *Turn) (hit, total, capacityHit int, added []int64, acc int) {
	if s.Mode == ContextDeltas || len(t.HashIDs) == 0 {
		return 0, 0, 0, nil, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pooled != nil {
		capacityHit, added = r.pooled.touch(s.Namespace, t.HashIDs)
		r.accesses = append(r.accesses, access{ns: s.Namespace, ids: t.HashIDs})
		acc = len(r.accesses)
	}
	seen := r.seen[s.Namespace]
	if seen == nil {
		seen = map[int64]int{}
		r.seen[s.Namespace] = seen
	}
	for hit < len(t.HashIDs) && seen[t.HashIDs[hit]] > 0 {
		hit++
	}
	for _, id := range t.HashIDs {
		seen[id]++
	}
	return hit, len(t.HashIDs), capacityHit, added, acc
}

// unsee takes back what theoretical counted for a request that failed before any content (a
// gateway's 429 or 503, a refused connection, a timeout before the first token): no worker
// finished its prefill, so its blocks are no cached prefix for the requests after it.
func (r *runner) unsee(s *Session, t *Turn, added []int64, acc int) {
	if s.Mode == ContextDeltas || len(t.HashIDs) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := r.seen[s.Namespace]
	for _, id := range t.HashIDs {
		if seen[id]--; seen[id] <= 0 {
			delete(seen, id)
		}
	}
	if r.pooled != nil {
		r.pooled.forget(s.Namespace, added)
	}
	if acc > 0 {
		r.accesses[acc-1].dropped = true
	}
}

// optimal fills each record's OptimalHit once every request has ended: the clairvoyant
// reference needs the whole order of requests.
func (r *runner) optimal() {
	if r.pooled == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	hits := beladyHits(r.accesses, r.pooled.capacity)
	for i := range r.records {
		if a := r.records[i].access; a > 0 {
			r.records[i].OptimalHit = hits[a-1]
		}
	}
}

// sleepUntil waits for the deadline; false if ctx ended first.
func sleepUntil(ctx context.Context, deadline time.Time) bool {
	d := time.Until(deadline)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// firstModel asks GET /v1/models for the served model when --model is not given, with the
// API key the requests use (a gateway with auth.api_keys wants it there too).
func firstModel(ctx context.Context, c *http.Client, base, apiKey string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return "", fmt.Errorf("list models: %w", err)
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("list models: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("list models: status %d (set OPENAI_API_KEY if the server wants a key)", resp.StatusCode)
	}
	var out struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", fmt.Errorf("list models: %w", err)
	}
	if len(out.Data) == 0 {
		return "", errors.New("list models: the server lists no model; pass --model")
	}
	return out.Data[0].ID, nil
}
