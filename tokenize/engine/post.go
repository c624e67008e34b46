package engine

import (
	"encoding/json"
	"fmt"
)

// postProcessor adds special tokens around an encoded single sequence when add_special_tokens
// is set. ByteLevel post-processing only touches offsets, so it is a no-op on ids.
type postProcessor interface {
	process(dst []uint32, ids []uint32) []uint32
}

// template is TemplateProcessing's "single" template: a list of special-token id runs and the
// sequence itself (seq marks where it goes).
type template struct {
	items [][]uint32 // nil item = the sequence
}

func (p template) process(dst []uint32, ids []uint32) []uint32 {
	for _, it := range p.items {
		if it == nil {
			dst = append(dst, ids...)
		} else {
			dst = append(dst, it...)
		}
	}
	return dst
}

type postSequence []postProcessor

func (p postSequence) process(dst []uint32, ids []uint32) []uint32 {
	cur := ids
	for _, x := range p {
		cur = x.process(nil, cur)
	}
	return append(dst, cur...)
}

func buildPostProcessor(raw json.RawMessage) (postProcessor, error) {
	if isNull(raw) {
		return nil, nil
	}
	c, err := parseComponent(raw)
	if err != nil {
		return nil, err
	}
	switch c.Type {
	case "ByteLevel":
		return nil, nil
	case "TemplateProcessing":
		var t template
		for _, it := range c.Single {
			switch {
			case it.Sequence != nil:
				t.items = append(t.items, nil)
			case it.SpecialToken != nil:
				st, ok := c.SpecialTokens[it.SpecialToken.ID]
				if !ok {
					return nil, fmt.Errorf("TemplateProcessing: special token %q not defined", it.SpecialToken.ID)
				}
				t.items = append(t.items, append([]uint32{}, st.IDs...))
			default:
				return nil, unsupported("post_processor", "TemplateProcessing item")
			}
		}
		return t, nil
	case "RobertaProcessing", "BertProcessing":
		cls, err := tokenPairID(c.Cls)
		if err != nil {
			return nil, err
		}
		sep, err := tokenPairID(c.Sep)
		if err != nil {
			return nil, err
		}
		return template{items: [][]uint32{{cls}, nil, {sep}}}, nil
	case "Sequence":
		var seq postSequence
		for _, r := range c.Processors {
			p, err := buildPostProcessor(r)
			if err != nil {
				return nil, err
			}
			if p != nil {
				seq = append(seq, p)
			}
		}
		switch len(seq) {
		case 0:
			return nil, nil
		case 1:
			return seq[0], nil
		}
		return seq, nil
	}
	return nil, unsupported("post_processor", c.Type)
}

// tokenPairID reads the id of a ["token", id] pair.
func tokenPairID(raw []json.RawMessage) (uint32, error) {
	if len(raw) != 2 {
		return 0, fmt.Errorf("post_processor: want [token, id], got %d items", len(raw))
	}
	var id uint32
	if err := json.Unmarshal(raw[1], &id); err != nil {
		return 0, fmt.Errorf("post_processor: token id: %w", err)
	}
	return id, nil
}
