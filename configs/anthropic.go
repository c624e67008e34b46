package configs

// Anthropic configures the Anthropic Messages endpoints (/v1/messages and
// /v1/messages/count_tokens).
type Anthropic struct {
	// CountTokens is how POST /v1/messages/count_tokens is answered: "local" (the default)
	// renders and counts the prompt with the gateway's tokenizer, no worker hop; "forward"
	// sends it to a worker. Without a tokenizer the gateway always forwards.
	CountTokens string `yaml:"count_tokens"`
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
}
