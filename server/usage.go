package server

import (
	"bytes"
	"encoding/json"

	"github.com/kvgate/kvgate/router"
)

// maxUsageBody bounds how much of a non-stream response is kept to read its usage; a larger
// body (huge n or logprobs) is relayed but not read.
const maxUsageBody = 4 << 20

// usageCapture collects what a worker reported in the OpenAI usage object while the response
// is relayed: the non-stream body (bounded), or the last SSE event that carries prompt_tokens
// (the final usage chunk of stream_options.include_usage; with continuous_usage_stats every
// chunk has one and the last wins) or input_tokens (Anthropic's message_start and
// message_delta, Responses' response.completed). Methods on a nil capture do nothing.
type usageCapture struct {
	buf      []byte
	overflow bool
	last     []byte // the latest SSE event with usage, copied
}

// Write implements io.Writer for the non-stream body; it never fails, so the client copy
// never stops because of it.
func (u *usageCapture) Write(p []byte) (int, error) {
	u.body(p)
	return len(p), nil
}

func (u *usageCapture) body(p []byte) {
	if u == nil || u.overflow {
		return
	}
	if len(u.buf)+len(p) > maxUsageBody {
		u.overflow, u.buf = true, nil
		return
	}
	u.buf = append(u.buf, p...)
}

const promptTokensKey = `"prompt_tokens"`

// inputTokensKey marks an Anthropic usage object (message_start, message_delta, or the
// non-stream message).
const inputTokensKey = `"input_tokens"`

func (u *usageCapture) event(ev []byte) {
	if u == nil || !bytes.Contains(ev, []byte(promptTokensKey)) && !bytes.Contains(ev, []byte(inputTokensKey)) {
		return
	}
	u.last = append(u.last[:0], ev...)
}

type usageJSON struct {
	PromptTokens        *int `json:"prompt_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	// Anthropic's usage (vllm/entrypoints/anthropic/serving.py, _build_anthropic_usage):
	// input_tokens excludes what was read from or written to the cache.
	InputTokens              *int `json:"input_tokens"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens"`
	// OpenAI Responses' usage (ResponseUsage, vllm/entrypoints/openai/responses/serving.py)
	// shares input_tokens, but there it counts the whole prompt and the cached part is in
	// input_tokens_details, which Anthropic's usage never has.
	InputTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

// anthropic maps an Anthropic usage object onto the prompt and cached token counts: the
// prompt is input + cache read + cache creation; cached tokens are known only when the
// worker reported cache_read_input_tokens (--enable-prompt-tokens-details).
func (j *usageJSON) anthropic() router.Usage {
	out := router.Usage{PromptTokens: *j.InputTokens}
	if j.CacheReadInputTokens != nil {
		out.PromptTokens += *j.CacheReadInputTokens
		out.CachedTokens, out.HasCached = *j.CacheReadInputTokens, true
	}
	if j.CacheCreationInputTokens != nil {
		out.PromptTokens += *j.CacheCreationInputTokens
	}
	return out
}

// responses maps a Responses usage object: input_tokens is the prompt, cached_tokens of
// input_tokens_details the cached part.
func (j *usageJSON) responses() router.Usage {
	out := router.Usage{PromptTokens: *j.InputTokens}
	if c := j.InputTokensDetails.CachedTokens; c != nil {
		out.CachedTokens, out.HasCached = *c, true
	}
	return out
}

// usage returns what was captured; ok is false when no usage with prompt_tokens was seen.
func (u *usageCapture) usage() (router.Usage, bool) {
	if u == nil {
		return router.Usage{}, false
	}
	doc := u.buf
	if u.last != nil {
		doc = sseData(u.last)
	}
	if len(doc) == 0 {
		return router.Usage{}, false
	}
	var body struct {
		Usage   *usageJSON `json:"usage"`
		Message *struct {
			Usage *usageJSON `json:"usage"`
		} `json:"message"` // Anthropic message_start
		Response *struct {
			Usage *usageJSON `json:"usage"`
		} `json:"response"` // Responses' response.completed (and .incomplete)
	}
	if json.Unmarshal(doc, &body) != nil {
		return router.Usage{}, false
	}
	if body.Usage == nil && body.Message != nil {
		body.Usage = body.Message.Usage
	}
	if body.Usage == nil && body.Response != nil {
		body.Usage = body.Response.Usage
	}
	if body.Usage != nil && body.Usage.PromptTokens == nil && body.Usage.InputTokens != nil {
		if body.Usage.InputTokensDetails != nil {
			return body.Usage.responses(), true
		}
		return body.Usage.anthropic(), true
	}
	if body.Usage == nil || body.Usage.PromptTokens == nil {
		return router.Usage{}, false
	}
	out := router.Usage{PromptTokens: *body.Usage.PromptTokens}
	if d := body.Usage.PromptTokensDetails; d != nil && d.CachedTokens != nil {
		out.CachedTokens, out.HasCached = *d.CachedTokens, true
	}
	return out, true
}

// sseData returns the data of one SSE event: its data: lines joined by newlines.
func sseData(ev []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(ev, []byte("\n")) {
		line = bytes.TrimSuffix(line, []byte("\r"))
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimPrefix(data, []byte(" "))
		if out != nil {
			out = append(out, '\n')
		}
		out = append(out, data...)
	}
	return out
}
