package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/internal/testport"
	"github.com/kvgate/kvgate/sim"
)

// kvgate serve on SIGTERM (its context ending, as main's signal context does): /ready turns
// 503 first while /live stays 200 and new requests, on new connections, still succeed for
// shutdown_drain_delay; then the listener closes; streams still running at shutdown_timeout
// end with an error event in their API's shape (OpenAI through go-openai, Anthropic on
// /v1/messages) and serve returns cleanly.
func TestServeDrainsOnSignal(t *testing.T) {
	const (
		drainDelay      = 1500 * time.Millisecond
		shutdownTimeout = 1 * time.Second
	)
	w, err := sim.New(sim.Options{ServedModelName: "m", TTFT: time.Millisecond, ITL: 20 * time.Millisecond, OutputLen: -1,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ws := httptest.NewServer(w.Handler())
	t.Cleanup(func() { ws.CloseClientConnections(); ws.Close(); _ = w.Close() })
	addr := testport.Addr(t)
	base := "http://" + addr

	ctx, sigterm := context.WithCancel(context.Background())
	defer sigterm()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--model", "m", "--worker", ws.URL, "--listen", addr, "--log-level", "error",
			"--shutdown-drain-delay", drainDelay.String(), "--shutdown-timeout", shutdownTimeout.String()}, io.Discard, io.Discard)
	}()
	waitUp(t, base+"/live")
	// Every request on its own connection: during the drain, new connections must be accepted.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	get := func(path string) (int, string) {
		resp, err := fresh.Get(base + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/ready"); code != http.StatusOK {
		t.Fatalf("/ready before the signal: %d %s", code, body)
	}
	cc := openai.DefaultConfig("none")
	cc.BaseURL = base + "/v1"
	cc.HTTPClient = fresh
	client := openai.NewClientWithConfig(cc)

	// Two streams that would run for 20 s: they are still running at the shutdown deadline.
	st, err := client.CreateChatCompletionStream(context.Background(), openai.ChatCompletionRequest{Model: "m", MaxCompletionTokens: 1000,
		Stream: true, Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "x"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	msgs, err := fresh.Post(base+"/v1/messages", "application/json", strings.NewReader(
		`{"model":"m","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer msgs.Body.Close()
	msgEvents := bufio.NewReader(msgs.Body)
	if line, err := msgEvents.ReadString('\n'); err != nil || line != "event: message_start\n" {
		t.Fatalf("messages stream opened with %q, %v", line, err)
	}
	// Both streams are read to their end meanwhile.
	type ending struct {
		err  error  // go-openai's last Recv error
		tail string // the Messages stream's last bytes
		at   time.Time
	}
	openaiEnd, messagesEnd := make(chan ending, 1), make(chan ending, 1)
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				openaiEnd <- ending{err: err, at: time.Now()}
				return
			}
		}
	}()
	go func() {
		rest, _ := io.ReadAll(msgEvents)
		messagesEnd <- ending{tail: string(rest[max(0, len(rest)-300):]), at: time.Now()}
	}()

	signalled := time.Now()
	sigterm()
	// /ready turns 503 at once, naming the drain.
	var code int
	var body string
	for code, body = get("/ready"); code == http.StatusOK && time.Since(signalled) < drainDelay/2; code, body = get("/ready") {
		time.Sleep(5 * time.Millisecond)
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `{"component":"server","reason":"draining`) {
		t.Fatalf("/ready after the signal: %d %s", code, body)
	}
	// While the drain delay runs: live, and new requests on new connections are served.
	for i := 0; time.Since(signalled) < drainDelay*2/3; i++ {
		if code, body := get("/live"); code != http.StatusOK {
			t.Fatalf("/live during the drain: %d %s", code, body)
		}
		resp, err := client.CreateChatCompletion(context.Background(), openai.ChatCompletionRequest{Model: "m", MaxCompletionTokens: 2,
			Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "during the drain"}}})
		if err != nil || len(resp.Choices) != 1 {
			t.Fatalf("request %d during the drain (%s after the signal): %v", i, time.Since(signalled), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Then the listener closes, before the streams are cut.
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			break
		}
		c.Close()
		if time.Since(signalled) > drainDelay+shutdownTimeout {
			t.Fatal("the listener still accepts after the drain delay and the shutdown deadline")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if closed := time.Since(signalled); closed < drainDelay {
		t.Errorf("listener closed %s after the signal, before the drain delay %s", closed, drainDelay)
	}

	oe := <-openaiEnd
	var apiErr *openai.APIError
	if !errors.As(oe.err, &apiErr) || apiErr.Type != "ServiceUnavailableError" || !strings.Contains(apiErr.Message, "shutting down") {
		t.Errorf("OpenAI stream ended with %v, want the shutdown error event", oe.err)
	}
	me := <-messagesEnd
	wantTail := "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"kvgate is shutting down"
	if !strings.Contains(me.tail, wantTail) || !strings.HasSuffix(me.tail, "\"}}\n\n") {
		t.Errorf("Messages stream ended %q, want an overloaded_error event", me.tail)
	}
	for name, end := range map[string]time.Time{"OpenAI": oe.at, "Messages": me.at} {
		if d := end.Sub(signalled); d < drainDelay+shutdownTimeout-100*time.Millisecond {
			t.Errorf("%s stream ended %s after the signal, before the drain delay and shutdown timeout (%s)", name, d, drainDelay+shutdownTimeout)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not return")
	}
	// The cut reaches the worker as its requests' contexts ending, which it counts on its own
	// goroutines: by then serve has returned, but the worker may not have counted both yet.
	var cancelled int
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if cancelled = int(w.Stats().Cancelled); cancelled >= 2 || time.Now().After(end) {
			break
		}
	}
	if cancelled != 2 {
		t.Errorf("the worker saw %d cancelled requests, want the 2 cut streams", cancelled)
	}
}
