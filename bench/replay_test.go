package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// scriptedServer is an OpenAI-style SSE server with known timings: it waits ttft before the
// first content chunk, then sends the remaining chunks gap apart, then a usage chunk.
type scriptedServer struct {
	ttft, gap time.Duration
	chunks    int
	mu        sync.Mutex
	bodies    []map[string]any
	headers   []http.Header
	// overrun is the most the server's own sleeps overran their script (a loaded CPU wakes
	// them late), by measure: first token, last token, mean gap. A client's timings cannot be
	// under the script, and are over it by no more than this plus the test's slack.
	overrun struct{ ttft, latency, gap time.Duration }
}

func (s *scriptedServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	s.mu.Lock()
	s.bodies = append(s.bodies, body)
	s.headers = append(s.headers, r.Header.Clone())
	n := len(s.bodies)
	s.mu.Unlock()
	msgs, _ := body["messages"].([]any)
	last, _ := msgs[len(msgs)-1].(map[string]any)
	content, _ := last["content"].(string)
	w.Header().Set(WorkerHeader, fmt.Sprintf("http://w%d", n%2))
	switch {
	case strings.Contains(content, "FAIL503"):
		http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
		return
	case strings.Contains(content, "OVERFLOW"):
		http.Error(w, `{"error":{"message":"This model's maximum context length is 10 tokens"}}`, http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	fl := w.(http.Flusher)
	start := time.Now()
	time.Sleep(s.ttft)
	var first time.Time
	for i := range s.chunks {
		if i > 0 {
			time.Sleep(s.gap)
		}
		if i == 2 && strings.Contains(content, "MIDSTREAM") {
			fmt.Fprintf(w, "data: {\"error\":{\"message\":\"worker died\",\"code\":502}}\n\n")
			fl.Flush()
			return
		}
		fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"}}]}\n\n", i)
		fl.Flush()
		if i == 0 {
			first = time.Now()
		}
	}
	s.noteOverrun(first.Sub(start), time.Since(start))
	fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":40}}}\n\n", s.chunks)
	fmt.Fprint(w, "data: [DONE]\n\n")
	fl.Flush()
}

// noteOverrun records a streamed response's first- and last-token times, as the server saw
// them, against its script.
func (s *scriptedServer) noteOverrun(ttft, latency time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := &s.overrun
	o.ttft = max(o.ttft, ttft-s.ttft)
	script := s.ttft + time.Duration(s.chunks-1)*s.gap
	o.latency = max(o.latency, latency-script)
	if s.chunks > 1 {
		o.gap = max(o.gap, (latency-ttft)/time.Duration(s.chunks-1)-s.gap)
	}
}

// overrunMs is the server's overruns in milliseconds: first token, last token, mean gap.
func (s *scriptedServer) overrunMs() (ttft, latency, gap float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ms(s.overrun.ttft), ms(s.overrun.latency), ms(s.overrun.gap)
}

func within(t *testing.T, what string, got, want float64, slack float64) {
	t.Helper()
	if got < want-1 || got > want+slack {
		t.Errorf("%s = %.1f, want %.1f (+%.0f slack)", what, got, want, slack)
	}
}

// TestReplayMetrics replays a small session tree against a scripted SSE server with known timings
// and checks the metrics, headers and bodies (aiperf's request shape,
// src/aiperf/endpoints/openai_chat.py, and its metric names).
func TestReplayMetrics(t *testing.T) {
	srv := &scriptedServer{ttft: 60 * time.Millisecond, gap: 15 * time.Millisecond, chunks: 5}
	ts := httptest.NewServer(srv)
	defer ts.Close()

	child := &Session{ID: "root::sa:a", ParentID: "root", Mode: ContextDeltas, SpawnAfter: 0, JoinBefore: 1,
		Turns: []Turn{{Text: "child question", OutputTokens: 3}}}
	root := &Session{ID: "root", Mode: ContextDeltas, JoinBefore: -1, Children: []*Session{child},
		Turns: []Turn{{Text: "first", OutputTokens: 5}, {Text: "second", OutputTokens: 5, Delay: 200 * time.Millisecond}}}
	failing := &Session{ID: "bad", Mode: ContextStandalone, JoinBefore: -1, Start: 400 * time.Millisecond, Turns: []Turn{
		{Text: "FAIL503"}, {Text: "OVERFLOW"}, {Text: "MIDSTREAM"}, {InputTokens: 20, HashIDs: []int64{1}, Extra: map[string]any{"temperature": 0.5}}}}
	tr := &Trace{Format: FormatMultiTurn, BlockSize: 16, Sessions: []*Session{root, failing}}
	synth, _ := NewSynth(nil, 16)

	var progress atomic.Int64 // OnRecord runs on the sessions' goroutines
	res, err := Replay(context.Background(), tr, synth, ReplayOptions{URL: ts.URL, Model: "m", TimeScale: 0.5,
		SessionHeaders: HeadersBoth, IgnoreEOS: true, OnRecord: func(*Record) { progress.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 7 || progress.Load() != 7 {
		t.Fatalf("%d records, %d progress calls, want 7", len(res.Records), progress.Load())
	}
	sum := Summarize("test", InputConfig{}, res)
	if sum.RequestCount != 4 || sum.ErrorCount != 3 {
		t.Errorf("ok %d errors %d, want 4 and 3", sum.RequestCount, sum.ErrorCount)
	}
	for kind, n := range map[string]int{"http_503": 1, ErrContextOverflow: 1, ErrStream: 1} {
		if sum.ErrorSummary[kind] != n {
			t.Errorf("error_summary[%s] = %d, want %d (%v)", kind, sum.ErrorSummary[kind], n, sum.ErrorSummary)
		}
	}
	// Known timings: TTFT 60 ms; latency 60 + 4*15 = 120 ms; ITL (120-60)/(5-1) = 15 ms; the
	// slack above them grows by what the server's own sleeps overran (a loaded CPU).
	oTTFT, oLat, oGap := srv.overrunMs()
	t.Logf("server overruns: first token %.1f ms, last token %.1f ms, gap %.1f ms", oTTFT, oLat, oGap)
	within(t, "TTFT p50", sum.TimeToFirstToken.P50, 60, 25+oTTFT)
	within(t, "TTFT min", sum.TimeToFirstToken.Min, 60, 25+oTTFT)
	within(t, "latency p50", sum.RequestLatency.P50, 120, 35+oLat)
	within(t, "ITL avg", sum.InterTokenLatency.Avg, 15, 8+oGap)
	if sum.CachedTokenRatio != 0.4 || sum.TotalUsagePromptTokens != 400 {
		t.Errorf("cached ratio %v over %d prompt tokens, want 0.4 over 400", sum.CachedTokenRatio, sum.TotalUsagePromptTokens)
	}
	if sum.WorkerDistribution["http://w0"]+sum.WorkerDistribution["http://w1"] != 7 {
		t.Errorf("worker distribution %v", sum.WorkerDistribution)
	}
	if sum.OutputSequenceLength.Avg != 5 || sum.RequestThroughput.Avg <= 0 || sum.OutputTokenThroughput.Avg <= 0 {
		t.Errorf("osl %v req/s %v tok/s %v", sum.OutputSequenceLength.Avg, sum.RequestThroughput.Avg, sum.OutputTokenThroughput.Avg)
	}

	byTurn := map[string]*Record{}
	for i := range res.Records {
		r := &res.Records[i]
		byTurn[fmt.Sprintf("%s/%d", r.ConversationID, r.TurnIndex)] = r
	}
	r0, r1, c0 := byTurn["root/0"], byTurn["root/1"], byTurn["root::sa:a/0"]
	// The child starts when turn 0 completes; turn 1 waits for the child (join) and for its
	// delay (200 ms * 0.5): it starts >= 100 ms after turn 0 ends and after the child ends.
	if c0.StartOffset < r0.StartOffset+r0.Latency {
		t.Errorf("child started at %v before its spawn turn ended at %v", c0.StartOffset, r0.StartOffset+r0.Latency)
	}
	if r1.StartOffset < r0.StartOffset+r0.Latency+100*time.Millisecond || r1.StartOffset < c0.StartOffset+c0.Latency {
		t.Errorf("turn 1 at %v: must wait for delay after %v and the child's end %v", r1.StartOffset, r0.StartOffset+r0.Latency, c0.StartOffset+c0.Latency)
	}
	within(t, "failing session start (ms)", ms(byTurn["bad/0"].StartOffset), 200, 40)

	// Headers: one correlation id per session replay, a fresh request id per request, the
	// parent's id on the child, both header styles.
	srv.mu.Lock()
	defer srv.mu.Unlock()
	reqIDs := map[string]bool{}
	corrOf := map[string]string{}
	for i, h := range srv.headers {
		reqIDs[h.Get("X-Request-ID")] = true
		content := lastContent(srv.bodies[i])
		corrOf[content] = h.Get("X-Correlation-ID")
		if h.Get("X-Session-ID") != h.Get("X-Correlation-ID") || h.Get("X-Dynamo-Session-ID") != h.Get("X-Correlation-ID") {
			t.Errorf("session headers %v", h)
		}
		if content == "child question" {
			if h.Get("X-Parent-Session-ID") == "" || h.Get("X-Dynamo-Parent-Session-ID") != h.Get("X-Parent-Session-ID") {
				t.Errorf("child without parent headers: %v", h)
			}
		} else if h.Get("X-Parent-Session-ID") != "" {
			t.Errorf("root request %q has a parent header", content)
		}
		b := srv.bodies[i]
		so, _ := b["stream_options"].(map[string]any)
		if b["stream"] != true || so["include_usage"] != true || b["ignore_eos"] != true || b["model"] != "m" {
			t.Errorf("body %v", b)
		}
	}
	if len(reqIDs) != 7 {
		t.Errorf("%d distinct X-Request-ID for 7 requests", len(reqIDs))
	}
	if corrOf["first"] != corrOf["second"] || corrOf["first"] == corrOf["child question"] || corrOf["first"] == corrOf["FAIL503"] {
		t.Errorf("correlation ids %v", corrOf)
	}
	for i, b := range srv.bodies {
		switch lastContent(b) {
		case "second":
			if msgs := b["messages"].([]any); len(msgs) != 3 || msgs[1].(map[string]any)["content"] != "t0 t1 t2 t3 t4 " {
				t.Errorf("second turn must carry the live reply: %v", msgs)
			}
			if b["max_completion_tokens"] != 5.0 {
				t.Errorf("max_completion_tokens = %v", b["max_completion_tokens"])
			}
		case "FAIL503":
			if _, ok := b["max_completion_tokens"]; ok {
				t.Error("no output length recorded: max_completion_tokens must be left out")
			}
		default:
			if b["temperature"] == 0.5 && len(strings.Fields(lastContent(b))) != 20 {
				t.Errorf("request %d: synthetic prompt of %d tokens, want 20", i, len(strings.Fields(lastContent(b))))
			}
		}
	}
}

func lastContent(b map[string]any) string {
	msgs, _ := b["messages"].([]any)
	if len(msgs) == 0 {
		return ""
	}
	m, _ := msgs[len(msgs)-1].(map[string]any)
	s, _ := m["content"].(string)
	return s
}

func TestReplayCapAndModes(t *testing.T) {
	srv := &scriptedServer{ttft: 5 * time.Millisecond, gap: time.Millisecond, chunks: 2}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	var sessions []*Session
	for i := range 10 {
		sessions = append(sessions, &Session{ID: fmt.Sprint(i), Mode: ContextStandalone, JoinBefore: -1,
			Start: time.Duration(i) * time.Hour, Turns: []Turn{{Text: "x"}, {Text: "y"}}})
	}
	tr := &Trace{Sessions: sessions}
	synth, _ := NewSynth(nil, 16)
	cases := []struct {
		name string
		opts ReplayOptions
		want int
	}{
		{"concurrency capped", ReplayOptions{Mode: ModeConcurrency, Concurrency: 3, MaxRequests: 7}, 7},
		{"rate", ReplayOptions{Mode: ModeRate, RequestRate: 200}, 20},
		{"fixed scaled", ReplayOptions{Mode: ModeFixed, TimeScale: 1e-5, MaxRequests: 5}, 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.opts.URL, c.opts.Model = ts.URL, "m"
			res, err := Replay(context.Background(), tr, synth, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Records) != c.want {
				t.Errorf("%d requests, want %d", len(res.Records), c.want)
			}
		})
	}
}

func TestReplayModelDiscoveryAndBadServer(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"object":"list","data":[{"id":"served-model","object":"model"}]}`)
	})
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"object":"chat.completion"}`)
	})
	ts := httptest.NewServer(mux)
	defer ts.Close()
	synth, _ := NewSynth(nil, 16)
	tr := &Trace{Sessions: []*Session{{ID: "a", JoinBefore: -1, Turns: []Turn{{Text: "x"}}}}}
	res, err := Replay(context.Background(), tr, synth, ReplayOptions{URL: ts.URL})
	if err != nil {
		t.Fatal(err)
	}
	if res.Records[0].ErrorKind != ErrBadResponse {
		t.Errorf("a non-SSE answer must be a bad_response error, got %q", res.Records[0].ErrorKind)
	}
	ts.Close()
	res, err = Replay(context.Background(), tr, synth, ReplayOptions{URL: ts.URL, Model: "m"})
	if err != nil || res.Records[0].ErrorKind != ErrConnection {
		t.Errorf("closed server: err %v kind %q, want connection", err, res.Records[0].ErrorKind)
	}
}

func TestNvextSession(t *testing.T) {
	srv := &scriptedServer{ttft: time.Millisecond, gap: time.Millisecond, chunks: 2}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	synth, _ := NewSynth(nil, 16)
	tr := &Trace{Sessions: []*Session{{ID: "a", Mode: ContextDeltas, JoinBefore: -1, Turns: []Turn{{Text: "x"}, {Text: "y"}, {Text: "z"}}}}}
	if _, err := Replay(context.Background(), tr, synth, ReplayOptions{URL: ts.URL, Model: "m", NvextSession: true}); err != nil {
		t.Fatal(err)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for i, b := range srv.bodies {
		ctl := b["nvext"].(map[string]any)["session_control"].(map[string]any)
		want := "bind"
		if i == 2 {
			want = "close"
		}
		if ctl["action"] != want || ctl["session_id"] != srv.headers[i].Get("X-Correlation-ID") {
			t.Errorf("turn %d: session_control %v, want action %s with the correlation id", i, ctl, want)
		}
	}
}

// TestTheoreticalSkipsUnservedRequests: a turn answered 503 before any content was never
// prefilled, so the next turn's theoretical, pooled-LRU and clairvoyant hits count only the
// blocks of the turns served before it; a turn cut mid-stream was prefilled, and its blocks
// count.
func TestTheoreticalSkipsUnservedRequests(t *testing.T) {
	srv := &scriptedServer{ttft: time.Millisecond, gap: time.Millisecond, chunks: 3}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	session := func(id, failing string) *Session {
		return &Session{ID: id, Namespace: id, Mode: ContextStandalone, JoinBefore: -1, Turns: []Turn{
			{Text: "first", HashIDs: []int64{1, 2}},
			{Text: failing, HashIDs: []int64{1, 2, 3, 4}},
			{Text: "third", HashIDs: []int64{1, 2, 3, 4, 5}},
		}}
	}
	cases := []struct {
		failing    string
		wantHit    int // the third turn's theoretical, pooled-LRU and clairvoyant hit
		wantFailed bool
	}{
		{"FAIL503", 2, true},
		{"MIDSTREAM", 4, true},
		{"second", 4, false},
	}
	synth, _ := NewSynth(nil, 16)
	for _, tc := range cases {
		t.Run(tc.failing, func(t *testing.T) {
			tr := &Trace{Sessions: []*Session{session("s-"+tc.failing, tc.failing)}}
			res, err := Replay(context.Background(), tr, synth, ReplayOptions{URL: ts.URL, Model: "m", CapacityBlocks: 100})
			if err != nil {
				t.Fatal(err)
			}
			var second, third *Record
			for i := range res.Records {
				switch res.Records[i].TurnIndex {
				case 1:
					second = &res.Records[i]
				case 2:
					third = &res.Records[i]
				}
			}
			if second == nil || third == nil {
				t.Fatalf("records %+v", res.Records)
			}
			if second.OK() == tc.wantFailed || second.TheoreticalHit != 2 {
				t.Errorf("second turn: ok %v, hit %d; want ok %v, hit 2", second.OK(), second.TheoreticalHit, !tc.wantFailed)
			}
			if third.TheoreticalHit != tc.wantHit || third.CapacityHit != tc.wantHit || third.OptimalHit != tc.wantHit {
				t.Errorf("third turn: theoretical hit %d, pooled LRU %d, clairvoyant %d; want %d", third.TheoreticalHit, third.CapacityHit, third.OptimalHit, tc.wantHit)
			}
		})
	}
}
