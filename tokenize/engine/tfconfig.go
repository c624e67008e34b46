package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// tokenizerConfig is the part of tokenizer_config.json that changes encoding in transformers
// (what vLLM runs) but is invisible to HF tokenizers alone.
type tokenizerConfig struct {
	TokenizerClass string          `json:"tokenizer_class"`
	AddBOS         *bool           `json:"add_bos_token"`
	AddEOS         *bool           `json:"add_eos_token"`
	BOS            json.RawMessage `json:"bos_token"`
	EOS            json.RawMessage `json:"eos_token"`
}

// bosEOSClasses are the transformers tokenizer classes whose constructor rebuilds the
// post-processor from add_bos_token / add_eos_token (LlamaTokenizerFast.update_post_processor and
// its Gemma / CodeLlama copies). The slow class names map to the same fast classes in AutoTokenizer.
var bosEOSClasses = map[string]bool{
	"LlamaTokenizer": true, "LlamaTokenizerFast": true,
	"CodeLlamaTokenizer": true, "CodeLlamaTokenizerFast": true,
	"GemmaTokenizer": true, "GemmaTokenizerFast": true,
}

// tokenContent reads a special-token field: "text", {"content": "text", ...} or null.
func tokenContent(raw json.RawMessage) (string, bool) {
	if isNull(raw) {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var obj struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != "" {
		return obj.Content, true
	}
	return "", false
}

// applyTokenizerConfig reads dir/tokenizer_config.json (if any) and, for the classes above,
// replaces the post-processor with [bos] $A [eos] exactly as transformers does. For DeepSeek V3
// (LlamaTokenizerFast, add_bos_token=true, no BOS in tokenizer.json) this adds the BOS that vLLM
// adds on /v1/completions.
func (t *Tokenizer) applyTokenizerConfig(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var c tokenizerConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("parse tokenizer_config.json: %w", err)
	}
	if !bosEOSClasses[c.TokenizerClass] {
		return nil
	}
	addBOS := c.AddBOS == nil || *c.AddBOS // transformers' defaults: BOS on, EOS off
	addEOS := c.AddEOS != nil && *c.AddEOS
	var tpl template
	for _, side := range []struct {
		on   bool
		raw  json.RawMessage
		name string
	}{{addBOS, c.BOS, "bos_token"}, {true, nil, ""}, {addEOS, c.EOS, "eos_token"}} {
		if side.name == "" {
			tpl.items = append(tpl.items, nil)
			continue
		}
		if !side.on {
			continue
		}
		content, ok := tokenContent(side.raw)
		if !ok {
			return fmt.Errorf("tokenizer_config.json: add_%s is set but %s is missing", side.name[:3], side.name)
		}
		id, ok := t.TokenToID(content)
		if !ok {
			return fmt.Errorf("tokenizer_config.json: %s %q is not a token", side.name, content)
		}
		tpl.items = append(tpl.items, []uint32{id})
	}
	t.post = tpl
	return nil
}
