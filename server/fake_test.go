package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/configs"
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

// spyPolicy wraps round robin and records the Tracker lifecycle; spyEnricher fills hashes.
type spyPolicy struct {
	router.RoundRobin
	begun, first, done atomic.Int32
	sawHashes          atomic.Int32
}

type spyLife struct{ p *spyPolicy }

func (l spyLife) FirstToken() { l.p.first.Add(1) }
func (l spyLife) Done()       { l.p.done.Add(1) }

func (p *spyPolicy) Begin(d router.Decision, req *router.Request) router.Lifecycle {
	p.begun.Add(1)
	if len(req.BlockHashes) == 3 && req.PromptTokens == 48 {
		p.sawHashes.Add(1)
	}
	return spyLife{p}
}

type spyEnricher struct{ calls atomic.Int32 }

func (e *spyEnricher) Enrich(_ context.Context, in *Inbound, req *router.Request) error {
	e.calls.Add(1)
	if in.Chat == nil || len(in.Chat.Messages) == 0 {
		return nil
	}
	req.PromptTokens, req.BlockHashes = 48, []uint64{1, 2, 3}
	return nil
}

func TestEnricherAndTrackerHooks(t *testing.T) {
	bad := fastSim()
	bad.FailBeforeFirstByte = true
	a, b := startSim(t, bad), startSim(t, fastSim())
	cfg := testGatewayConfig(a.srv.URL, b.srv.URL)
	cfg.Health.FailureThreshold = 100
	g := startGatewayWith(t, cfg, &spyPolicy{}, &spyEnricher{})
	for range 4 {
		if _, err := g.client().CreateChatCompletion(context.Background(), chatReq(false, 2)); err != nil {
			t.Fatal(err)
		}
	}
	p, e := g.policy.(*spyPolicy), g.enricher.(*spyEnricher)
	if e.calls.Load() != 4 {
		t.Errorf("enricher called %d times", e.calls.Load())
	}
	// The retry advances round robin too, so every request meets the failing worker first:
	// 8 attempts, each begun and done, and 4 first tokens (only the good worker's).
	if p.begun.Load() != 8 || p.done.Load() != 8 || p.first.Load() != 4 || p.sawHashes.Load() != 8 {
		t.Errorf("lifecycle begun=%d done=%d first=%d hashes=%d", p.begun.Load(), p.done.Load(), p.first.Load(), p.sawHashes.Load())
	}
}
