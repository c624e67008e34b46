package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/configs"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A client that goes away mid-stream cancels the worker's request at once (the simulated
// worker counts it as cancelled, long before its 1000 tokens would have finished).
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	opts := fastSim()
	opts.ITL = 20 * time.Millisecond
	w := startSim(t, opts)
	g := startGateway(t, nil, w.srv.URL)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := g.client().CreateChatCompletionStream(ctx, chatReq(true, 1000))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	if g.reg.Workers()[0].InFlight(0) != 1 {
		t.Errorf("in flight during the stream = %d, want 1", g.reg.Workers()[0].InFlight(0))
	}
	start := time.Now()
	cancel()
	st.Close()
	waitFor(t, "the worker to see the cancel", func() bool { return w.Stats().Cancelled == 1 })
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("cancel took %v to reach the worker", d)
	}
	if w.Stats().Completed != 0 {
		t.Error("the worker finished the request anyway")
	}
	waitFor(t, "the disconnect metric", func() bool {
		return strings.Contains(scrape(t, g), `kvgate_client_disconnects_total{endpoint="/v1/chat/completions"} 1`)
	})
}

// A worker that fails before its first byte is replaced: every request succeeds elsewhere.
func TestFailBeforeFirstByteRetried(t *testing.T) {
	cases := []struct {
		name   string
		status int // sim.Faults.FailStatus: 0 = connection closed, 503 = error response
	}{
		{"connection closed", 0},
		{"503 answer", 503},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bad := fastSim()
			bad.FailBeforeFirstByte = true
			bad.Faults.FailStatus = tc.status
			a, b := startSim(t, bad), startSim(t, fastSim())
			g := startGateway(t, func(c *configs.Config) { c.Health.FailureThreshold = 100 }, a.srv.URL, b.srv.URL)
			for i := range 4 {
				stream := i%2 == 1
				if stream {
					st, err := g.client().CreateChatCompletionStream(context.Background(), chatReq(true, 3))
					if err != nil {
						t.Fatal(err)
					}
					if st.Header().Get("X-Kvgate-Worker") != b.srv.URL {
						t.Errorf("served by %q", st.Header().Get("X-Kvgate-Worker"))
					}
					for {
						if _, err := st.Recv(); errors.Is(err, io.EOF) {
							break
						} else if err != nil {
							t.Fatal(err)
						}
					}
					st.Close()
					continue
				}
				resp, err := g.client().CreateChatCompletion(context.Background(), chatReq(false, 3))
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if resp.Header().Get("X-Kvgate-Worker") != b.srv.URL {
					t.Errorf("served by %q", resp.Header().Get("X-Kvgate-Worker"))
				}
			}
			if a.Stats().InjectedFailures < 2 {
				t.Errorf("the failing worker was tried %d times; round robin should have picked it", a.Stats().InjectedFailures)
			}
			if !strings.Contains(scrape(t, g), `kvgate_retries_total{endpoint="/v1/chat/completions"}`) {
				t.Error("no retry counted")
			}
		})
	}
}

// Retries are bounded: with every worker failing, the client gets one 502, not a hang.
func TestAllWorkersFailBeforeFirstByte(t *testing.T) {
	bad := fastSim()
	bad.FailBeforeFirstByte = true
	a, b, c := startSim(t, bad), startSim(t, bad), startSim(t, bad)
	g := startGateway(t, func(c *configs.Config) { c.Proxy.MaxRetries = 1; c.Health.FailureThreshold = 100 }, a.srv.URL, b.srv.URL, c.srv.URL)
	resp, body := g.post(t, pathChat, `{"model":"test-model","messages":[{"role":"user","content":"x"}]}`, nil)
	checkErrorBody(t, resp, body, 502, "BadGatewayError", "")
	tries := a.Stats().InjectedFailures + b.Stats().InjectedFailures + c.Stats().InjectedFailures
	if tries != 2 {
		t.Errorf("%d workers tried, want 2 (1 + max_retries 1)", tries)
	}
}

// A worker killed mid-stream: the client gets an OpenAI error event, then the stream ends.
func TestDieMidStream(t *testing.T) {
	opts := fastSim()
	opts.DieMidStreamAfter = 3
	w := startSim(t, opts)
	g := startGateway(t, nil, w.srv.URL)

	t.Run("go-openai sees the error", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := g.client().CreateChatCompletionStream(ctx, chatReq(true, 50))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		got := 0
		for {
			_, err := st.Recv()
			if err == nil {
				got++
				continue
			}
			var apiErr *openai.APIError
			if !errors.As(err, &apiErr) || apiErr.Type != "BadGatewayError" || !strings.Contains(apiErr.Message, "before [DONE]") && !strings.Contains(apiErr.Message, "broke off") {
				t.Fatalf("after %d chunks: err = %v, want the gateway's error event", got, err)
			}
			break
		}
		if got < 3 {
			t.Errorf("only %d chunks before the error", got)
		}
	})

	t.Run("raw stream ends with error event and [DONE]", func(t *testing.T) {
		resp, body := g.post(t, pathChat, `{"model":"test-model","stream":true,"max_tokens":50,"messages":[{"role":"user","content":"x"}]}`, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		events := strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n")
		n := len(events)
		if n < 3 || !strings.HasPrefix(events[n-2], `data: {"error": {"message": `) || events[n-1] != "data: [DONE]" {
			t.Fatalf("stream tail: %q", events[max(0, n-3):])
		}
		for _, e := range events[:n-2] {
			if !strings.HasPrefix(e, "data: {") || !strings.HasSuffix(e, "}") {
				t.Errorf("relayed a broken event %q", e)
			}
		}
	})
	if w.Stats().DiedMidStream != 2 {
		t.Errorf("worker died %d times, want 2", w.Stats().DiedMidStream)
	}
}

// Each error case the gateway answers, with its status and OpenAI body.
func TestErrorResponses(t *testing.T) {
	w := startSim(t, fastSim())
	g := startGateway(t, func(c *configs.Config) { c.Proxy.MaxBodyBytes = 2048 }, w.srv.URL)
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name, path, body string
		status           int
		typ, param, msg  string
	}{
		{"malformed JSON", pathChat, `{"model":"test-model",` + msgs + `,}`, 400, "BadRequestError", "", "malformed JSON at byte"},
		{"truncated JSON", pathChat, `{"model":"test-model"`, 400, "BadRequestError", "", "malformed JSON"},
		{"empty body", pathChat, ``, 400, "BadRequestError", "", "request body is empty"},
		{"not an object", pathChat, `[1,2]`, 400, "BadRequestError", "", "must be a JSON object"},
		{"missing messages", pathChat, `{"model":"test-model"}`, 400, "BadRequestError", "messages", "messages: must be a non-empty array"},
		{"empty messages", pathChat, `{"model":"test-model","messages":[]}`, 400, "BadRequestError", "messages", "non-empty"},
		{"null messages", pathChat, `{"model":"test-model","messages":null}`, 400, "BadRequestError", "messages", "non-empty"},
		{"wrong type", pathChat, `{"model":"test-model",` + msgs + `,"max_tokens":"ten"}`, 400, "BadRequestError", "max_tokens", "invalid type for max_tokens"},
		{"bad stop", pathChat, `{"model":"test-model",` + msgs + `,"stop":7}`, 400, "BadRequestError", "", "stop: expected a string"},
		{"stream_options without stream", pathChat, `{"model":"test-model",` + msgs + `,"stream_options":{"include_usage":true}}`, 400, "BadRequestError", "stream_options", "Stream options can only be defined when `stream=True`."},
		{"empty cache_salt", pathChat, `{"model":"test-model",` + msgs + `,"cache_salt":""}`, 400, "BadRequestError", "cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided."},
		{"numeric cache_salt", pathCompletions, `{"model":"test-model","prompt":"x","cache_salt":5}`, 400, "BadRequestError", "cache_salt", "non-empty string"},
		{"missing prompt", pathCompletions, `{"model":"test-model"}`, 400, "BadRequestError", "prompt", "prompt: is required"},
		{"empty prompt list", pathCompletions, `{"model":"test-model","prompt":[]}`, 400, "BadRequestError", "prompt", "empty array"},
		{"body over limit", pathChat, `{"model":"test-model",` + msgs + `,"pad":"` + strings.Repeat("x", 3000) + `"}`, 413, "RequestEntityTooLargeError", "", "exceeds the gateway limit of 2048 bytes"},
		{"unknown route", "/v1/embeddingz", `{}`, 404, "NotFoundError", "", "no route POST /v1/embeddingz"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := g.post(t, tc.path, tc.body, nil)
			checkErrorBody(t, resp, body, tc.status, tc.typ, tc.param)
			if !strings.Contains(string(body), jsonEscape(tc.msg)) {
				t.Errorf("body %s lacks %q", body, tc.msg)
			}
		})
	}
	for _, path := range []string{pathChat, pathCompletions} {
		t.Run("unknown model "+path, func(t *testing.T) {
			resp, body := g.post(t, path, `{"model":"gpt-9","prompt":"x",`+msgs+`}`, nil)
			checkModelNotFound(t, resp, body, "gpt-9")
		})
	}
	if got := len(w.rec.all()); got != 0 {
		t.Errorf("%d invalid requests reached the worker", got)
	}

	t.Run("chunked body over limit", func(t *testing.T) {
		pr, pw := io.Pipe()
		go func() {
			_, _ = pw.Write([]byte(`{"model":"test-model",` + msgs + `,"pad":"` + strings.Repeat("y", 5000) + `"}`))
			pw.Close()
		}()
		resp, err := http.Post(g.url+pathChat, "application/json", pr) // no Content-Length
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		checkErrorBody(t, resp, body, 413, "RequestEntityTooLargeError", "")
	})

	t.Run("wrong method", func(t *testing.T) {
		resp, err := http.Get(g.url + pathChat)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		checkErrorBody(t, resp, body, 405, "MethodNotAllowedError", "")
	})
}

func TestNoHealthyWorker(t *testing.T) {
	w := startSim(t, fastSim())
	g := startGateway(t, nil, w.srv.URL)
	w.srv.CloseClientConnections()
	w.srv.Close()
	// A worker that was healthy is ejected after failure_threshold (3) failed probes.
	g.reg.ProbeAll(context.Background())
	g.reg.ProbeAll(context.Background())
	g.reg.ProbeAll(context.Background())
	resp, body := g.post(t, pathChat, `{"model":"test-model","messages":[{"role":"user","content":"hi"}]}`, nil)
	checkErrorBody(t, resp, body, 503, "ServiceUnavailableError", "")
	if !strings.Contains(string(body), "no healthy worker") {
		t.Errorf("body %s", body)
	}
	hr, err := http.Get(g.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := io.ReadAll(hr.Body)
	hr.Body.Close()
	if hr.StatusCode != 503 || !strings.Contains(string(hb), `"reason":"no healthy worker (0 of 1 routable)`) {
		t.Errorf("health %d %s", hr.StatusCode, hb)
	}
	mr, err := http.Get(g.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(mr.Body)
	mr.Body.Close()
	if mr.StatusCode != 503 {
		t.Errorf("models with no worker: %d %s", mr.StatusCode, mb)
	}
}

// checkModelNotFound checks OpenAI's answer for an unknown model: 404, the whole body exactly.
func checkModelNotFound(t *testing.T, resp *http.Response, body []byte, model string) {
	t.Helper()
	want := `{"error":{"message":"The model ` + "`" + model + "`" + ` does not exist or you do not have access to it.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`
	if resp.StatusCode != http.StatusNotFound || string(body) != want || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Errorf("%d %s %s, want 404 %s", resp.StatusCode, resp.Header.Get("Content-Type"), body, want)
	}
}

func checkErrorBody(t *testing.T, resp *http.Response, body []byte, status int, typ, param string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d (body %s)", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q", ct)
	}
	var got struct {
		Error *struct {
			Message *string `json:"message"`
			Type    *string `json:"type"`
			Param   *string `json:"param"`
			Code    *int    `json:"code"`
		} `json:"error"`
	}
	if err := jsonUnmarshalStrict(body, &got); err != nil || got.Error == nil || got.Error.Message == nil || got.Error.Type == nil || got.Error.Code == nil {
		t.Fatalf("not an OpenAI error body: %s (%v)", body, err)
	}
	if *got.Error.Type != typ || *got.Error.Code != status {
		t.Errorf("type %q code %d, want %q %d", *got.Error.Type, *got.Error.Code, typ, status)
	}
	gotParam := ""
	if got.Error.Param != nil {
		gotParam = *got.Error.Param
	}
	if gotParam != param {
		t.Errorf("param %q, want %q", gotParam, param)
	}
	if !strings.Contains(string(body), `"param":`) {
		t.Error("param key missing (vLLM always sends it, null when unset)")
	}
}

func scrape(t *testing.T, g *gateway) string {
	t.Helper()
	return scrapeURL(t, g.url+"/metrics")
}

// scrapeAdmin reads the admin listener's /metrics (every series, the per-worker ones too).
func scrapeAdmin(t *testing.T, g *gateway) string {
	t.Helper()
	return scrapeURL(t, g.adminURL+"/metrics")
}

func scrapeURL(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		sb.WriteString(sc.Text())
		sb.WriteByte('\n')
	}
	return sb.String()
}

// A worker process that is gone (connection refused) while still marked healthy: requests
// succeed on the other worker, and connection failures eject it without waiting for probes.
func TestDeadWorkerRetriedAndEjected(t *testing.T) {
	a, b := startSim(t, fastSim()), startSim(t, fastSim())
	g := startGateway(t, func(c *configs.Config) { c.Health.FailureThreshold = 2 }, a.srv.URL, b.srv.URL)
	a.srv.CloseClientConnections()
	a.srv.Close()
	for i := range 6 {
		resp, err := g.client().CreateChatCompletion(context.Background(), chatReq(false, 2))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if w := resp.Header().Get("X-Kvgate-Worker"); w != b.srv.URL {
			t.Fatalf("request %d served by %q", i, w)
		}
	}
	st := g.reg.Get(a.srv.URL).Status()
	if st.Healthy || st.Ejections != 1 {
		t.Errorf("dead worker status %+v, want ejected once", st)
	}
	if b.Stats().Completed != 6 {
		t.Errorf("live worker completed %d", b.Stats().Completed)
	}
}
