package configs

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvgate/kvgate/confval"
)

// normalize fills implied values: dp_size 0 means 1, worker URLs lose a trailing slash, a
// worker without api_key gets auth.worker_api_key, and router.policy auto (or empty) becomes
// kv when any worker has kv_events, else round_robin. The pools are resolved first (an entry of
// models: inherits the top-level router.policy as written, auto included) and normalized alike.
func (c *Config) normalize() {
	pools, errs := c.resolvePools()
	c.normalizeOne()
	for i := range pools {
		pools[i].normalizeOne()
	}
	c.pools, c.poolErrs = pools, errs
}

func (c *Config) normalizeOne() {
	for i := range c.Workers {
		c.Workers[i].URL = strings.TrimRight(strings.TrimSpace(c.Workers[i].URL), "/")
		if c.Workers[i].DPSize == 0 {
			c.Workers[i].DPSize = 1
		}
		if c.Workers[i].APIKey == "" {
			c.Workers[i].APIKey = c.Auth.WorkerAPIKey
		}
	}
	c.Router.Policy = strings.TrimSpace(c.Router.Policy)
	if c.Router.Policy == "" || c.Router.Policy == PolicyAuto {
		c.Router.Policy = "round_robin"
		if c.EventsWorker() >= 0 || c.Discovery.Events() {
			c.Router.Policy = "kv"
		}
		c.policyAuto = true
	}
}

// EventsWorker returns the index of the first worker with kv_events (or fed through the
// collector), or -1.
func (c *Config) EventsWorker() int {
	for i, w := range c.Workers {
		if w.KVEvents != "" || c.CollectorWorker(w) {
			return i
		}
	}
	return -1
}

// Validate checks every key and returns all problems at once, each naming its key. The
// model-scoped keys are checked per pool (models[i]. before the key in the models: form).
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}

	if _, port, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen", "%q is not host:port", c.Listen)
	} else if port == "" {
		bad("listen", "%q has no port", c.Listen)
	}
	c.validateAnthropic(bad)

	pools, perrs := c.pools, c.poolErrs
	if pools == nil {
		pools, perrs = c.resolvePools()
	}
	errs = append(errs, perrs...)
	c.validateModels(pools, bad)
	for i := range pools {
		p := &pools[i]
		pbad := bad
		if p.Key != "" {
			pbad = func(key, format string, args ...any) {
				if key == "model" {
					key = "name"
				}
				bad(p.Key+"."+key, format, args...)
			}
		}
		p.validatePool(pbad)
	}

	errs = append(errs, confval.Split(confval.Prefix("kv_events.", c.KVEvents.Validate()))...)
	validateCollector(c.KVEvents.Listen, pools, bad)
	errs = append(errs, confval.Split(confval.Prefix("proxy.", c.Proxy.Validate()))...)
	errs = append(errs, confval.Split(confval.Prefix("health.", c.Health.Validate()))...)
	errs = append(errs, confval.Split(confval.Prefix("limits.", c.Limits.Validate()))...)
	errs = append(errs, confval.Split(confval.Prefix("cluster.", c.Cluster.Validate()))...)
	errs = append(errs, confval.Split(confval.Prefix("flow_control.", c.FlowControl.Validate()))...)
	c.validateAuth(bad)
	if c.ShutdownDrainDelay < 0 {
		bad("shutdown_drain_delay", "must not be negative, got %s", c.ShutdownDrainDelay)
	}
	if c.ShutdownTimeout < 0 {
		bad("shutdown_timeout", "must not be negative, got %s", c.ShutdownTimeout)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log_level", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		bad("log_format", "%q is not one of text, json", c.LogFormat)
	}
	return errors.Join(errs...)
}

// validatePool checks the model-scoped keys of one pool: model, tokenizer, chat template,
// block size, workers (static or discovered), router and sessions.
func (c *Config) validatePool(bad func(key, format string, args ...any)) {
	if strings.TrimSpace(c.Model) == "" {
		bad("model", "is required: the served model name clients send (vllm serve --served-model-name)")
	}
	if c.Tokenizer != "" {
		if st, err := os.Stat(c.Tokenizer); err == nil && st.IsDir() {
			if _, err := os.Stat(filepath.Join(c.Tokenizer, "tokenizer.json")); err != nil {
				bad("tokenizer", "%q holds no tokenizer.json", c.Tokenizer)
			}
		} else if !IsHubModelID(c.Tokenizer) {
			bad("tokenizer", "%q is not a folder (nor a Hugging Face model id org/name)", c.Tokenizer)
		}
	}
	if c.ChatTemplate != "" {
		if st, err := os.Stat(c.ChatTemplate); err != nil || st.IsDir() {
			bad("chat_template", "%q is not a readable file", c.ChatTemplate)
		} else if c.Tokenizer == "" {
			bad("chat_template", "is set but tokenizer is not (the template is rendered with the tokenizer)")
		}
	}
	if c.DefaultChatTemplateKwargs != "" {
		var obj map[string]any
		if err := json.Unmarshal([]byte(c.DefaultChatTemplateKwargs), &obj); err != nil || obj == nil {
			bad("default_chat_template_kwargs", "%q is not a JSON object", c.DefaultChatTemplateKwargs)
		}
	}
	if c.BlockSize <= 0 {
		bad("block_size", "must be a positive number of tokens, got %d", c.BlockSize)
	}

	if len(c.Workers) == 0 && !c.Discovery.Enabled() {
		bad("workers", "at least one worker is required (workers: in the file, --worker URL, or KVGATE_WORKERS), or a discovery source (discovery.kubernetes.service or discovery.dns.name)")
	}
	seen := map[string]int{}
	for i, w := range c.Workers {
		key := fmt.Sprintf("workers[%d]", i)
		if msg := checkHTTPURL(w.URL); msg != "" {
			bad(key+".url", "%q %s", w.URL, msg)
		} else if j, dup := seen[w.URL]; dup {
			bad(key+".url", "%q is the same worker as workers[%d]", w.URL, j)
		} else {
			seen[w.URL] = i
		}
		if w.KVEvents != "" {
			if msg := checkZMQEndpoint(w.KVEvents); msg != "" {
				bad(key+".kv_events", "%q %s", w.KVEvents, msg)
			}
		}
		if w.Replay != "" {
			if msg := checkZMQEndpoint(w.Replay); msg != "" {
				bad(key+".replay", "%q %s", w.Replay, msg)
			} else if w.KVEvents == "" && !c.CollectorWorker(w) {
				bad(key+".replay", "is set but kv_events is not (replay only fills gaps of a subscribed stream)")
			}
		}
		if w.DPSize < 1 {
			bad(key+".dp_size", "must be at least 1, got %d", w.DPSize)
		}
	}
	c.validateRouter(bad)
	for _, sec := range []struct {
		prefix string
		err    error
	}{
		{"router.", c.Router.KV.Validate()},
		{"router.responses.", c.Router.Responses.Validate()},
		{"sessions.", c.Sessions.Validate()},
		{"discovery.", c.Discovery.Validate()},
	} {
		for _, e := range confval.Split(confval.Prefix(sec.prefix, sec.err)) {
			key, msg, _ := strings.Cut(e.Error(), ": ")
			bad(key, "%s", msg)
		}
	}
}

// IsHubModelID reports whether s has the form of a Hugging Face model id (org/name), which the
// gateway fetches from the hub at start when no folder of that name exists.
func IsHubModelID(s string) bool {
	org, name, ok := strings.Cut(s, "/")
	return ok && hubPart(org) && hubPart(name)
}

func hubPart(s string) bool {
	if s == "" || s[0] == '.' || s[0] == '-' || strings.Contains(s, "..") {
		return false
	}
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		if !ok {
			return false
		}
	}
	return true
}

func checkHTTPURL(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case raw == "":
		return "is empty"
	case err != nil:
		return "is not a URL"
	case u.Scheme != "http" && u.Scheme != "https":
		return "must start with http:// or https://"
	case u.Host == "":
		return "has no host"
	case u.RawQuery != "" || u.Fragment != "":
		return "must not carry a query or fragment"
	case strings.HasSuffix(u.Path, "/v1"):
		return "must be the server's base URL, without /v1"
	}
	return ""
}

func checkZMQEndpoint(ep string) string {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok {
		return "is not a ZMQ endpoint (tcp://host:port or ipc://path)"
	}
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil || host == "" || port == "" {
			return "must be tcp://host:port"
		}
		if host == "*" {
			return "names a bind address (*); give the worker's host"
		}
	case "ipc", "inproc":
		if rest == "" {
			return "has an empty path"
		}
	default:
		return "must use tcp://, ipc:// or inproc://"
	}
	return ""
}

// validateCollector checks what of kv_events spans the pools: the collector's workers and
// their topics (the section's own keys are checked by its owner, eventsconfig.Config).
func validateCollector(listen string, pools []Pool, bad func(key, format string, args ...any)) {
	if listen == "" {
		return
	}
	topics := map[string]string{}
	for _, p := range pools {
		prefix := ""
		if p.Key != "" {
			prefix = p.Key + "."
		}
		for i, w := range p.Workers {
			if !p.CollectorWorker(w) {
				continue
			}
			key := fmt.Sprintf("%sworkers[%d]", prefix, i)
			if prev, dup := topics[w.Topic]; dup {
				bad(key+".topic", "%q is also %s's: the collector attributes messages by topic", w.Topic, prev)
			} else {
				topics[w.Topic] = key
			}
		}
	}
	if len(topics) == 0 {
		bad("kv_events.listen", "is set but no worker is fed through it (give a worker a topic and no kv_events)")
	}
}
