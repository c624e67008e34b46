package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Config is the chat-relevant part of a HF model folder.
type Config struct {
	// Template is the default chat template source ("" when the folder has none).
	Template string
	// Named holds named templates (tokenizer_config.json "chat_template" given as a list of
	// {name, template}); "tool_use" is chosen when a request has tools, as HF does.
	Named map[string]string
	// BOSToken and EOSToken are the special tokens templates see as bos_token / eos_token.
	BOSToken, EOSToken string
	// Special holds every special token HF passes to templates (bos_token, eos_token, unk_token,
	// sep_token, pad_token, cls_token, mask_token), only those the folder defines.
	Special map[string]string
	// AdditionalSpecial is additional_special_tokens (passed to templates when non-empty).
	AdditionalSpecial []string
}

var specialKeys = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}

// LoadConfig reads tokenizer_config.json and the optional chat_template.jinja (which wins over
// the config's template, as in transformers) or processor chat_template.json from dir. Missing
// files are not errors; malformed ones are.
func LoadConfig(dir string) (Config, error) {
	cfg := Config{Special: map[string]string{}}
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return cfg, fmt.Errorf("read tokenizer_config.json: %w", err)
	default:
		if err := cfg.parseTokenizerConfig(raw); err != nil {
			return cfg, fmt.Errorf("parse tokenizer_config.json: %w", err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		cfg.Template = string(b)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return cfg, fmt.Errorf("read chat_template.jinja: %w", err)
	} else if b, err := os.ReadFile(filepath.Join(dir, "chat_template.json")); err == nil {
		var ct struct {
			ChatTemplate string `json:"chat_template"`
		}
		if err := json.Unmarshal(b, &ct); err != nil {
			return cfg, fmt.Errorf("parse chat_template.json: %w", err)
		}
		if ct.ChatTemplate != "" {
			cfg.Template = ct.ChatTemplate
		}
	}
	cfg.BOSToken, cfg.EOSToken = cfg.Special["bos_token"], cfg.Special["eos_token"]
	return cfg, nil
}

func (c *Config) parseTokenizerConfig(raw []byte) error {
	var tc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &tc); err != nil {
		return err
	}
	for _, k := range specialKeys {
		if s, ok := tokenContent(tc[k]); ok {
			c.Special[k] = s
		}
	}
	if list, ok := tc["additional_special_tokens"]; ok {
		var items []json.RawMessage
		if json.Unmarshal(list, &items) == nil {
			for _, it := range items {
				if s, ok := tokenContent(it); ok {
					c.AdditionalSpecial = append(c.AdditionalSpecial, s)
				}
			}
		}
	}
	if ct, ok := tc["chat_template"]; ok {
		var s string
		if err := json.Unmarshal(ct, &s); err == nil {
			c.Template = s
			return nil
		}
		var named []struct {
			Name     string `json:"name"`
			Template string `json:"template"`
		}
		if err := json.Unmarshal(ct, &named); err != nil {
			return fmt.Errorf("chat_template is neither a string nor a list of named templates: %w", err)
		}
		c.Named = map[string]string{}
		for _, n := range named {
			c.Named[n.Name] = n.Template
		}
		c.Template = c.Named["default"]
	}
	return nil
}

// tokenContent reads a special token given as a string or as an AddedToken object.
func tokenContent(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != nil {
		return *obj.Content, true
	}
	return "", false
}
