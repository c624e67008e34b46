package sim

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/tokenize"
)

// loadTokenizer picks the prompt tokenizer: the model folder's tokenizer (the same package the
// gateway uses, so both see vLLM's token ids) when one is named, else the word stand-in.
func loadTokenizer(o Options) (promptTokenizer, error) {
	t := o.Tokenize
	if t == nil {
		if o.Tokenizer == "" {
			return wordTokenizer{}, nil
		}
		var err error
		if t, err = tokenize.Load(o.Tokenizer, tokenize.Options{}); err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
	}
	h := &hfTokenizer{t: t}
	if err := h.buildFiller(); err != nil {
		return nil, err
	}
	return h, nil
}

// hfTokenizer tokenizes requests with the model's tokenizer and chat template.
type hfTokenizer struct {
	t     *tokenize.Tokenizer
	ids   []uint32
	texts []string
}

func (h *hfTokenizer) tokenizeRequest(ctx context.Context, body []byte) ([]uint32, error) {
	p, err := h.t.TokenizeRequest(ctx, body)
	if err != nil {
		var re *tokenize.RequestError
		var te *tokenize.TemplateError
		if errors.As(err, &re) || errors.As(err, &te) {
			return nil, &badRequestError{msg: err.Error()}
		}
		return nil, err
	}
	return p.TokenIDs, nil
}

func (h *hfTokenizer) tokenizeConversation(ctx context.Context, c *apireq.ResponsesConversation, salt string) ([]uint32, error) {
	p, err := h.t.TokenizeInput(ctx, tokenize.Input{Chat: c.Template(), AddSpecialTokens: true, CacheSalt: salt}, 0)
	if err != nil {
		var re *tokenize.RequestError
		var te *tokenize.TemplateError
		if errors.As(err, &re) || errors.As(err, &te) {
			return nil, &badRequestError{msg: err.Error()}
		}
		return nil, err
	}
	return p.TokenIDs, nil
}

// buildFiller tokenizes the filler text once; each output token's text is its own decoding,
// so the streamed text re-tokenizes (in a follow-up turn) to the same ids.
func (h *hfTokenizer) buildFiller() error {
	ids, err := h.t.Encode(fillerText, false)
	if err != nil || len(ids) == 0 {
		return fmt.Errorf("sim: tokenize filler text: %w", err)
	}
	h.ids = ids
	h.texts = make([]string, len(ids))
	for i, id := range ids {
		if h.texts[i], err = h.t.Decode([]uint32{id}, false); err != nil {
			return fmt.Errorf("sim: decode filler token %d: %w", id, err)
		}
	}
	return nil
}

func (h *hfTokenizer) filler() ([]uint32, []string) { return h.ids, h.texts }

func (h *hfTokenizer) decode(ids []uint32) (string, error) {
	s, err := h.t.Decode(ids, false)
	if err != nil {
		return "", &badRequestError{msg: err.Error()}
	}
	return s, nil
}
