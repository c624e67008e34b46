package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	openai "github.com/sashabaranov/go-openai"
)

// startWorker runs a worker behind an httptest server and returns its base URL.
func startWorker(t *testing.T, o Options) (*Worker, string) {
	t.Helper()
	if o.Speedup == 0 {
		o.Speedup = 1000
	}
	w, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(w.Handler())
	t.Cleanup(func() {
		srv.Close()
		if err := w.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return w, srv.URL
}

func newClient(base string) *openai.Client {
	cfg := openai.DefaultConfig("none")
	cfg.BaseURL = base + "/v1"
	return openai.NewClientWithConfig(cfg)
}

func TestGoOpenAIChatAndCompletions(t *testing.T) {
	_, base := startWorker(t, Options{ServedModelName: "m", TTFT: 5 * time.Millisecond, ITL: time.Millisecond, Speedup: 1})
	c := newClient(base)
	ctx := context.Background()
	msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "hello there general kenobi"}}

	tests := []struct {
		name   string
		stream bool
		chat   bool
		maxTok int
	}{
		{"chat non-stream", false, true, 7},
		{"chat stream", true, true, 9},
		{"completion non-stream", false, false, 5},
		{"completion stream", true, false, 6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var text strings.Builder
			var usage *openai.Usage
			var finish string
			switch {
			case tc.chat && !tc.stream:
				r, err := c.CreateChatCompletion(ctx, openai.ChatCompletionRequest{Model: "m", Messages: msgs, MaxCompletionTokens: tc.maxTok})
				if err != nil {
					t.Fatal(err)
				}
				text.WriteString(r.Choices[0].Message.Content)
				usage, finish = &r.Usage, string(r.Choices[0].FinishReason)
				if r.Object != "chat.completion" || !strings.HasPrefix(r.ID, "chatcmpl-") {
					t.Errorf("object %q id %q", r.Object, r.ID)
				}
			case tc.chat && tc.stream:
				s, err := c.CreateChatCompletionStream(ctx, openai.ChatCompletionRequest{Model: "m", Messages: msgs, MaxCompletionTokens: tc.maxTok,
					Stream: true, StreamOptions: &openai.StreamOptions{IncludeUsage: true}})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				first := true
				for {
					ch, err := s.Recv()
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					if first && (len(ch.Choices) != 1 || ch.Choices[0].Delta.Role != "assistant") {
						t.Errorf("first chunk %+v lacks the assistant role", ch)
					}
					first = false
					if ch.Usage != nil {
						usage = ch.Usage
					}
					for _, cc := range ch.Choices {
						text.WriteString(cc.Delta.Content)
						if cc.FinishReason != "" {
							finish = string(cc.FinishReason)
						}
					}
				}
			case !tc.chat && !tc.stream:
				r, err := c.CreateCompletion(ctx, openai.CompletionRequest{Model: "m", Prompt: "once upon a time", MaxTokens: tc.maxTok})
				if err != nil {
					t.Fatal(err)
				}
				text.WriteString(r.Choices[0].Text)
				usage, finish = r.Usage, r.Choices[0].FinishReason
			default:
				s, err := c.CreateCompletionStream(ctx, openai.CompletionRequest{Model: "m", Prompt: "once upon a time", MaxTokens: tc.maxTok,
					Stream: true, StreamOptions: &openai.StreamOptions{IncludeUsage: true}})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				for {
					ch, err := s.Recv()
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					if ch.Usage != nil {
						usage = ch.Usage
					}
					for _, cc := range ch.Choices {
						text.WriteString(cc.Text)
						if cc.FinishReason != "" {
							finish = cc.FinishReason
						}
					}
				}
			}
			if usage == nil || usage.CompletionTokens != tc.maxTok || usage.TotalTokens != usage.PromptTokens+tc.maxTok || usage.PromptTokens == 0 {
				t.Errorf("usage = %+v, want %d completion tokens", usage, tc.maxTok)
			}
			if finish != "length" {
				t.Errorf("finish_reason = %q, want length", finish)
			}
			if got := len(strings.Fields(text.String())); got != tc.maxTok {
				t.Errorf("got %d filler words %q, want %d", got, text.String(), tc.maxTok)
			}
		})
	}
}

func TestStreamChunkShape(t *testing.T) {
	_, base := startWorker(t, Options{ServedModelName: "m", TTFT: time.Millisecond, ITL: time.Millisecond})
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content type %q", ct)
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); line != "" {
			events = append(events, line)
		}
	}
	if len(events) != 5 { // role, 2 content (last with finish), usage, [DONE]
		t.Fatalf("got %d events: %q", len(events), events)
	}
	// vLLM's exact key order and nulls (vllm/entrypoints/openai/serving_chat.py).
	wantPrefix := []string{
		`data: {"id":"chatcmpl-`,
		`data: {"id":"chatcmpl-`,
		`data: {"id":"chatcmpl-`,
		`data: {"id":"chatcmpl-`,
		`data: [DONE]`,
	}
	wantSuffix := []string{
		`"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		`"choices":[{"index":0,"delta":{"content":"The"},"logprobs":null,"finish_reason":null}]}`,
		`"choices":[{"index":0,"delta":{"content":" quick"},"logprobs":null,"finish_reason":"length","stop_reason":null}]}`,
		`"choices":[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}`,
		`data: [DONE]`,
	}
	for i, ev := range events {
		if !strings.HasPrefix(ev, wantPrefix[i]) || !strings.HasSuffix(ev, wantSuffix[i]) {
			t.Errorf("event %d = %s\nwant prefix %s and suffix %s", i, ev, wantPrefix[i], wantSuffix[i])
		}
		if i < 4 {
			var m map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &m); err != nil {
				t.Errorf("event %d not JSON: %v", i, err)
			}
			if m["object"] != "chat.completion.chunk" || m["model"] != "m" {
				t.Errorf("event %d object/model = %v/%v", i, m["object"], m["model"])
			}
		}
	}
}

func TestErrors(t *testing.T) {
	_, base := startWorker(t, Options{ServedModelName: "m", MaxModelLen: 64, TTFT: time.Millisecond, ITL: time.Millisecond})
	tests := []struct {
		name, path, body string
		status           int
		typ, msg         string
	}{
		{"unknown model", "/v1/chat/completions", `{"model":"x","messages":[{"role":"user","content":"hi"}]}`, 404, "NotFoundError", "The model `x` does not exist."},
		{"bad json", "/v1/chat/completions", `{"model":`, 400, "BadRequestError", "invalid JSON"},
		{"no messages", "/v1/chat/completions", `{"model":"m"}`, 400, "BadRequestError", "messages"},
		{"stream options without stream", "/v1/completions", `{"model":"m","prompt":"a","stream_options":{"include_usage":true}}`, 400, "BadRequestError", "Stream options can only be defined when `stream=True`."},
		{"empty salt", "/v1/completions", `{"model":"m","prompt":"a","cache_salt":""}`, 400, "BadRequestError", "cache_salt"},
		{"too long", "/v1/completions", `{"model":"m","prompt":"a b c","max_tokens":100}`, 400, "BadRequestError", "maximum context length is 64 tokens"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post(base+tc.path, "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var eb errorBody
			if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || eb.Error.Type != tc.typ || eb.Error.Code != tc.status || !strings.Contains(eb.Error.Message, tc.msg) {
				t.Errorf("got %d %+v, want %d %s containing %q", resp.StatusCode, eb.Error, tc.status, tc.typ, tc.msg)
			}
		})
	}
}

func TestClientDisconnectReachesWorker(t *testing.T) {
	done := make(chan RequestRecord, 1)
	w, base := startWorker(t, Options{ServedModelName: "m", TTFT: time.Millisecond, ITL: 20 * time.Millisecond, Speedup: 1,
		OnRequestDone: func(r RequestRecord) { done <- r }})
	ctx, cancel := context.WithCancel(context.Background())
	s, err := newClient(base).CreateChatCompletionStream(ctx, openai.ChatCompletionRequest{Model: "m", Stream: true, MaxCompletionTokens: 1000,
		Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "long story please"}}})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	s.Close()
	select {
	case r := <-done:
		if r.FinishReason != "abort" || r.OutputTokens >= 1000 {
			t.Errorf("record %+v, want an aborted request", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("engine never saw the cancel")
	}
	if got := w.Stats().Cancelled; got != 1 {
		t.Errorf("Stats().Cancelled = %d, want 1", got)
	}
}

func TestModelsHealthMetrics(t *testing.T) {
	_, base := startWorker(t, Options{ServedModelName: "m", LoRAModules: []string{"sql-lora"}})
	models, err := newClient(base).ListModels(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Models) != 2 || models.Models[0].ID != "m" || models.Models[1].ID != "sql-lora" || models.Models[0].OwnedBy != "vllm" {
		t.Errorf("models = %+v", models.Models)
	}
	resp, err := http.Get(base + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", err, resp)
	}
	resp.Body.Close()
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{`vllm:num_requests_running{engine="0",model_name="m"} 0`, `vllm:num_requests_waiting{engine="0",model_name="m"} 0`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0`, `vllm:prefix_cache_queries_total{engine="0",model_name="m"} 0`,
		`vllm:prefix_cache_hits_total{engine="0",model_name="m"} 0`,
		`vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="4096",sliding_window="None"} 1`} {
		if !strings.Contains(string(b), name) {
			t.Errorf("metrics lack %s", name)
		}
	}
}

// testCounter sums a counter vector.
func testCounter(t *testing.T, c *prometheus.CounterVec) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 16)
	c.Collect(ch)
	close(ch)
	var sum float64
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		sum += pb.GetCounter().GetValue()
	}
	return sum
}

// TestContinuousUsageStats: stream_options.continuous_usage_stats puts usage on every chunk,
// completion_tokens counting up.
func TestContinuousUsageStats(t *testing.T) {
	_, base := startWorker(t, Options{ServedModelName: "m", TTFT: time.Millisecond, ITL: time.Millisecond})
	body := `{"model":"m","prompt":"a b c","max_tokens":3,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got []int
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var c struct {
			Usage *usageInfo `json:"usage"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatal(err)
		}
		if c.Usage == nil {
			t.Fatalf("chunk without usage: %s", line)
		}
		got = append(got, c.Usage.CompletionTokens)
	}
	if want := []int{1, 2, 3, 3}; !slices.Equal(got, want) {
		t.Errorf("completion_tokens per chunk %v, want %v", got, want)
	}
}

// Request and response ids are unique across workers, also for workers started in the same
// second (vLLM's are random uuids): a gateway keys its Responses pins by them.
func TestIDsUniqueAcrossWorkers(t *testing.T) {
	seen := map[string]bool{}
	for range 3 {
		w, err := New(Options{ServedModelName: "m"})
		if err != nil {
			t.Fatal(err)
		}
		for range 4 {
			id := w.newID()
			if seen[id] {
				t.Fatalf("id %s given twice", id)
			}
			seen[id] = true
		}
		_ = w.Close()
	}
}
