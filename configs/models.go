package configs

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/workers/discoveryconfig"
)

// Model is one entry of models:, one served model with its own fleet. Every key an entry leaves
// out takes the top-level key's value (tokenizer, chat_template, default_chat_template_kwargs,
// block_size, router, sessions: the top-level sections are the defaults of every entry, and an
// entry's router: or sessions: overrides only the keys it names). name, workers and discovery
// are the entry's own: the top-level model, workers and discovery must be empty when models:
// is used.
type Model struct {
	// Name is the served model name clients put in "model" (vllm serve --served-model-name).
	Name string `yaml:"name"`
	// Aliases are further names routed to this model. The request body is forwarded unchanged,
	// so the workers must serve them too (vllm serve --served-model-name NAME ALIAS...).
	Aliases []string `yaml:"aliases"`
	// Tokenizer, ChatTemplate, DefaultChatTemplateKwargs and BlockSize are the top-level keys
	// of the same names, for this model; an entry that leaves one out takes the top-level value.
	Tokenizer                 string `yaml:"tokenizer"`
	ChatTemplate              string `yaml:"chat_template"`
	DefaultChatTemplateKwargs string `yaml:"default_chat_template_kwargs"`
	BlockSize                 int    `yaml:"block_size"`
	// Workers is this model's static fleet, as the top-level workers; required unless the
	// entry has discovery. A worker URL belongs to one model.
	Workers []Worker `yaml:"workers"`
	// Discovery finds this model's workers at runtime (discoveryconfig.Config); its keys left
	// out take discoveryconfig's defaults, not the top-level section.
	Discovery Discovery `yaml:"discovery"`
	// Router and Sessions override, for this model, the keys they name over the top-level
	// sections (router: {policy: least_loaded} changes the policy only); sessions.headers,
	// parent_headers and final_headers stay top-level (the identity is read before the model's
	// pool is known).
	Router   Router   `yaml:"router"`
	Sessions Sessions `yaml:"sessions"`

	// node is the entry as written, laid over the top-level keys by Pools; nil for an entry
	// built in Go, whose fields are taken as given.
	node *yaml.Node
}

// UnmarshalYAML keeps the entry's node, so that keys it leaves out inherit the top-level
// values (resolved after env and flags, see Pools), and checks its keys strictly.
func (m *Model) UnmarshalYAML(n *yaml.Node) error {
	type plain Model
	var p plain
	if err := strictDecode(n, &p); err != nil {
		return err
	}
	*m = Model(p)
	m.node = n
	return nil
}

// strictDecode decodes n into v, refusing unknown keys (yaml.v3 applies KnownFields only to a
// Decoder, not to Node.Decode).
func strictDecode(n *yaml.Node, v any) error {
	data, err := yaml.Marshal(n)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	return dec.Decode(v)
}

// Pool is one served model as the gateway runs it: a Config whose model-scoped keys (model,
// aliases, tokenizer, chat template, block size, workers, router, sessions) are that model's,
// the rest shared by every pool.
type Pool struct {
	Config
	// Aliases are the model's further names (models[].aliases).
	Aliases []string
	// Key is the config key of the pool's entry ("models[1]"), "" for the single-model form.
	Key string
}

// Names returns the model's name and aliases.
func (p Pool) Names() []string { return append([]string{p.Model}, p.Aliases...) }

// Pools returns one Pool per served model: each models: entry laid over the top-level keys,
// or, in the single-model form (model: and workers:), the top-level config alone. Load and
// LoadFile have resolved and validated them.
func (c *Config) Pools() []Pool {
	if c.pools != nil {
		return c.pools
	}
	pools, _ := c.resolvePools()
	return pools
}

// resolvePools builds the pools from the (env- and flag-applied, not yet normalized) config;
// the errors are those of entries that do not decode over the top-level keys.
func (c *Config) resolvePools() ([]Pool, []error) {
	if len(c.Models) == 0 {
		one := *c
		one.Models, one.pools = nil, nil
		return []Pool{{Config: one}}, nil
	}
	var errs []error
	pools := make([]Pool, 0, len(c.Models))
	for i, m := range c.Models {
		key := fmt.Sprintf("models[%d]", i)
		p := *c
		p.Models, p.pools = nil, nil
		if m.node == nil {
			p.Model, p.Tokenizer, p.ChatTemplate = m.Name, m.Tokenizer, m.ChatTemplate
			p.DefaultChatTemplateKwargs, p.BlockSize = m.DefaultChatTemplateKwargs, m.BlockSize
			p.Workers, p.Router, p.Sessions, p.Discovery = m.Workers, m.Router, m.Sessions, m.Discovery
			pools = append(pools, Pool{Config: p, Aliases: m.Aliases, Key: key})
			continue
		}
		o := modelOverlay{Tokenizer: c.Tokenizer, ChatTemplate: c.ChatTemplate,
			DefaultChatTemplateKwargs: c.DefaultChatTemplateKwargs, BlockSize: c.BlockSize,
			Router: c.Router, Sessions: c.Sessions, Discovery: discoveryconfig.Default()}
		// Slices in the top-level sections must not be shared with the entry's decode.
		o.Router.Latency.LearnFrom = append([]string(nil), c.Router.Latency.LearnFrom...)
		o.Sessions.Headers = append([]string(nil), c.Sessions.Headers...)
		o.Sessions.ParentHeaders = append([]string(nil), c.Sessions.ParentHeaders...)
		o.Sessions.FinalHeaders = append([]string(nil), c.Sessions.FinalHeaders...)
		if err := strictDecode(m.node, &o); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
			continue
		}
		p.Model, p.Tokenizer, p.ChatTemplate = o.Name, o.Tokenizer, o.ChatTemplate
		p.DefaultChatTemplateKwargs, p.BlockSize = o.DefaultChatTemplateKwargs, o.BlockSize
		p.Workers, p.Router, p.Sessions, p.Discovery = o.Workers, o.Router, o.Sessions, o.Discovery
		pools = append(pools, Pool{Config: p, Aliases: o.Aliases, Key: key})
	}
	return pools, errs
}

// modelOverlay is a models: entry decoded over the top-level keys it may override. It repeats
// Model's fields because Model's UnmarshalYAML keeps the node instead of decoding it.
type modelOverlay struct {
	Name                      string    `yaml:"name"`
	Aliases                   []string  `yaml:"aliases"`
	Tokenizer                 string    `yaml:"tokenizer"`
	ChatTemplate              string    `yaml:"chat_template"`
	DefaultChatTemplateKwargs string    `yaml:"default_chat_template_kwargs"`
	BlockSize                 int       `yaml:"block_size"`
	Workers                   []Worker  `yaml:"workers"`
	Discovery                 Discovery `yaml:"discovery"`
	Router                    Router    `yaml:"router"`
	Sessions                  Sessions  `yaml:"sessions"`
}

// validateModels checks what spans the pools: the single-model keys are not mixed with
// models:, names and aliases are unique, a worker belongs to one model, and the cluster (whose
// shared state is not yet keyed by model) runs with one model.
func (c *Config) validateModels(pools []Pool, bad func(key, format string, args ...any)) {
	if len(c.Models) == 0 {
		return
	}
	if strings.TrimSpace(c.Model) != "" {
		bad("model", "is set together with models: give each model its entry's name (models[].name)")
	}
	if len(c.Workers) > 0 {
		bad("workers", "are set together with models: give each model its own workers (models[].workers)")
	}
	if c.Discovery.Enabled() {
		bad("discovery", "is set together with models: give each model its own discovery (models[].discovery)")
	}
	if len(pools) > 1 && c.Cluster.Enabled() {
		bad("models", "several models with cluster: replicas share session bindings, pins and load keyed by session and worker only; run one model per replica fleet")
	}
	names := map[string]string{}
	urls := map[string]string{}
	for _, p := range pools {
		for j, n := range p.Names() {
			key := p.Key + ".name"
			if j > 0 {
				key = fmt.Sprintf("%s.aliases[%d]", p.Key, j-1)
			}
			if strings.TrimSpace(n) == "" {
				if j > 0 {
					bad(key, "is empty")
				}
				continue
			}
			if prev, dup := names[n]; dup {
				bad(key, "%q is also %s", n, prev)
				continue
			}
			names[n] = key
		}
		if !slices.Equal(p.Sessions.Headers, c.Sessions.Headers) || !slices.Equal(p.Sessions.ParentHeaders, c.Sessions.ParentHeaders) ||
			!slices.Equal(p.Sessions.FinalHeaders, c.Sessions.FinalHeaders) {
			bad(p.Key+".sessions", "headers, parent_headers and final_headers are read before the model is known: set them at the top level only")
		}
		for i, w := range p.Workers {
			u := strings.TrimRight(strings.TrimSpace(w.URL), "/")
			key := fmt.Sprintf("%s.workers[%d].url", p.Key, i)
			if prev, dup := urls[u]; dup && !strings.HasPrefix(prev, p.Key+".") {
				bad(key, "%q is also %s: a vLLM server serves one base model (list its adapters' models under that one)", u, prev)
				continue
			}
			urls[u] = key
		}
	}
}
