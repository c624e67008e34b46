package sim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// anthWriter turns the chat path's response into the Anthropic one as vLLM does
// (vllm/entrypoints/anthropic/serving.py: messages_full_converter for a body,
// message_stream_converter for SSE; errors as api_router.py's translate_error_response).
type anthWriter struct {
	rw     http.ResponseWriter
	stream bool
	status int
	buf    bytes.Buffer // the non-stream body, or the SSE bytes not yet split into events

	started      bool // message_start sent
	blockOpen    bool
	finishReason string
	usage        *usageInfo
}

func (a *anthWriter) Header() http.Header { return a.rw.Header() }

func (a *anthWriter) WriteHeader(status int) {
	a.status = status
	if a.stream && status == http.StatusOK {
		a.rw.WriteHeader(status)
		return
	}
	a.rw.Header().Set("Content-Type", "application/json")
	a.rw.Header().Del("Content-Length")
}

func (a *anthWriter) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.WriteHeader(http.StatusOK)
	}
	a.buf.Write(p)
	if a.stream && a.status == http.StatusOK {
		for {
			i := bytes.Index(a.buf.Bytes(), []byte("\n\n"))
			if i < 0 {
				break
			}
			ev := string(a.buf.Next(i + 2))
			if err := a.event(strings.TrimSpace(strings.TrimPrefix(ev, "data:"))); err != nil {
				return len(p), err
			}
		}
	}
	return len(p), nil
}

// Flush implements http.Flusher.
func (a *anthWriter) Flush() {
	if f, ok := a.rw.(http.Flusher); ok && a.stream && a.status == http.StatusOK {
		f.Flush()
	}
}

func (a *anthWriter) send(name string, v any) error {
	data, _ := json.Marshal(v)
	_, err := a.rw.Write([]byte("event: " + name + "\ndata: " + string(data) + "\n\n"))
	return err
}

// anthUsage is _build_anthropic_usage: input_tokens excludes the cached tokens, which are
// reported when the worker reports prompt_tokens_details.
func anthUsage(u *usageInfo) omap {
	if u == nil {
		return omap{{"input_tokens", 0}, {"output_tokens", 0}}
	}
	in := u.PromptTokens
	out := omap{}
	if u.PromptTokensDetails != nil {
		in -= u.PromptTokensDetails.CachedTokens
		out = append(out, kv{"cache_read_input_tokens", u.PromptTokensDetails.CachedTokens})
	}
	return append(omap{{"input_tokens", max(0, in)}, {"output_tokens", u.CompletionTokens}}, out...)
}

var stopReasons = map[string]string{"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

func stopReason(finish string) any {
	if s, ok := stopReasons[finish]; ok {
		return s
	}
	return nil
}

func (a *anthWriter) event(data string) error {
	if data == "[DONE]" {
		if a.blockOpen {
			if err := a.send("content_block_stop", omap{{"type", "content_block_stop"}, {"index", 0}}); err != nil {
				return err
			}
		}
		if err := a.send("message_delta", omap{{"type", "message_delta"},
			{"delta", omap{{"stop_reason", stopReason(a.finishReason)}, {"stop_sequence", nil}}},
			{"usage", anthUsage(a.usage)}}); err != nil {
			return err
		}
		return a.send("message_stop", omap{{"type", "message_stop"}})
	}
	var chunk struct {
		ID      string     `json:"id"`
		Model   string     `json:"model"`
		Usage   *usageInfo `json:"usage"`
		Error   *errorInfo `json:"error"`
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(data), &chunk); err != nil {
		return nil
	}
	if chunk.Error != nil {
		return a.send("error", omap{{"type", "error"}, {"error", omap{{"type", "internal_error"}, {"message", chunk.Error.Message}}}})
	}
	if chunk.Usage != nil {
		a.usage = chunk.Usage
	}
	if !a.started { // the first chunk (the role) starts the message; its content is skipped
		a.started = true
		return a.send("message_start", omap{{"type", "message_start"}, {"message", omap{
			{"id", chunk.ID}, {"type", "message"}, {"role", "assistant"}, {"content", []any{}},
			{"model", chunk.Model}, {"stop_reason", nil}, {"stop_sequence", nil},
			{"usage", anthUsage(chunk.Usage)}}}})
	}
	for _, c := range chunk.Choices {
		if c.Delta.Content != "" {
			if !a.blockOpen {
				a.blockOpen = true
				if err := a.send("content_block_start", omap{{"type", "content_block_start"}, {"index", 0},
					{"content_block", omap{{"type", "text"}, {"text", ""}}}}); err != nil {
					return err
				}
			}
			if err := a.send("content_block_delta", omap{{"type", "content_block_delta"}, {"index", 0},
				{"delta", omap{{"type", "text_delta"}, {"text", c.Delta.Content}}}}); err != nil {
				return err
			}
		}
		if c.FinishReason != nil {
			a.finishReason = *c.FinishReason
		}
	}
	return nil
}

// finish writes a buffered (non-stream or error) response, converted.
func (a *anthWriter) finish() {
	if (a.stream && a.status == http.StatusOK) || a.status == 0 {
		return // streamed as it came, or nothing written: the client left before its first token
	}
	body := a.buf.Bytes()
	if a.status != http.StatusOK {
		var e errorBody
		if len(body) == 0 || json.Unmarshal(body, &e) != nil {
			a.rw.WriteHeader(a.status) // a bare 500 (engine dead) stays bare
			_, _ = a.rw.Write(body)
			return
		}
		writeAnthropicError(a.rw, a.status, e.Error.Type, e.Error.Message)
		return
	}
	var resp struct {
		ID      string    `json:"id"`
		Model   string    `json:"model"`
		Usage   usageInfo `json:"usage"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &resp); err != nil || len(resp.Choices) == 0 {
		writeAnthropicError(a.rw, http.StatusInternalServerError, "internal_error", "vllm-sim: unreadable chat response")
		return
	}
	ch := resp.Choices[0]
	writeJSON(a.rw, http.StatusOK, omap{{"id", resp.ID}, {"type", "message"}, {"role", "assistant"},
		{"content", []any{omap{{"type", "text"}, {"text", ch.Message.Content}}}},
		{"model", resp.Model}, {"stop_reason", stopReason(ch.FinishReason)}, {"stop_sequence", nil},
		{"usage", anthUsage(&resp.Usage)}})
}
