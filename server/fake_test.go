package server

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
)

// fakeUpstream is a hand-written worker for fault timings the simulator cannot produce.
func fakeUpstream(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		if r.URL.Path == "/v1/models" {
			_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"test-model","object":"model"}]}`))
			return
		}
		h(w, r)
	}))
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return srv
}

const chunk = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"test-model","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null}]}` + "\n\n"

const streamBody = `{"model":"test-model","stream":true,"messages":[{"role":"user","content":"x"}]}`

func TestStreamFaultsFromFakeWorker(t *testing.T) {
	cases := []struct {
		name     string
		handler  http.HandlerFunc
		mutate   func(*configs.Config)
		wantTail string // last relayed bytes before the gateway's own error event
		wantErr  string // "" = stream must end cleanly
	}{
		{
			name: "clean end",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = w.Write([]byte(chunk + chunk + "data: [DONE]\n\n"))
			},
			wantTail: "data: [DONE]\n\n",
		},
		{
			name: "events split across writes and CRLF",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				f := w.(http.Flusher)
				for _, part := range []string{chunk[:10], chunk[10:], "data: [DO", "NE]\r\n\r\n"} {
					_, _ = w.Write([]byte(part))
					f.Flush()
					time.Sleep(2 * time.Millisecond)
				}
			},
			wantTail: chunk + "data: [DONE]\r\n\r\n",
		},
		{
			name: "clean EOF before [DONE]",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = w.Write([]byte(chunk + chunk))
			},
			wantTail: chunk,
			wantErr:  "ended the stream before [DONE]",
		},
		{
			name: "half an event then crash",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = w.Write([]byte(chunk + chunk[:20]))
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			},
			wantTail: chunk,
			wantErr:  "broke off the stream",
		},
		{
			name: "stalled stream hits the idle timeout",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = w.Write([]byte(chunk))
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			},
			mutate:   func(c *configs.Config) { c.Proxy.StreamIdleTimeout = configs.Duration(100 * time.Millisecond) },
			wantTail: chunk,
			wantErr:  "sent nothing for 100ms",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := fakeUpstream(t, tc.handler)
			g := startGateway(t, tc.mutate, up.URL)
			resp, body := g.post(t, pathChat, streamBody, nil)
			if resp.StatusCode != 200 || resp.Header.Get("X-Kvgate-Worker") != up.URL {
				t.Fatalf("status %d worker %q", resp.StatusCode, resp.Header.Get("X-Kvgate-Worker"))
			}
			s := string(body)
			if tc.wantErr == "" {
				if !strings.HasSuffix(s, tc.wantTail) || strings.Contains(s, `"error"`) {
					t.Fatalf("body %q", s)
				}
				return
			}
			i := strings.Index(s, `data: {"error": `)
			if i < 0 || !strings.HasSuffix(s[:i], tc.wantTail) {
				t.Fatalf("body %q: want relayed events ending %q then an error event", s, tc.wantTail)
			}
			if !strings.Contains(s[i:], tc.wantErr) || !strings.HasSuffix(s, "}}\n\ndata: [DONE]\n\n") {
				t.Fatalf("error event %q, want %q", s[i:], tc.wantErr)
			}
		})
	}
}

func TestStatusPassThrough(t *testing.T) {
	cases := []struct {
		name     string
		status   int
		body     string
		workers  int
		wantCode int
	}{
		{"worker 400 is passed through", 400, `{"error":{"message":"too long","type":"BadRequestError","param":null,"code":400}}`, 2, 400},
		{"worker 500 is not retried", 500, `{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}`, 2, 500},
		{"503 with no other worker is passed through", 503, `{"error":{"message":"busy","type":"ServiceUnavailableError","param":null,"code":503}}`, 1, 503},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var hits atomic.Int32
			var urls []string
			for range tc.workers {
				up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
					hits.Add(1)
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(tc.status)
					_, _ = w.Write([]byte(tc.body))
				})
				urls = append(urls, up.URL)
			}
			g := startGateway(t, nil, urls...)
			resp, body := g.post(t, pathChat, `{"model":"test-model","messages":[{"role":"user","content":"x"}]}`, nil)
			if resp.StatusCode != tc.wantCode || string(body) != tc.body {
				t.Fatalf("got %d %s", resp.StatusCode, body)
			}
			if resp.Header.Get("X-Kvgate-Worker") == "" {
				t.Error("no X-Kvgate-Worker on a passed-through error")
			}
			if hits.Load() != 1 {
				t.Errorf("%d worker calls, want 1", hits.Load())
			}
		})
	}
}

// A non-stream response cut mid-body must not look complete to the client.
func TestNonStreamCutMidBody(t *testing.T) {
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"chatcmpl-1","choices":[`))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	g := startGateway(t, nil, up.URL)
	_, err := g.client().CreateChatCompletion(context.Background(), chatReq(false, 3))
	if err == nil {
		t.Fatal("a truncated response was accepted")
	}
}

// spyRouter wraps a round-robin router and counts every attempt's Lifecycle steps;
// spyEnricher fills hashes.
type spyRouter struct {
	router.Router
	started, ended                   atomic.Int32
	begun, sent, first, done, failed atomic.Int32
	sawHashes, chunks                atomic.Int32
}

type spyLife struct {
	router.Lifecycle
	p *spyRouter
}

func (l spyLife) Sent()          { l.p.sent.Add(1); l.Lifecycle.Sent() }
func (l spyLife) FirstToken()    { l.p.first.Add(1); l.Lifecycle.FirstToken() }
func (l spyLife) Chunk()         { l.p.chunks.Add(1); l.Lifecycle.Chunk() }
func (l spyLife) Done()          { l.p.done.Add(1); l.Lifecycle.Done() }
func (l spyLife) Failed(e error) { l.p.failed.Add(1); l.Lifecycle.Failed(e) }

func (p *spyRouter) Start(req *router.Request) func() {
	p.started.Add(1)
	end := p.Router.Start(req)
	return func() { p.ended.Add(1); end() }
}

func (p *spyRouter) Route(ctx context.Context, req *router.Request, cands []router.Candidate) (router.Decision, router.Lifecycle, error) {
	d, life, err := p.Router.Route(ctx, req, cands)
	if err != nil {
		return d, nil, err
	}
	p.begun.Add(1)
	if len(req.BlockHashes) == 3 && req.PromptTokens == 48 {
		p.sawHashes.Add(1)
	}
	return d, spyLife{Lifecycle: life, p: p}, nil
}

type spyEnricher struct{ calls atomic.Int32 }

func (e *spyEnricher) Enrich(_ context.Context, in *apireq.Request, req *router.Request) error {
	e.calls.Add(1)
	if in.Messages() == 0 {
		return nil
	}
	req.PromptTokens, req.BlockHashes = 48, []kvkey.BlockHash{1, 2, 3}
	return nil
}

func TestEnricherAndTrackerHooks(t *testing.T) {
	bad := fastSim()
	bad.FailBeforeFirstByte = true
	a, b := startSim(t, bad), startSim(t, fastSim())
	cfg := testGatewayConfig(a.srv.URL, b.srv.URL)
	cfg.Health.FailureThreshold = 100
	p := &spyRouter{Router: routerFor(t, &router.RoundRobin{})}
	g := startGatewayWith(t, cfg, p, &spyEnricher{})
	for range 4 {
		if _, err := g.client().CreateChatCompletion(context.Background(), chatReq(false, 2)); err != nil {
			t.Fatal(err)
		}
	}
	e := g.pools[0].Enricher.(*spyEnricher)
	if e.calls.Load() != 4 {
		t.Errorf("enricher called %d times", e.calls.Load())
	}
	// The retry advances round robin too, so every request meets the failing worker first:
	// 8 attempts, each begun and sent; 4 failed (the bad worker's) and 4 first tokens and done
	// (the good worker's); each request started and ended once.
	if p.begun.Load() != 8 || p.sent.Load() != 8 || p.failed.Load() != 4 || p.done.Load() != 4 ||
		p.first.Load() != 4 || p.sawHashes.Load() != 8 || p.started.Load() != 4 || p.ended.Load() != 4 {
		t.Errorf("lifecycle started=%d ended=%d begun=%d sent=%d failed=%d done=%d first=%d hashes=%d",
			p.started.Load(), p.ended.Load(), p.begun.Load(), p.sent.Load(), p.failed.Load(), p.done.Load(), p.first.Load(), p.sawHashes.Load())
	}
}

// TestStreamReportsChunks: every SSE event of a streamed response that reaches the client is
// reported as a Lifecycle Chunk (the router's inter-token sample); a non-stream response
// reports none.
func TestStreamReportsChunks(t *testing.T) {
	s := startSim(t, fastSim())
	p := &spyRouter{Router: routerFor(t, &router.RoundRobin{})}
	g := startGatewayWith(t, testGatewayConfig(s.srv.URL), p, &spyEnricher{})
	if _, err := g.client().CreateChatCompletion(context.Background(), chatReq(false, 8)); err != nil {
		t.Fatal(err)
	}
	if n := p.chunks.Load(); n != 0 {
		t.Fatalf("non-stream response reported %d chunks", n)
	}
	st, err := g.client().CreateChatCompletionStream(context.Background(), chatReq(true, 8))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got := 0
	for {
		if _, err := st.Recv(); err != nil {
			break
		}
		got++
	}
	if n := int(p.chunks.Load()); got < 8 || n < got {
		t.Fatalf("client read %d chunks, lifecycle reported %d; want at least 8 and at least the client's", got, n)
	}
}

// pausedStream is a worker that answers path with an event stream: opening at once, then,
// once release is closed, rest(r).
func pausedStream(t *testing.T, path, opening string, release <-chan struct{}, rest func(r *http.Request) string) *httptest.Server {
	return fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		_, _ = w.Write([]byte(opening))
		f.Flush()
		<-release
		_, _ = w.Write([]byte(rest(r)))
		f.Flush()
	})
}

// readPastOpening posts body to url and reads the stream's first line (want firstLine): the
// routing side must not have heard FirstToken by then. It closes release, reads the rest and
// checks FirstToken came exactly once; it returns the rest.
func readPastOpening(t *testing.T, url, body, firstLine string, spy *spyRouter, release chan struct{}) string {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, _ := rd.ReadString('\n'); line != firstLine {
		t.Fatalf("first line %q, want %q", line, firstLine)
	}
	time.Sleep(20 * time.Millisecond)
	if n := spy.first.Load(); n != 0 {
		t.Errorf("FirstToken fired on the stream's opening (%d)", n)
	}
	close(release)
	var rest strings.Builder
	_, _ = rd.WriteTo(&rest)
	if n := spy.first.Load(); n != 1 {
		t.Errorf("FirstToken fired %d times, want once", n)
	}
	return rest.String()
}
