package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/keylimits"
)

// limitedGateway is a gateway in front of one fast simulated worker whose client keys are keys.
func limitedGateway(t *testing.T, opts func(*configs.Config), keys ...configs.ClientKey) *gateway {
	t.Helper()
	w := startSim(t, fastSim())
	return startGateway(t, func(c *configs.Config) {
		c.Auth.Keys = keys
		if opts != nil {
			opts(c)
		}
	}, w.srv.URL)
}

func (g *gateway) clientWithKey(key string) *openai.Client {
	cfg := openai.DefaultConfig(key)
	cfg.BaseURL = g.url + "/v1"
	return openai.NewClientWithConfig(cfg)
}

// The real OpenAI client against a 120 rpm key with a burst of 2: both requests of the burst
// pass and carry the x-ratelimit headers go-openai parses (remaining counting down, reset as a
// duration); the third is OpenAI's 429 rate_limit_exceeded of type requests with Retry-After;
// a stream carries the headers too; an unlimited key gets none.
func TestKeyLimitsOpenAIClient(t *testing.T) {
	g := limitedGateway(t, nil,
		configs.ClientKey{Key: "sk-limited", Name: "limited", RequestsPerMinute: 120, Burst: 2, TokensPerMinute: 600000},
		configs.ClientKey{Key: "sk-free", Name: "free"})
	cl := g.clientWithKey("sk-limited")
	ctx := context.Background()
	for i, wantRemaining := range []int{1, 0} {
		resp, err := cl.CreateChatCompletion(ctx, chatReq(false, 4))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		h := resp.GetRateLimitHeaders()
		if h.LimitRequests != 120 || h.RemainingRequests != wantRemaining || h.LimitTokens != 600000 {
			t.Fatalf("request %d headers %+v", i, h)
		}
		if d, err := time.ParseDuration(h.ResetRequests.String()); err != nil || d <= 0 || d > time.Second*time.Duration(2-wantRemaining)/2+50*time.Millisecond {
			t.Fatalf("request %d reset-requests %q (%v)", i, h.ResetRequests, err)
		}
		// Tokens: the charge (prompt + 4) was corrected by the usage before the next request.
		if h.RemainingTokens <= 0 || h.RemainingTokens >= 10000 {
			t.Fatalf("request %d remaining tokens %d of a 10,000 bucket", i, h.RemainingTokens)
		}
	}
	_, err := cl.CreateChatCompletion(ctx, chatReq(false, 4))
	var apiErr *openai.APIError
	if !errors.As(err, &apiErr) || apiErr.HTTPStatusCode != http.StatusTooManyRequests || apiErr.Type != "requests" || apiErr.Code != "rate_limit_exceeded" {
		t.Fatalf("third request: want 429 requests rate_limit_exceeded, got %v", err)
	}

	// Raw: Retry-After and the headers on the 429 itself.
	resp, body := g.post(t, pathChat, `{"model":"test-model","messages":[{"role":"user","content":"hi"}]}`, map[string]string{"Authorization": "Bearer sk-limited"})
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" || resp.Header.Get("X-Ratelimit-Remaining-Requests") != "0" {
		t.Fatalf("429: %d Retry-After %q remaining %q: %s", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("X-Ratelimit-Remaining-Requests"), body)
	}

	// A stream, once the bucket refilled: the headers come with the response head.
	time.Sleep(600 * time.Millisecond)
	stream, err := cl.CreateChatCompletionStream(ctx, chatReq(true, 4))
	if err != nil {
		t.Fatal(err)
	}
	h := stream.GetRateLimitHeaders()
	for {
		if _, err := stream.Recv(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
	}
	stream.Close()
	if h.LimitRequests != 120 || h.RemainingRequests != 0 || h.ResetRequests == "" {
		t.Fatalf("stream headers %+v", h)
	}

	free, err := g.clientWithKey("sk-free").CreateChatCompletion(ctx, chatReq(false, 4))
	if err != nil {
		t.Fatal(err)
	}
	if h := free.Header().Get("X-Ratelimit-Limit-Requests"); h != "" {
		t.Fatalf("an unlimited key got x-ratelimit-limit-requests %q", h)
	}
	// Other routes of the limited key carry the headers too (without spending).
	req, _ := http.NewRequest(http.MethodGet, g.url+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer sk-limited")
	mr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	mr.Body.Close()
	if mr.StatusCode != http.StatusOK || mr.Header.Get("X-Ratelimit-Limit-Requests") != "120" {
		t.Fatalf("GET /v1/models: %d, limit header %q", mr.StatusCode, mr.Header.Get("X-Ratelimit-Limit-Requests"))
	}
}

// Over a limit on /v1/messages the 429 is Anthropic's rate_limit_error, with Retry-After.
func TestKeyLimitsAnthropicShape(t *testing.T) {
	g := limitedGateway(t, nil, configs.ClientKey{Key: "sk-a", RequestsPerMinute: 1})
	body := `{"model":"test-model","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	h := map[string]string{"X-Api-Key": "sk-a", "Anthropic-Version": "2023-06-01"}
	if resp, data := g.post(t, pathMessages, body, h); resp.StatusCode != http.StatusOK {
		t.Fatalf("first: %d %s", resp.StatusCode, data)
	}
	resp, data := g.post(t, pathMessages, body, h)
	var e anthropicErrorBody
	if resp.StatusCode != http.StatusTooManyRequests || json.Unmarshal(data, &e) != nil || e.Type != "error" || e.Error.Type != "rate_limit_error" {
		t.Fatalf("second: %d %s", resp.StatusCode, data)
	}
	if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra < 55 || ra > 60 {
		t.Fatalf("Retry-After %q, want the ~60 s until the 1 rpm bucket holds a request", resp.Header.Get("Retry-After"))
	}
}

// A key past its request limit is refused before its body is parsed or tokenized: a malformed
// body from it gets the 429, while the same body from a key with room gets the parse error.
func TestKeyLimitsRefusedBeforeParsing(t *testing.T) {
	g := limitedGateway(t, nil,
		configs.ClientKey{Key: "sk-spent", Name: "spent", RequestsPerMinute: 1},
		configs.ClientKey{Key: "sk-room", Name: "room", RequestsPerMinute: 1})
	good := `{"model":"test-model","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	bad := `{"model":"test-model","messages":[`
	auth := func(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }
	if resp, data := g.post(t, pathChat, good, auth("sk-spent")); resp.StatusCode != http.StatusOK {
		t.Fatalf("first: %d %s", resp.StatusCode, data)
	}
	if resp, data := g.post(t, pathChat, bad, auth("sk-spent")); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("malformed body past the limit: %d %s, want 429 with Retry-After", resp.StatusCode, data)
	}
	if resp, data := g.post(t, pathChat, bad, auth("sk-room")); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("malformed body within the limit: %d %s, want 400", resp.StatusCode, data)
	}
}

// max_concurrent 1 against a slow worker: of two concurrent requests one is refused with 429
// (concurrency), and once the first finished the key may send again.
func TestKeyLimitsMaxConcurrent(t *testing.T) {
	opts := fastSim()
	opts.TTFT = 300 * time.Millisecond
	w := startSim(t, opts)
	g := startGateway(t, func(c *configs.Config) {
		c.Auth.Keys = []configs.ClientKey{{Key: "sk-c", Name: "c", MaxConcurrent: 1}}
	}, w.srv.URL)
	cl := g.clientWithKey("sk-c")
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = cl.CreateChatCompletion(context.Background(), chatReq(false, 2))
		})
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()
	var apiErr *openai.APIError
	if errs[0] != nil || !errors.As(errs[1], &apiErr) || apiErr.HTTPStatusCode != http.StatusTooManyRequests || !strings.Contains(apiErr.Message, "concurrent") {
		t.Fatalf("want the first served and the second refused for concurrency: %v / %v", errs[0], errs[1])
	}
	if _, err := cl.CreateChatCompletion(context.Background(), chatReq(false, 2)); err != nil {
		t.Fatalf("after the first finished: %v", err)
	}
}

// A tokens_per_minute key is charged prompt + max_tokens up front and the worker's usage when
// the response ends: a request asking max_tokens 5,000 of a 10,000 bucket leaves about its
// usage spent, not 5,000 (refilled at 100 tokens/s: the test's own time barely shows).
func TestKeyLimitsTokenCorrection(t *testing.T) {
	g := limitedGateway(t, nil, configs.ClientKey{Key: "sk-t", TokensPerMinute: 6000, Burst: 10000})
	cl := g.clientWithKey("sk-t")
	resp, err := cl.CreateChatCompletion(context.Background(), chatReq(false, 5000))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetRateLimitHeaders().RemainingTokens; got > 10000-5000 {
		t.Fatalf("admission charged only %d of the 5,000+ estimate", 10000-got)
	}
	used := resp.Usage.TotalTokens
	req, _ := http.NewRequest(http.MethodGet, g.url+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer sk-t")
	mr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	mr.Body.Close()
	remaining, _ := strconv.Atoi(mr.Header.Get("X-Ratelimit-Remaining-Tokens"))
	if used <= 0 || remaining < 10000-used-1 || remaining > 10000 {
		t.Fatalf("after the usage (%d tokens) the bucket holds %d of 10,000", used, remaining)
	}
}

func TestResetString(t *testing.T) {
	cases := []struct {
		d    time.Duration
		want string
	}{{0, "0ms"}, {20 * time.Millisecond, "20ms"}, {1500 * time.Millisecond, "1.5s"}, {6 * time.Minute, "6m0s"}, {999_600 * time.Microsecond, "1s"}}
	for _, c := range cases {
		if got := resetString(c.d); got != c.want {
			t.Errorf("resetString(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}

func TestLimitErrorShapes(t *testing.T) {
	st := keylimits.Status{Requests: &keylimits.BucketStatus{Limit: 300}, Tokens: &keylimits.BucketStatus{Limit: 1000, Remaining: 7}}
	cases := []struct {
		d     keylimits.Decision
		typ   string
		retry int
	}{
		{keylimits.Decision{Reason: keylimits.ReasonRequests, RetryAfter: 200 * time.Millisecond, Status: st}, "requests", 1},
		{keylimits.Decision{Reason: keylimits.ReasonTokens, RetryAfter: 2100 * time.Millisecond, Status: st}, "tokens", 3},
		{keylimits.Decision{Reason: keylimits.ReasonConcurrency, Status: st}, "requests", 1},
	}
	for _, c := range cases {
		e := limitError("k", c.d)
		w := e.wire()
		if e.Status != http.StatusTooManyRequests || w.Error.Type != c.typ || w.Error.Code != "rate_limit_exceeded" || e.RetryAfter != c.retry {
			t.Errorf("%s: %+v retry %d", c.d.Reason, w.Error, e.RetryAfter)
		}
	}
}
