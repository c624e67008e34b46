package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/kvgate/kvgate/router"
)

const (
	responsesOpening = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n" +
		"event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n"
	responsesOutput = "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,\"item\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":3,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"x\"}\n\n"
	responsesEnd = "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":4,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1,\"total_tokens\":4}}}\n\n"
)

// A Responses stream's first token is its first delta, not response.created or
// response.in_progress, which vLLM sends before the prefill: the routing side hears
// FirstToken once, when the delta comes.
func TestResponsesStreamFirstToken(t *testing.T) {
	release := make(chan struct{})
	up := pausedStream(t, pathResponses, responsesOpening, release, func(*http.Request) string { return responsesOutput + responsesEnd })
	spy := &spyRouter{Router: routerFor(t, &router.RoundRobin{})}
	g := startGatewayWith(t, testGatewayConfig(up.URL), spy, nil)

	body := `{"model":"test-model","input":"x","stream":true,"max_output_tokens":4}`
	if rest := readPastOpening(t, g.url+pathResponses, body, "event: response.created\n", spy, release); !strings.HasSuffix(rest, responsesEnd) {
		t.Errorf("stream ends %q", rest)
	}
}

// isResponsesToken: deltas of any kind, the end and errors carry output; the opening events do
// not. The type comes from the event field, or the data's JSON when a server sends none.
func TestIsResponsesToken(t *testing.T) {
	tests := []struct {
		name string
		ev   string
		want bool
	}{
		{"created", "event: response.created\ndata: {\"type\":\"response.created\"}\n\n", false},
		{"in progress", "event: response.in_progress\ndata: {}\n\n", false},
		{"output item opened", "event: response.output_item.added\ndata: {}\n\n", false},
		{"text delta", "event: response.output_text.delta\ndata: {}\n\n", true},
		{"reasoning delta", "event: response.reasoning_text.delta\ndata: {}\n\n", true},
		{"function call arguments", "event: response.function_call_arguments.delta\ndata: {}\n\n", true},
		{"completed without a delta", "event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n", true},
		{"error", "event: error\ndata: {\"type\":\"error\"}\n\n", true},
		{"data only, opening", "data: {\"type\":\"response.in_progress\",\"sequence_number\":1}\n\n", false},
		{"data only, delta", "data: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n", true},
		{"CRLF lines", "event: response.output_text.delta\r\ndata: {}\r\n\r\n", true},
		{"CRLF end without a delta", "event: response.incomplete\r\ndata: {}\r\n\r\n", true},
		{"data only, end", "data: {\"type\":\"response.failed\"}\n\n", true},
		{"not JSON", "data: hello\n\n", false},
	}
	for _, tc := range tests {
		if got := isResponsesToken([]byte(tc.ev)); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// holdResponsesOpening reads until a complete event with output is held, however the bytes
// arrive (here one at a time), and stops at the body's end without one.
func TestHoldResponsesOpening(t *testing.T) {
	tests := []struct {
		name     string
		stream   string
		wantHeld string // the bytes held when it returns
		wantErr  error
	}{
		{"up to the first delta", responsesOpening + responsesOutput + responsesEnd, responsesOpening + responsesOutput, nil},
		{"CRLF framing", strings.ReplaceAll(responsesOpening+responsesOutput, "\n", "\r\n"), strings.ReplaceAll(responsesOpening+responsesOutput, "\n", "\r\n"), nil},
		{"a delta still arriving is not output", responsesOpening + strings.TrimSuffix(responsesOutput, "\n"), responsesOpening + strings.TrimSuffix(responsesOutput, "\n"), io.EOF},
		{"the body ends after the opening", responsesOpening, responsesOpening, io.EOF},
	}
	for _, tc := range tests {
		body := iotest.OneByteReader(strings.NewReader(tc.stream))
		buf := make([]byte, 8)
		n, err := body.Read(buf)
		buf, n, err = holdResponsesOpening(body, buf, n, err)
		if string(buf[:n]) != tc.wantHeld || err != tc.wantErr {
			t.Errorf("%s: held %q, err %v; want %q, %v", tc.name, buf[:n], err, tc.wantHeld, tc.wantErr)
		}
	}
}
