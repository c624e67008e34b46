package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvgate/kvgate/bench"
)

// fakeGateway streams three content chunks and a usage chunk, naming one of two workers.
func fakeGateway(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Model    string `json:"model"`
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Model != "m" || len(body.Messages) == 0 {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		i := n.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set(bench.WorkerHeader, fmt.Sprintf("http://w%d", i%2))
		for k := range 3 {
			fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\"x%d\"}}]}\n\n", k)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":5}}}\n\ndata: [DONE]\n\n")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, &n
}

func TestRunAndCompare(t *testing.T) {
	srv, n := fakeGateway(t)
	trace := filepath.Join("..", "..", "testdata", "traces", "trace_0026.json")
	tmp := t.TempDir()
	quietLog := slog.New(slog.NewTextHandler(io.Discard, nil))
	var dirs []string
	for _, label := range []string{"round_robin", "kv"} {
		dir := filepath.Join(tmp, label)
		args := []string{"run", "--url", srv.URL, "--model", "m", "--trace", trace, "--time-scale", "0.0001",
			"--out", dir, "--quiet", "--session-headers", "plain", "-H", "X-Test: 1"}
		// The first run also checks prompt synthesis against the real tokenizer (slow to load).
		if _, err := os.Stat("../../models/qwen3/tokenizer.json"); err == nil && label == "round_robin" {
			args = append(args, "--tokenizer", "../../models/qwen3", "--verify-blocks", "8")
		}
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), args, &stdout, &stderr, quietLog); err != nil {
			t.Fatalf("run: %v\n%s", err, stderr.String())
		}
		for _, f := range []string{bench.SummaryFile, bench.CSVFile, bench.RecordsFile, bench.ReportFile, bench.PNGFile} {
			if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
				t.Errorf("%s: missing or empty (%v)", f, err)
			}
		}
		if !strings.Contains(stdout.String(), "TTFT avg") || !strings.Contains(stdout.String(), "report:") {
			t.Errorf("stdout:\n%s", stdout.String())
		}
		dirs = append(dirs, dir)
	}
	if n.Load() != 6 {
		t.Errorf("server saw %d requests, want 2 runs x 3", n.Load())
	}
	raw, err := os.ReadFile(filepath.Join(dirs[0], bench.SummaryFile))
	if err != nil {
		t.Fatal(err)
	}
	var sum map[string]any
	if err := json.Unmarshal(raw, &sum); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"time_to_first_token", "inter_token_latency", "request_latency", "output_token_throughput", "request_throughput"} {
		st, ok := sum[k].(map[string]any)
		if !ok {
			t.Fatalf("summary lacks %s", k)
		}
		for _, f := range []string{"avg", "min", "max", "p50", "p90", "p99"} {
			if _, ok := st[f]; !ok {
				t.Errorf("%s lacks %s", k, f)
			}
		}
	}
	if sum["cached_token_ratio"] != 0.5 || sum["request_count"] != 3.0 || sum["error_count"] != 0.0 {
		t.Errorf("cached %v requests %v errors %v", sum["cached_token_ratio"], sum["request_count"], sum["error_count"])
	}

	var stdout, stderr bytes.Buffer
	htmlPath, pngPath := filepath.Join(tmp, "cmp.html"), filepath.Join(tmp, "cmp.png")
	err = run(context.Background(), []string{"compare", dirs[0], filepath.Join(dirs[1], bench.SummaryFile), "--html", htmlPath, "--png", pngPath}, &stdout, &stderr, quietLog)
	if err != nil {
		t.Fatalf("compare: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "round_robin") || !strings.Contains(stdout.String(), "(1.00x)") {
		t.Errorf("compare output:\n%s", stdout.String())
	}
	for _, p := range []string{htmlPath, pngPath} {
		if _, err := os.Stat(p); err != nil {
			t.Error(err)
		}
	}
}

func TestRunErrors(t *testing.T) {
	quietLog := slog.New(slog.NewTextHandler(io.Discard, nil))
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(bad, []byte(`{"input_length":2000,"hash_ids":[1]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{nil, "missing command"},
		{[]string{"bogus"}, "unknown command"},
		{[]string{"run", "--out", "x"}, "--trace and --out are required"},
		{[]string{"run", "--trace", bad, "--out", t.TempDir()}, "bad.jsonl:1: input_length 2000 does not fit"},
		{[]string{"run", "--trace", bad, "--out", t.TempDir(), "--format", "csv"}, "unknown trace format"},
		{[]string{"compare"}, "at least one summary"},
	}
	for _, c := range cases {
		err := run(context.Background(), c.args, io.Discard, io.Discard, quietLog)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want %q", c.args, err, c.want)
		}
	}
}
