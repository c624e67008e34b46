package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// bodyLog is an http.RoundTripper that appends the JSON body of every POST it forwards to w,
// one compact object a line (kvbench run --bodies-out), so that a script can replay the same
// prompts elsewhere, e.g. through POST /debug/route.
type bodyLog struct {
	next http.RoundTripper

	mu  sync.Mutex
	w   *bufio.Writer
	err error // the first write error; later bodies are not written
}

func newBodyLog(next http.RoundTripper, w io.Writer) *bodyLog {
	return &bodyLog{next: next, w: bufio.NewWriter(w)}
}

// RoundTrip records the request's body, then forwards the request unchanged.
func (b *bodyLog) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPost && req.Body != nil && req.Body != http.NoBody {
		raw, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("read request body: %w", err)
		}
		req.Body = io.NopCloser(bytes.NewReader(raw))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil }
		b.write(raw)
	}
	return b.next.RoundTrip(req)
}

func (b *bodyLog) write(raw []byte) {
	var line bytes.Buffer
	if json.Compact(&line, raw) != nil {
		return // not JSON: nothing a script could replay
	}
	line.WriteByte('\n')
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == nil {
		_, b.err = b.w.Write(line.Bytes())
	}
}

// Flush writes out what is buffered and returns the first write error.
func (b *bodyLog) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == nil {
		b.err = b.w.Flush()
	}
	if b.err != nil {
		return fmt.Errorf("write request bodies: %w", b.err)
	}
	return nil
}
