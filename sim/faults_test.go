package sim

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
)

func TestOffsetEndpoint(t *testing.T) {
	tests := []struct {
		ep   string
		rank int
		want string
		bind bool
		err  bool
	}{
		{"tcp://*:5557", 0, "tcp://*:5557", true, false},
		{"tcp://*:5557", 1, "tcp://*:5558", true, false},
		{"tcp://10.0.0.1:5557", 2, "tcp://10.0.0.1:5559", false, false},
		{"tcp://[::]:5557", 1, "tcp://[::]:5558", true, false},
		{"tcp://*:0", 3, "tcp://*:0", true, false},
		{"tcp://127.0.0.1:*", 0, "tcp://127.0.0.1:*", true, false},
		{"tcp://127.0.0.1:*", 1, "tcp://127.0.0.1:*", true, false}, // like port 0 (vLLM itself fails on it)
		{"inproc://ev", 1, "inproc://ev_dp1", true, false},
		{"ipc:///tmp/ev", 0, "ipc:///tmp/ev", true, false},
		{"ipc:///tmp/ev", 1, "", true, true},
	}
	for _, tc := range tests {
		got, err := offsetEndpoint(tc.ep, tc.rank)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("offsetEndpoint(%q, %d) = %q, %v; want %q (error %v)", tc.ep, tc.rank, got, err, tc.want, tc.err)
		}
		if b := shouldBind(tc.ep); b != tc.bind {
			t.Errorf("shouldBind(%q) = %v, want %v", tc.ep, b, tc.bind)
		}
	}
}

func chatStreamBody(maxTokens int) string {
	return `{"model":"m","messages":[{"role":"user","content":"tell me a story"}],"stream":true,"max_tokens":` + itoa(maxTokens) + `}`
}

func TestFailBeforeFirstByte(t *testing.T) {
	tests := []struct {
		name   string
		status int
	}{{"connection closed", 0}, {"http 503", 503}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, base := startWorker(t, Options{ServedModelName: "m", FailBeforeFirstByte: true, Faults: Faults{FailStatus: tc.status}})
			resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(chatStreamBody(3)))
			if tc.status == 0 {
				if err == nil {
					resp.Body.Close()
					t.Fatalf("got status %d, want a dropped connection", resp.StatusCode)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != tc.status {
					t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
				}
			}
			if s := w.Stats(); s.InjectedFailures != 1 || s.Requests != 0 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

func TestDieMidStream(t *testing.T) {
	w, base := startWorker(t, Options{ServedModelName: "m", DieMidStreamAfter: 3, TTFT: time.Millisecond, ITL: time.Millisecond})
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(chatStreamBody(50)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var content, done int
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, `"content":"`) && !strings.Contains(line, `"role"`):
			content++
		case line == "data: [DONE]":
			done++
		}
	}
	if content != 3 || done != 0 {
		t.Errorf("got %d content chunks and %d [DONE], want 3 and none", content, done)
	}
	// The go-openai client sees an error, not a clean end.
	s, err := newClient(base).CreateChatCompletionStream(context.Background(), openai.ChatCompletionRequest{Model: "m", Stream: true,
		MaxCompletionTokens: 50, Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "x"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for {
		_, err := s.Recv()
		if errors.Is(err, io.EOF) {
			t.Fatal("stream ended cleanly, want an error")
		}
		if err != nil {
			break
		}
	}
	if got := w.Stats().DiedMidStream; got != 2 {
		t.Errorf("DiedMidStream = %d, want 2", got)
	}
}

// TestSkipSeqAndRestart: the skip fault leaves holes in the sequence; the restart fault
// starts the publisher over at seq 0 with the prefix cache gone.
func TestSkipSeqAndRestart(t *testing.T) {
	kv := KVEventsConfig{EnableKVCacheEvents: true, Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"}
	body := func(i int) string {
		return `{"model":"m","prompt":"w` + itoa(i) + ` a b c d e f g h","max_tokens":1}`
	}
	t.Run("skip", func(t *testing.T) {
		w, base := startWorker(t, Options{ServedModelName: "m", BlockSize: 4, KVEvents: kv, Faults: Faults{SkipSeqEvery: 2},
			TTFT: time.Millisecond, ITL: time.Millisecond})
		sub := subscribe(t, w.EventEndpoints()[0].Endpoint)
		var seqs []uint64
		for i := range 4 {
			post(t, base+"/v1/completions", body(i), nil)
			m, _ := decodeNext(t, sub)
			seqs = append(seqs, m.Seq)
		}
		if want := []uint64{0, 1, 3, 4}; !equalU64(seqs, want) {
			t.Errorf("seqs %v, want %v", seqs, want)
		}
	})
	t.Run("restart", func(t *testing.T) {
		records := make(chan RequestRecord, 8)
		w, base := startWorker(t, Options{ServedModelName: "m", BlockSize: 4, KVEvents: kv, Speedup: 1,
			Faults: Faults{RestartPublisherEvery: 300 * time.Millisecond}, TTFT: time.Millisecond, ITL: time.Millisecond,
			OnRequestDone: func(r RequestRecord) { records <- r }})
		sub := subscribe(t, w.EventEndpoints()[0].Endpoint)
		post(t, base+"/v1/completions", body(0), nil)
		post(t, base+"/v1/completions", body(1), nil)
		m0, _ := decodeNext(t, sub)
		m1, _ := decodeNext(t, sub)
		<-records
		if r := <-records; r.CachedTokens != 0 || m0.Seq != 0 || m1.Seq != 1 {
			t.Fatalf("before restart: seqs %d %d", m0.Seq, m1.Seq)
		}
		time.Sleep(400 * time.Millisecond)
		post(t, base+"/v1/completions", body(0), nil)
		m, _ := decodeNext(t, sub)
		if r := <-records; m.Seq != 0 || r.CachedTokens != 0 || r.FinishReason != "length" {
			t.Errorf("after restart: seq %d, record %+v; want seq 0 and a cold cache", m.Seq, r)
		}
	})
}

func equalU64(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestStall: a stalled engine delays the first token by at least the stall.
func TestStall(t *testing.T) {
	_, base := startWorker(t, Options{ServedModelName: "m", Speedup: 1, TTFT: time.Millisecond, ITL: time.Millisecond,
		Faults: Faults{StallEvery: time.Millisecond, StallFor: 150 * time.Millisecond}})
	time.Sleep(5 * time.Millisecond)
	start := time.Now()
	post(t, base+"/v1/completions", `{"model":"m","prompt":"a b","max_tokens":1}`, nil)
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("request took %v through a 150ms stall", d)
	}
}

// TestQueueFull: beyond max-num-seqs running plus MaxWaiting queued, requests get 503.
func TestQueueFull(t *testing.T) {
	w, base := startWorker(t, Options{ServedModelName: "m", MaxNumSeqs: 1, MaxWaiting: 1, Speedup: 1,
		TTFT: time.Millisecond, ITL: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 2 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions",
			strings.NewReader(`{"model":"m","prompt":"a","max_tokens":100,"stream":true}`))
		go func() {
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.Stats().Requests < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if st := post(t, base+"/v1/completions", `{"model":"m","prompt":"a","max_tokens":1}`, nil); st != http.StatusServiceUnavailable {
		t.Errorf("third request: status %d, want 503", st)
	}
}

// TestNoMaxTokensFillsContext: without max_tokens and EOS the output runs to the context
// limit, which the default max-model-len keeps within the KV pool (no self-preemption loop).
func TestNoMaxTokensFillsContext(t *testing.T) {
	records := make(chan RequestRecord, 1)
	_, base := startWorker(t, Options{ServedModelName: "m", BlockSize: 4, NumGPUBlocks: 8, OutputLen: -1,
		OnRequestDone: func(r RequestRecord) { records <- r }})
	if st := post(t, base+"/v1/completions", `{"model":"m","prompt":"a b c d e"}`, nil); st != 200 {
		t.Fatalf("status %d", st)
	}
	if r := <-records; r.OutputTokens != 7*4-5 || r.FinishReason != "length" {
		t.Errorf("record %+v, want %d tokens ending in length", r, 7*4-5)
	}
	// An explicit max-model-len beyond the pool is accepted (as vLLM counts the null block in
	// its capacity check), but a request that cannot fit is refused instead of looping.
	_, base2 := startWorker(t, Options{ServedModelName: "m", BlockSize: 4, NumGPUBlocks: 8, MaxModelLen: 100, OutputLen: -1,
		OnRequestDone: func(r RequestRecord) { records <- r }})
	if st := post(t, base2+"/v1/completions", `{"model":"m","prompt":"a b c d e","max_tokens":50}`, nil); st != 400 {
		t.Errorf("oversized request: status %d, want 400", st)
	}
	if st := post(t, base2+"/v1/completions", `{"model":"m","prompt":"a b c d e"}`, nil); st != 200 {
		t.Errorf("request without max_tokens: status %d, want 200", st)
	}
	if r := <-records; r.OutputTokens != 7*4-5 {
		t.Errorf("record %+v, want %d tokens", r, 7*4-5)
	}
}
