package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/confval"
	"github.com/kvgate/kvgate/tokenize"
)

// checkConfigFlag removes --check-config (or --check-config=BOOL, one dash too) from args and
// reports whether it was set. It is not a config key, so configs.Load does not know it.
func checkConfigFlag(args []string) ([]string, bool, error) {
	var out []string
	check := false
	for i, a := range args {
		if a == "--" {
			out = append(out, args[i:]...)
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "check-config" {
			out = append(out, a)
			continue
		}
		check = true
		if hasVal {
			switch strings.ToLower(val) {
			case "true", "1":
			case "false", "0":
				check = false
			default:
				return nil, false, fmt.Errorf("--check-config=%s: not a boolean", val)
			}
		}
	}
	return out, check, nil
}

// checkConfig is `kvgate serve --check-config`: the configuration Load built (loadErr holds
// every problem it found) plus loading the tokenizer, without listening or contacting any
// worker. With no problem it prints the effective config as YAML, secrets masked, to stdout
// and returns nil; otherwise it returns every problem.
func checkConfig(cfg configs.Config, loadErr error, stdout, stderr io.Writer) error {
	problems := confval.Split(loadErr)
	if tokenizerChecked(problems) {
		// Every model's tokenizer (a hub id is fetched, or read from the hub cache).
		for _, p := range cfg.Pools() {
			if p.Tokenizer == "" {
				continue
			}
			dir, err := fetchTokenizer(context.Background(), p.Tokenizer, slog.New(slog.DiscardHandler))
			if err == nil {
				p.Tokenizer = dir
				_, err = loadTokenizer(p.Config)
			}
			if err != nil {
				if p.Key != "" {
					err = fmt.Errorf("%s.%w", p.Key, err)
				} else if !strings.HasPrefix(err.Error(), "tokenizer") && !strings.HasPrefix(err.Error(), "chat_template") {
					err = fmt.Errorf("tokenizer: %w", err)
				}
				problems = append(problems, err)
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("invalid configuration (%d problems):\n  %s", len(problems),
			strings.ReplaceAll(errors.Join(problems...).Error(), "\n", "\n  "))
	}
	enc := yaml.NewEncoder(stdout)
	enc.SetIndent(2) // as configs/kvgate.yaml is written
	if err := enc.Encode(configs.Masked(cfg)); err != nil {
		return fmt.Errorf("printing the configuration: %w", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("printing the configuration: %w", err)
	}
	for _, p := range cfg.Pools() {
		tok := "no tokenizer"
		if p.Tokenizer != "" {
			tok = "tokenizer " + p.Tokenizer + " loaded"
		}
		fmt.Fprintf(stderr, "kvgate: configuration OK (model %s, %d workers, policy %s, %s); secrets masked\n",
			p.Model, len(p.Workers), p.Router.Policy, tok)
	}
	return nil
}

// tokenizerChecked reports whether the tokenizer is worth loading: validation found nothing
// wrong with the keys it is built from (a missing folder is already one problem).
func tokenizerChecked(problems []error) bool {
	for _, p := range problems {
		for _, key := range []string{"tokenizer:", "chat_template:", "default_chat_template_kwargs:"} {
			if strings.HasPrefix(p.Error(), key) || strings.HasPrefix(p.Error(), "models[") && strings.Contains(p.Error(), "]."+key) {
				return false
			}
		}
	}
	return true
}

// loadTokenizer loads cfg's tokenizer folder with its chat template override and default
// template kwargs, as the KV-aware routing uses it.
func loadTokenizer(cfg configs.Config) (*tokenize.Tokenizer, error) {
	topts := tokenize.Options{}
	if cfg.ChatTemplate != "" {
		b, err := os.ReadFile(cfg.ChatTemplate)
		if err != nil {
			return nil, fmt.Errorf("chat_template: %w", err)
		}
		topts.ChatTemplate = string(b)
	}
	if cfg.DefaultChatTemplateKwargs != "" {
		topts.DefaultChatTemplateKwargs = json.RawMessage(cfg.DefaultChatTemplateKwargs)
	}
	tok, err := tokenize.Load(cfg.Tokenizer, topts)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return tok, nil
}
