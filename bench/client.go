package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"
)

// WorkerHeader is the response header in which kvgate names the worker that served a request;
// kvgate sends it only when started with --proxy-expose-routing-headers.
const WorkerHeader = "X-Kvgate-Worker"

// Record is the outcome of one request, with aiperf-like timing taken at chunk arrival.
type Record struct {
	RequestID      string `json:"x_request_id"`
	CorrelationID  string `json:"x_correlation_id"`
	ParentCorrID   string `json:"parent_correlation_id,omitempty"`
	ConversationID string `json:"conversation_id"` // the trace's session id
	TurnIndex      int    `json:"turn_index"`

	StartOffset time.Duration `json:"-"` // request start since the run started
	TTFT        time.Duration `json:"-"` // first content chunk - start
	Latency     time.Duration `json:"-"` // last content chunk - start; failed without content: failure - start
	Chunks      int           `json:"content_chunks"`

	PromptTokens int  `json:"prompt_tokens"`
	OutputTokens int  `json:"output_tokens"` // usage.completion_tokens, else content chunks
	CachedTokens int  `json:"cached_tokens"`
	HasUsage     bool `json:"has_usage"`

	// TheoreticalHit / TraceBlocks: leading blocks of the request already seen earlier in its
	// hash namespace, and all its blocks (weka and standalone mooncake requests only).
	TheoreticalHit int `json:"theoretical_hit_blocks"`
	TraceBlocks    int `json:"trace_blocks"`
	// CapacityHit: the leading blocks a pooled LRU of the fleet's whole cache still held
	// (ReplayOptions.CapacityBlocks; 0 without it).
	CapacityHit int `json:"capacity_hit_blocks,omitempty"`
	// OptimalHit: the leading blocks a clairvoyant cache of the same size still held
	// (beladyHits; 0 without a capacity), set when the run ends.
	OptimalHit int `json:"optimal_hit_blocks,omitempty"`

	Worker    string `json:"worker,omitempty"`
	Status    int    `json:"http_status"`
	ErrorKind string `json:"error_kind,omitempty"`
	Error     string `json:"error,omitempty"`

	reply  string // concatenated content, for live-reply history
	access int    // 1 + the request's index in runner.accesses (0: none)
}

// OK reports whether the request succeeded.
func (r *Record) OK() bool { return r.ErrorKind == "" }

// ITL is (latency - TTFT) / (OSL - 1), aiperf's inter-token latency; ok is false below 2 tokens.
func (r *Record) ITL() (time.Duration, bool) {
	if !r.OK() || r.OutputTokens < 2 || r.Chunks < 2 {
		return 0, false
	}
	return (r.Latency - r.TTFT) / time.Duration(r.OutputTokens-1), true
}

// Error kinds recorded in Record.ErrorKind.
const (
	ErrConnection      = "connection"
	ErrTimeout         = "timeout"
	ErrCanceled        = "canceled"
	ErrContextOverflow = "context_overflow"
	ErrStream          = "stream_error"
	ErrNoContent       = "no_content"
	ErrBadResponse     = "bad_response"
)

// chunk is the subset of a chat.completion.chunk kvbench reads.
type chunk struct {
	Object  string `json:"object"`
	Choices []struct {
		Delta struct {
			Content          string            `json:"content"`
			ReasoningContent string            `json:"reasoning_content"`
			Reasoning        string            `json:"reasoning"`
			ToolCalls        []json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// sender posts streaming requests (chat completions, Messages or Responses) and times their
// content events.
type sender struct {
	client  *http.Client
	url     string // full endpoint URL
	api     API    // the body format and stream events
	apiKey  string
	headers http.Header // extra headers on every request
}

// send posts body and fills rec from the SSE stream; started is the request start time.
func (s *sender) send(ctx context.Context, body []byte, hdr http.Header, rec *Record) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		rec.fail(ErrBadResponse, err.Error())
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("User-Agent", "kvbench/1")
	if s.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+s.apiKey)
	}
	for k, vs := range s.headers {
		req.Header[k] = vs
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	start := time.Now()
	resp, err := s.client.Do(req)
	if err != nil {
		rec.fail(transportKind(ctx, err), err.Error())
		return
	}
	defer resp.Body.Close()
	rec.Status = resp.StatusCode
	rec.Worker = resp.Header.Get(WorkerHeader)
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		rec.fail(httpKind(resp.StatusCode, string(msg)), fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg))))
		return
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		rec.fail(ErrBadResponse, fmt.Sprintf("content type %q is not text/event-stream", resp.Header.Get("Content-Type")))
		return
	}
	s.readStream(ctx, resp.Body, start, rec)
}

// readStream parses SSE events ("data:" lines ended by a blank line) and times content chunks.
func (s *sender) readStream(ctx context.Context, body io.Reader, start time.Time, rec *Record) {
	br := bufio.NewReaderSize(body, 64<<10)
	var reply strings.Builder
	var data []byte
	event := ""
	for {
		line, err := br.ReadBytes('\n')
		now := time.Now()
		trimmed := bytes.TrimRight(line, "\r\n")
		switch {
		case len(trimmed) == 0 && len(line) > 0: // end of an event
			if done := s.handleEvent(event, data, start, now, rec, &reply); done {
				rec.reply = reply.String()
				s.finish(rec)
				return
			}
			data, event = data[:0], ""
		case bytes.HasPrefix(trimmed, []byte("data:")):
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, bytes.TrimPrefix(bytes.TrimPrefix(trimmed, []byte("data:")), []byte(" "))...)
		case bytes.HasPrefix(trimmed, []byte("event:")):
			event = strings.TrimSpace(string(trimmed[len("event:"):]))
		}
		if err != nil {
			if len(data) > 0 && s.handleEvent(event, data, start, now, rec, &reply) {
				rec.reply = reply.String()
				s.finish(rec)
				return
			}
			if errors.Is(err, io.EOF) {
				if rec.ErrorKind == "" {
					rec.fail(ErrStream, "stream ended without [DONE]")
				}
			} else {
				rec.fail(transportKind(ctx, err), err.Error())
			}
			rec.reply = reply.String()
			return
		}
	}
}

// handleEvent processes one SSE event; it returns true at the stream's end ([DONE],
// message_stop, response.completed) or on a terminal error.
func (s *sender) handleEvent(event string, data []byte, start, now time.Time, rec *Record, reply *strings.Builder) bool {
	if len(data) == 0 {
		return false
	}
	if string(data) == "[DONE]" {
		return true
	}
	if event == "error" {
		rec.fail(ErrStream, string(data))
		return true
	}
	text := func(content, other string) {
		if content == "" && other == "" {
			return
		}
		reply.WriteString(content)
		if rec.Chunks == 0 {
			rec.TTFT = now.Sub(start)
		}
		rec.Chunks++
		rec.Latency = now.Sub(start)
	}
	switch s.api {
	case APIMessages:
		return s.handleAnthropic(data, text, rec)
	case APIResponses:
		return s.handleResponses(data, text, rec)
	}
	var c chunk
	if err := json.Unmarshal(data, &c); err != nil {
		rec.fail(ErrBadResponse, fmt.Sprintf("invalid chunk JSON: %v", err))
		return true
	}
	if len(c.Error) > 0 && string(c.Error) != "null" {
		rec.fail(ErrStream, string(c.Error))
		return true
	}
	if c.Usage != nil {
		rec.HasUsage = true
		rec.PromptTokens = c.Usage.PromptTokens
		rec.OutputTokens = c.Usage.CompletionTokens
		if c.Usage.PromptTokensDetails != nil {
			rec.CachedTokens = c.Usage.PromptTokensDetails.CachedTokens
		}
	}
	if c.Object != "chat.completion.chunk" {
		return false // aiperf ignores chunks without the right object as content
	}
	for _, ch := range c.Choices {
		d := ch.Delta
		other := d.ReasoningContent + d.Reasoning
		if other == "" && len(d.ToolCalls) > 0 {
			other = "tool_calls"
		}
		text(d.Content, other)
	}
	return false
}

func (s *sender) finish(rec *Record) {
	if rec.ErrorKind != "" {
		return
	}
	if rec.Chunks == 0 {
		rec.fail(ErrNoContent, "no responses with actual content")
		return
	}
	if !rec.HasUsage {
		rec.OutputTokens = rec.Chunks
	}
}

func (r *Record) fail(kind, msg string) {
	if r.ErrorKind != "" {
		return // keep the first cause
	}
	r.ErrorKind = kind
	if len(msg) > 512 {
		msg = msg[:512]
	}
	r.Error = msg
}

// httpKind classifies a non-2xx answer; context overflow is detected by aiperf's substrings.
func httpKind(status int, body string) string {
	low := strings.ToLower(body)
	for _, s := range []string{"context length", "maximum context", "context_length_exceeded", "prompt is too long"} {
		if strings.Contains(low, s) {
			return ErrContextOverflow
		}
	}
	return fmt.Sprintf("http_%d", status)
}

func transportKind(ctx context.Context, err error) string {
	if errors.Is(ctx.Err(), context.Canceled) {
		return ErrCanceled
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return ErrTimeout
	}
	return ErrConnection
}

// newUUID returns a random RFC 4122 version 4 UUID (aiperf's X-Request-ID / X-Correlation-ID).
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go >= 1.24)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
