// Command limitsload measures a client key's limits through kvgate: it sends N chat requests
// evenly spaced over a duration (request i at i×duration/N, each on its own goroutine, so a slow
// answer never delays the next), spread round robin over one or more gateway URLs (replicas),
// and counts what each answered: 200 (admitted), 429 (limited), anything else; it also checks
// that every 200 and 429 carried x-ratelimit-limit-requests and every 429 a Retry-After.
//
//	go run ./scripts/limitsload --urls http://127.0.0.1:8000 --key sk-... --model qwen3 --requests 1000 --duration 10s
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

func main() {
	urls := flag.String("urls", "http://127.0.0.1:8000", "gateway base URLs, comma-separated (requests go round robin)")
	key := flag.String("key", "", "the client key (Authorization: Bearer)")
	model := flag.String("model", "qwen3", "model name")
	n := flag.Int("requests", 1000, "requests to send")
	dur := flag.Duration("duration", 10*time.Second, "over how long (evenly spaced)")
	maxTokens := flag.Int("max-tokens", 1, "max_tokens of each request")
	flag.Parse()
	if err := run(strings.Split(*urls, ","), *key, *model, *n, *dur, *maxTokens); err != nil {
		fmt.Fprintln(os.Stderr, "limitsload:", err)
		os.Exit(1)
	}
}

// result is what one gateway answered, counted.
type result struct {
	URL          string `json:"url"`
	OK           int    `json:"ok"`
	Limited      int    `json:"limited"`
	Other        int    `json:"other"`
	Errors       int    `json:"errors"`
	NoHeaders    int    `json:"missing_ratelimit_headers"`
	NoRetryAfter int    `json:"missing_retry_after"`
}

func run(urls []string, key, model string, n int, dur time.Duration, maxTokens int) error {
	if n <= 0 || dur <= 0 || len(urls) == 0 {
		return fmt.Errorf("need --requests > 0, --duration > 0 and a URL")
	}
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": "Say one word."}}})
	cl := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	res := make([]result, len(urls))
	for i, u := range urls {
		res[i].URL = u
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	gap := dur / time.Duration(n)
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * gap)); d > 0 {
			time.Sleep(d)
		}
		r := &res[i%len(urls)]
		wg.Go(func() {
			code, h, err := send(cl, r.URL, key, body)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				r.Errors++
			case code == http.StatusOK:
				r.OK++
			case code == http.StatusTooManyRequests:
				r.Limited++
				if h.Get("Retry-After") == "" {
					r.NoRetryAfter++
				}
			default:
				r.Other++
			}
			if err == nil && (code == http.StatusOK || code == http.StatusTooManyRequests) && h.Get("X-Ratelimit-Limit-Requests") == "" {
				r.NoHeaders++
			}
		})
	}
	sent := time.Since(start)
	wg.Wait()
	var total result
	total.URL = "total"
	for _, r := range res {
		total.OK += r.OK
		total.Limited += r.Limited
		total.Other += r.Other
		total.Errors += r.Errors
		total.NoHeaders += r.NoHeaders
		total.NoRetryAfter += r.NoRetryAfter
	}
	out := map[string]any{"requests": n, "duration_s": dur.Seconds(), "sent_in_s": sent.Seconds(), "replicas": res, "total": total}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func send(cl *http.Client, base, key string, body []byte) (int, http.Header, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, strings.TrimSuffix(base, "/")+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := cl.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header, nil
}
