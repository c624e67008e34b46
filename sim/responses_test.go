package sim

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func postJSON(t *testing.T, method, url, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestResponsesStore: a stored response continues on its own worker; on another worker, or
// with store false, the follow-up is vLLM's 404 (responses/serving.py, _make_not_found_error);
// GET returns the stored object; cancel of a synchronous response is vLLM's 400.
func TestResponsesStore(t *testing.T) {
	_, a := startWorker(t, Options{ServedModelName: "m"})
	_, b := startWorker(t, Options{ServedModelName: "m"})
	code, body := postJSON(t, http.MethodPost, a+"/v1/responses", `{"model":"m","instructions":"S","input":"one two three","max_output_tokens":3}`)
	var r1 struct {
		ID, Object, Status string
		Usage              struct {
			InputTokens int `json:"input_tokens"`
		}
	}
	if err := json.Unmarshal(body, &r1); code != 200 || err != nil || r1.Object != "response" || r1.Status != "completed" {
		t.Fatalf("%d %s", code, body)
	}
	follow := `{"model":"m","input":"four","max_output_tokens":2,"previous_response_id":"` + r1.ID + `"}`
	code, body = postJSON(t, http.MethodPost, a+"/v1/responses", follow)
	var r2 struct {
		Usage struct {
			InputTokens int `json:"input_tokens"`
		}
	}
	_ = json.Unmarshal(body, &r2)
	// The follow-up's prompt holds the first turn's input (minus its system message), its
	// output and the new input: longer than the first prompt.
	if code != 200 || r2.Usage.InputTokens <= r1.Usage.InputTokens {
		t.Fatalf("follow-up on the storing worker: %d %s (first prompt %d tokens)", code, body, r1.Usage.InputTokens)
	}
	want := `{"error":{"message":"Response with id '` + r1.ID + `' not found.","type":"invalid_request_error","param":"response_id","code":404}}`
	if code, body = postJSON(t, http.MethodPost, b+"/v1/responses", follow); code != 404 || string(body) != want {
		t.Fatalf("follow-up on another worker: %d %s", code, body)
	}
	if code, body = postJSON(t, http.MethodGet, a+"/v1/responses/"+r1.ID, ""); code != 200 || !strings.Contains(string(body), r1.ID) {
		t.Errorf("GET: %d %s", code, body)
	}
	if code, _ = postJSON(t, http.MethodPost, a+"/v1/responses/"+r1.ID+"/cancel", ""); code != 400 {
		t.Errorf("cancel: %d", code)
	}
	_, body = postJSON(t, http.MethodPost, a+"/v1/responses", `{"model":"m","input":"x","store":false,"max_output_tokens":1}`)
	var r3 struct{ ID string }
	_ = json.Unmarshal(body, &r3)
	if code, _ = postJSON(t, http.MethodGet, a+"/v1/responses/"+r3.ID, ""); code != 404 {
		t.Errorf("GET of an unstored response: %d", code)
	}
}

// TestResponsesIgnoreEOS: ignore_eos (ResponsesRequest.ignore_eos, vLLM's
// vllm/entrypoints/openai/responses/protocol.py) makes a Responses request generate its
// max_output_tokens instead of stopping at the simulated natural length.
func TestResponsesIgnoreEOS(t *testing.T) {
	_, a := startWorker(t, Options{ServedModelName: "m", OutputLen: 2})
	for _, tc := range []struct {
		ignore bool
		want   func(n int) bool
	}{
		{true, func(n int) bool { return n == 40 }},
		{false, func(n int) bool { return n < 40 }},
	} {
		body := `{"model":"m","input":"one two three","max_output_tokens":40,"store":false,"ignore_eos":` + map[bool]string{true: "true", false: "false"}[tc.ignore] + `}`
		code, out := postJSON(t, http.MethodPost, a+"/v1/responses", body)
		var r struct {
			Usage struct {
				OutputTokens int `json:"output_tokens"`
			}
		}
		if err := json.Unmarshal(out, &r); code != 200 || err != nil || !tc.want(r.Usage.OutputTokens) {
			t.Errorf("ignore_eos %v: %d %s", tc.ignore, code, out)
		}
	}
}

// TestResponsesStreamOpensItemWithFirstDelta: as vLLM's responses_stream_generator, a stream
// sends response.created and response.in_progress at once and opens its output item (and
// content part) only with the first delta, after the prefill: a gateway that times the first
// token by the first byte would see none of the prefill.
func TestResponsesStreamOpensItemWithFirstDelta(t *testing.T) {
	const ttft = 300 * time.Millisecond
	_, a := startWorker(t, Options{ServedModelName: "m", TTFT: ttft, Speedup: 1})
	req, _ := http.NewRequest(http.MethodPost, a+"/v1/responses", strings.NewReader(`{"model":"m","input":"one two","max_output_tokens":2,"stream":true,"store":false}`))
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	type seen struct {
		typ string
		at  time.Duration
	}
	var events []seen
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if typ, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			events = append(events, seen{typ, time.Since(start)})
		}
	}
	var types []string
	for _, e := range events {
		types = append(types, e.typ)
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added response.output_text.delta"
	if got := strings.Join(types, " "); !strings.HasPrefix(got, want) {
		t.Fatalf("events %s, want them to begin %s", got, want)
	}
	if events[1].at > ttft/2 || events[2].at < ttft/2 {
		t.Errorf("in_progress at %s, output_item.added at %s: want the first before the %s prefill ends, the second after", events[1].at, events[2].at, ttft)
	}
}
