package server

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/router"
)

// A Responses stream's first token is its first delta, not response.created or
// response.in_progress, which vLLM sends before the prefill: the routing side hears
// FirstToken once, when the delta comes.
func TestResponsesStreamFirstToken(t *testing.T) {
	release := make(chan struct{})
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != pathResponses {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		_, _ = w.Write([]byte("event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n" +
			"event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n"))
		f.Flush()
		<-release
		_, _ = w.Write([]byte("event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,\"item\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":3,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"x\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":4,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1,\"total_tokens\":4}}}\n\n"))
		f.Flush()
	})
	spy := &spyRouter{Router: routerFor(t, &router.RoundRobin{})}
	g := startGatewayWith(t, testGatewayConfig(up.URL), spy, nil)

	body := `{"model":"test-model","input":"x","stream":true,"max_output_tokens":4}`
	req, _ := http.NewRequest(http.MethodPost, g.url+pathResponses, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, _ := rd.ReadString('\n'); line != "event: response.created\n" {
		t.Fatalf("first line %q", line)
	}
	time.Sleep(20 * time.Millisecond)
	if n := spy.first.Load(); n != 0 {
		t.Errorf("FirstToken fired before the first delta (%d)", n)
	}
	close(release)
	var rest strings.Builder
	_, _ = rd.WriteTo(&rest)
	if n := spy.first.Load(); n != 1 {
		t.Errorf("FirstToken fired %d times, want once", n)
	}
	if !strings.Contains(rest.String(), "event: response.completed\n") {
		t.Errorf("stream ends %q", rest.String())
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
		{"not JSON", "data: hello\n\n", false},
	}
	for _, tc := range tests {
		if got := isResponsesToken([]byte(tc.ev)); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// holdsResponsesToken looks only at complete events: a delta still arriving holds on.
func TestHoldsResponsesToken(t *testing.T) {
	const created = "event: response.created\ndata: {}\n\n"
	tests := []struct {
		name string
		b    string
		want bool
	}{
		{"opening only", created + "event: response.in_progress\ndata: {}\n\n", false},
		{"a delta after the opening", created + "event: response.output_text.delta\ndata: {}\n\n", true},
		{"a delta not yet complete", created + "event: response.output_text.delta\ndata: {", false},
		{"CRLF events", "event: response.created\r\ndata: {}\r\n\r\nevent: response.output_text.delta\r\ndata: {}\r\n\r\n", true},
		{"empty", "", false},
	}
	for _, tc := range tests {
		if got := holdsResponsesToken([]byte(tc.b)); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
