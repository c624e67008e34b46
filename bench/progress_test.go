package bench

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

// syncBuffer is a bytes.Buffer safe for the progress goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestProgressPlain(t *testing.T) {
	var out syncBuffer
	p := NewProgress(&out, "kv", 4)
	p.Record(&Record{})
	p.Record(&Record{ErrorKind: ErrTimeout})
	p.Record(&Record{})
	p.Stop()
	p.Stop() // idempotent
	got := out.String()
	if strings.Count(got, "\n") != 1 || strings.Contains(got, "\r") || strings.Contains(got, "\033") {
		t.Errorf("a non-terminal gets plain lines without escapes, got %q", got)
	}
	for _, want := range []string{"kv [", "3/4 req", "75.0%", "errors 1"} {
		if !strings.Contains(got, want) {
			t.Errorf("progress line %q lacks %q", got, want)
		}
	}
}
