package configs

// Anthropic configures the Anthropic Messages endpoints (/v1/messages and
// /v1/messages/count_tokens).
type Anthropic struct {
	// CountTokens is how POST /v1/messages/count_tokens is answered: "local" (the default)
	// renders and counts the prompt with the gateway's tokenizer, no worker hop; "forward"
	// sends it to a worker. Without a tokenizer the gateway always forwards.
	CountTokens string `yaml:"count_tokens"`
	// InlineSystem is what the workers do with role "system" messages inside messages:
	// "merge" (the default: appended to the leading system message, as vLLM does without
	// --chat-template) or "preserve" (kept in place, as vLLM does with a --chat-template that
	// renders a system message after the first turn). It must match the workers for the
	// gateway's hashes to match theirs.
	InlineSystem string `yaml:"inline_system"`
}

// The anthropic.count_tokens modes.
const (
	CountTokensLocal   = "local"
	CountTokensForward = "forward"
)

func (c *Config) validateAnthropic(bad func(key, format string, args ...any)) {
	switch c.Anthropic.CountTokens {
	case CountTokensLocal, CountTokensForward:
	default:
		bad("anthropic.count_tokens", "%q is not local or forward", c.Anthropic.CountTokens)
	}
	switch c.Anthropic.InlineSystem {
	case "merge", "preserve":
	default:
		bad("anthropic.inline_system", "%q is not merge or preserve", c.Anthropic.InlineSystem)
	}
}
