package server

import (
	"bufio"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/router"
)

const messagesStreamBody = `{"model":"test-model","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"x"}]}`

// An Anthropic stream's first token is its first content_block_delta, not message_start
// (which vLLM sends before any token); a stream that ends with message_stop is complete and
// gets nothing appended; a broken one ends with an Anthropic error event.
func TestMessagesStreamFirstTokenAndEnd(t *testing.T) {
	opening := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":0}}}\n\n"
	first := "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n"
	end := "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	release := make(chan struct{})
	up := pausedStream(t, pathMessages, opening, release, func(r *http.Request) string {
		if strings.Contains(r.Header.Get("X-Test"), "break") {
			return first // ends without message_stop
		}
		return first + end
	})
	spy := &spyRouter{Router: routerFor(t, &router.RoundRobin{})}
	g := startGatewayWith(t, testGatewayConfig(up.URL), spy, nil)

	rest := readPastOpening(t, g.url+pathMessages, messagesStreamBody, "event: message_start\n", spy, release)
	if !strings.HasSuffix(rest, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") {
		t.Errorf("the gateway changed a complete stream's end: %q", rest)
	}

	// A worker that breaks off: the client gets an Anthropic error event.
	req, _ := http.NewRequest(http.MethodPost, g.url+pathMessages, strings.NewReader(messagesStreamBody))
	req.Header.Set("X-Test", "break")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&all)
	resp.Body.Close()
	if s := all.String(); !strings.Contains(s, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\"") || strings.Contains(s, "[DONE]") {
		t.Errorf("broken stream ends %q", s)
	}
}

// The gateway's own errors on the Messages routes are Anthropic-shaped, with vLLM's status and
// Anthropic's type for it.
func TestMessagesErrorShape(t *testing.T) {
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	g := startGateway(t, nil, up.URL)
	cases := []struct {
		path, body string
		status     int
		typ        string
	}{
		{pathMessages, `{"model":"nope","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, 404, "not_found_error"},
		{pathMessages, `{"model":"test-model","messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error"},
		{pathCountTokens, `{"model":"test-model","messages":[{"role":"user","content":[{"type":"document"}]}]}`, 400, "invalid_request_error"},
	}
	for _, tc := range cases {
		resp, body := g.post(t, tc.path, tc.body, nil)
		want := `{"type":"error","error":{"type":"` + tc.typ + `","message":`
		if resp.StatusCode != tc.status || !strings.HasPrefix(string(body), want) {
			t.Errorf("%s %s: %d %s", tc.path, tc.body, resp.StatusCode, body)
		}
	}
}

// count_tokens goes to a worker with anthropic.count_tokens: forward, and also in local mode
// when the gateway has no tokenizer (no enricher).
func TestCountTokensForwarded(t *testing.T) {
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != pathCountTokens {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"input_tokens":42}`))
	})
	body := `{"model":"test-model","messages":[{"role":"user","content":"x"}]}`
	for _, mode := range []string{"forward", "local"} {
		g := startGateway(t, func(c *configs.Config) { c.Anthropic.CountTokens = mode }, up.URL)
		resp, data := g.post(t, pathCountTokens, body, nil)
		if resp.StatusCode != http.StatusOK || string(data) != `{"input_tokens":42}` {
			t.Errorf("%s: %d %s", mode, resp.StatusCode, data)
		}
	}
}
