package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/zeebo/xxh3"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/tokenize/chat"
)

// promptTokenizer turns an OpenAI body into the prompt token ids the engine prefills.
type promptTokenizer interface {
	tokenizeRequest(ctx context.Context, body []byte) ([]uint32, error)
	// tokenizeConversation renders a mapped Responses conversation (add_special_tokens true,
	// as vLLM's Responses entrypoint tokenizes) under cache_salt salt.
	tokenizeConversation(ctx context.Context, c *apireq.ResponsesConversation, salt string) ([]uint32, error)
	// filler returns the token ids and texts of the deterministic output, one entry per token.
	filler() ([]uint32, []string)
}

// badRequestError is a tokenization failure the client caused (HTTP 400).
type badRequestError struct{ msg string }

func (e *badRequestError) Error() string { return e.msg }

// fillerText is the simulated model's output, repeated as long as needed.
const fillerText = "The quick brown fox jumps over the lazy dog while the simulated worker keeps " +
	"streaming deterministic filler text so that every run of the same request looks the same."

// wordTokenizer is the stand-in when no tokenizer folder is given: one token per
// whitespace-separated word (chat: "role: content" lines), ids from a hash of the word.
type wordTokenizer struct{}

func wordID(w string) uint32 { return uint32(xxh3.HashString(w)%150000) + 1 }

func (wordTokenizer) tokenizeRequest(ctx context.Context, body []byte) ([]uint32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var b struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Prompt json.RawMessage `json:"prompt"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, &badRequestError{msg: fmt.Sprintf("invalid JSON body: %v", err)}
	}
	var text strings.Builder
	switch {
	case b.Messages != nil:
		for _, m := range b.Messages {
			text.WriteString(m.Role + ": " + contentText(m.Content) + "\n")
		}
		text.WriteString("assistant:")
	case b.Prompt != nil:
		var ids []uint32
		if err := json.Unmarshal(b.Prompt, &ids); err == nil {
			return ids, nil
		}
		var s string
		if err := json.Unmarshal(b.Prompt, &s); err != nil {
			var many []string
			if err := json.Unmarshal(b.Prompt, &many); err != nil || len(many) == 0 {
				return nil, &badRequestError{msg: "prompt must be a string, a list of strings or a list of token ids"}
			}
			s = many[0]
		}
		text.WriteString(s)
	default:
		return nil, &badRequestError{msg: "request needs \"messages\" or \"prompt\""}
	}
	words := strings.Fields(text.String())
	ids := make([]uint32, len(words))
	for i, w := range words {
		ids[i] = wordID(w)
	}
	return ids, nil
}

// tokenizeConversation is the word stand-in over the conversation's messages.
func (t wordTokenizer) tokenizeConversation(ctx context.Context, c *apireq.ResponsesConversation, _ string) ([]uint32, error) {
	msgs := make([]json.RawMessage, len(c.Messages))
	for i, m := range c.Messages {
		s, err := chat.ValueJSON(m)
		if err != nil {
			return nil, &badRequestError{msg: err.Error()}
		}
		msgs[i] = json.RawMessage(s)
	}
	body, err := json.Marshal(map[string]any{"messages": msgs})
	if err != nil {
		return nil, err
	}
	return t.tokenizeRequest(ctx, body)
}

// contentText flattens an OpenAI message content (string or list of text parts).
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return ""
}

func (wordTokenizer) filler() ([]uint32, []string) {
	words := strings.Fields(fillerText)
	ids := make([]uint32, len(words))
	texts := make([]string, len(words))
	for i, w := range words {
		ids[i] = wordID(w)
		texts[i] = " " + w
	}
	if len(texts) > 0 {
		texts[0] = words[0]
	}
	return ids, texts
}

// filler is the deterministic output of the simulated model.
type filler struct {
	ids   []uint32
	texts []string
}

func newFiller(t promptTokenizer) *filler {
	ids, texts := t.filler()
	return &filler{ids: ids, texts: texts}
}

func (f *filler) token(i int) uint32 { return f.ids[i%len(f.ids)] }
func (f *filler) text(i int) string  { return f.texts[i%len(f.texts)] }
