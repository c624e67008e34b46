package sim

import "encoding/json"

// JSON shapes of vLLM's OpenAI server (vllm/entrypoints/openai/protocol.py). Field order matches vLLM's
// pydantic models because encoding/json writes struct fields in declaration order.

type errorBody struct {
	Error errorInfo `json:"error"`
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

type usageInfo struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type chatDelta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type chatChunkChoice struct {
	Index        int        `json:"index"`
	Delta        chatDelta  `json:"delta"`
	Logprobs     any        `json:"logprobs"`
	FinishReason *string    `json:"finish_reason"`
	StopReason   *stopField `json:"stop_reason,omitempty"`
}

// stopField renders vLLM's stop_reason, present (as null) only on finish chunks.
type stopField struct{}

func (stopField) MarshalJSON() ([]byte, error) { return []byte("null"), nil }

type textChunkChoice struct {
	Index        int        `json:"index"`
	Text         string     `json:"text"`
	Logprobs     any        `json:"logprobs"`
	FinishReason *string    `json:"finish_reason"`
	StopReason   *stopField `json:"stop_reason,omitempty"`
}

type streamChunk struct {
	ID      string     `json:"id"`
	Object  string     `json:"object"`
	Created int64      `json:"created"`
	Model   string     `json:"model"`
	Choices any        `json:"choices"`
	Usage   *usageInfo `json:"usage,omitempty"`
}

type chatMessage struct {
	Role             string `json:"role"`
	Content          string `json:"content"`
	Refusal          any    `json:"refusal"`
	Annotations      any    `json:"annotations"`
	Audio            any    `json:"audio"`
	FunctionCall     any    `json:"function_call"`
	ToolCalls        []any  `json:"tool_calls"`
	ReasoningContent any    `json:"reasoning_content"`
}

type chatChoice struct {
	Index        int         `json:"index"`
	Message      chatMessage `json:"message"`
	Logprobs     any         `json:"logprobs"`
	FinishReason string      `json:"finish_reason"`
	StopReason   any         `json:"stop_reason"`
}

type textChoice struct {
	Index          int    `json:"index"`
	Text           string `json:"text"`
	Logprobs       any    `json:"logprobs"`
	FinishReason   string `json:"finish_reason"`
	StopReason     any    `json:"stop_reason"`
	PromptLogprobs any    `json:"prompt_logprobs"`
}

type completionResponse struct {
	ID                string    `json:"id"`
	Object            string    `json:"object"`
	Created           int64     `json:"created"`
	Model             string    `json:"model"`
	Choices           any       `json:"choices"`
	ServiceTier       any       `json:"service_tier"`
	SystemFingerprint any       `json:"system_fingerprint"`
	Usage             usageInfo `json:"usage"`
	PromptLogprobs    any       `json:"prompt_logprobs"`
	KVTransferParams  any       `json:"kv_transfer_params"`
}

type modelCard struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	OwnedBy     string            `json:"owned_by"`
	Root        string            `json:"root"`
	Parent      *string           `json:"parent"`
	MaxModelLen int               `json:"max_model_len"`
	Permission  []modelPermission `json:"permission"`
}

type modelPermission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

// completionBody holds the request fields the simulator acts on; everything else is ignored
// as vLLM ignores unknown fields.
type completionBody struct {
	Model               string          `json:"model"`
	Messages            json.RawMessage `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	CacheSalt           json.RawMessage `json:"cache_salt"`
	Priority            json.RawMessage `json:"priority"`
	N                   *int            `json:"n"`
	SessionID           string          `json:"session_id"`
	Tools               json.RawMessage `json:"tools"`
	VLLMXargs           struct {
		SessionID         string `json:"session_id"`
		KVCacheReportMode string `json:"kv_cache_report_mode"`
	} `json:"vllm_xargs"`
}

type streamOptions struct {
	IncludeUsage         *bool `json:"include_usage"`
	ContinuousUsageStats bool  `json:"continuous_usage_stats"`
}
