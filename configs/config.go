package configs

import (
	"time"

	"github.com/kvgate/kvgate/cluster/clusterconfig"
	"github.com/kvgate/kvgate/indexers/eventsconfig"
	"github.com/kvgate/kvgate/router/routerconfig"
	"github.com/kvgate/kvgate/server/serverconfig"
	"github.com/kvgate/kvgate/sessions/sessionsconfig"
	"github.com/kvgate/kvgate/workers/discoveryconfig"
	"github.com/kvgate/kvgate/workers/healthconfig"
)

// Config is the whole kvgate configuration. Load starts from Default and applies the file, then
// KVGATE_* environment, then flags; a key that is set keeps its value, zero included (0 is never
// "use the default"). Each section's type, defaults and validation belong to its package.
// A field holding a secret carries `secret:"true"` (confval.SecretTag): Masked hides it, and
// TestSecretKeysTagged fails for a secret-sounding key without the tag.
type Config struct {
	Listen string `yaml:"listen"`
	// AdminListen is the address of the admin listener serving /debug/*; "" (the default)
	// serves no debug endpoints at all. Bind it to loopback or a private network.
	AdminListen string `yaml:"admin_listen"`
	// AdminToken, when set, is the bearer token every admin request must carry.
	AdminToken string `yaml:"admin_token" secret:"true"`
	Model      string `yaml:"model"`
	Tokenizer  string `yaml:"tokenizer"`
	// ChatTemplate is a Jinja file overriding the tokenizer folder's template (the file the
	// workers get as vllm serve --chat-template); "" uses the folder's.
	ChatTemplate string `yaml:"chat_template"`
	// DefaultChatTemplateKwargs is a JSON object merged under every request's
	// chat_template_kwargs (vllm serve --default-chat-template-kwargs); "" for none.
	DefaultChatTemplateKwargs string   `yaml:"default_chat_template_kwargs"`
	BlockSize                 int      `yaml:"block_size"`
	Workers                   []Worker `yaml:"workers"`
	// Discovery finds the workers at runtime (Kubernetes EndpointSlices or DNS), beside or
	// instead of the static workers list (discoveryconfig.Config documents each key).
	Discovery Discovery `yaml:"discovery"`
	Router    Router    `yaml:"router"`
	Proxy     Proxy     `yaml:"proxy"`
	Health    Health    `yaml:"health"`
	Limits    Limits    `yaml:"limits"`
	// CORS is off unless origins are listed (serverconfig.CORS).
	CORS serverconfig.CORS `yaml:"cors"`
	// Metrics chooses where the detailed series are served (serverconfig.Metrics).
	Metrics   serverconfig.Metrics `yaml:"metrics"`
	Sessions  Sessions             `yaml:"sessions"`
	Auth      Auth                 `yaml:"auth"`
	KVEvents  KVEvents             `yaml:"kv_events"`
	Anthropic Anthropic            `yaml:"anthropic"`
	// Cluster joins this replica to its peers over NATS; off unless nats_url or
	// embedded_nats.listen is set (clusterconfig.Config documents each key).
	Cluster Cluster `yaml:"cluster"`
	// ShutdownDrainDelay is how long, on SIGTERM, the gateway keeps accepting requests after
	// GET /ready turned 503, so load balancers (Kubernetes Service endpoints) stop sending
	// before the listener closes.
	ShutdownDrainDelay Duration `yaml:"shutdown_drain_delay"`
	// ShutdownTimeout is how long running requests may finish once the listener closed;
	// streams still running then end with an error event.
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
	LogLevel        string   `yaml:"log_level"`
	// LogFormat is the log lines' form: text (logfmt) or json.
	LogFormat string `yaml:"log_format"`
	// AccessLog writes one info line per client request (server's access log); false = none.
	AccessLog bool `yaml:"access_log"`

	// Models lists the served models, each with its own fleet (Model); empty: the single-model
	// form above (model, tokenizer, workers). Pools resolves either form.
	Models []Model `yaml:"models"`

	// pools and poolErrs are the pools normalize resolved (nil before: Pools resolves then).
	pools    []Pool
	poolErrs []error
	// policyAuto records that router.policy was auto, for validation messages.
	policyAuto bool
}

// Worker is one vLLM server: its OpenAI base URL and, optionally, its KV-event sockets.
type Worker struct {
	URL      string `yaml:"url"`
	KVEvents string `yaml:"kv_events"`
	Replay   string `yaml:"replay"`
	DPSize   int    `yaml:"dp_size"`
	// Topic is the KV-event topic prefix subscribed to; "" (vLLM's default topic) receives every
	// topic the worker publishes.
	Topic string `yaml:"topic"`
	// APIKey is the worker's vllm serve --api-key, sent as Authorization: Bearer on every call
	// the gateway makes to it; "" uses auth.worker_api_key.
	APIKey string `yaml:"api_key" secret:"true"`
}

// Auth holds the client API keys checked on the client listener and the key the gateway
// presents to workers.
type Auth struct {
	// APIKeys are the keys clients may send as Authorization: Bearer; with none (and no
	// APIKeysFile) the client listener is open.
	APIKeys []string `yaml:"api_keys" secret:"true"`
	// APIKeysFile names a file of further client keys, one per line (blank lines and lines
	// starting with # are skipped).
	APIKeysFile string `yaml:"api_keys_file"`
	// WorkerAPIKey is the fleet-wide default of workers[].api_key.
	WorkerAPIKey string `yaml:"worker_api_key" secret:"true"`
	// Keys are client keys with a name and a cache group (ClientKey); api_keys and
	// api_keys_file stay the plain form, each key an entry with a derived name and no group.
	Keys []ClientKey `yaml:"keys"`
	// CacheIsolation is none (keys share the workers' prefix caches) or per_key (each key's
	// requests are salted with a salt derived from its secret, or from its cache_group: see
	// ClientKeySalts). It has no effect without client keys.
	CacheIsolation string `yaml:"cache_isolation"`
	// CacheSaltSecretFile holds the secret the salts of cache groups are derived from (at least
	// 32 bytes; required when a key has a cache_group under per_key). Every replica needs the
	// same file.
	CacheSaltSecretFile string `yaml:"cache_salt_secret_file"`
}

// ClientKey is one entry of auth.keys (issue 33 adds priority and limits to the same entries).
type ClientKey struct {
	// Key is the secret the client sends (Authorization: Bearer, or x-api-key).
	Key string `yaml:"key" secret:"true"`
	// Name names the key in logs, /debug views, Responses ownership and POST /debug/route's
	// ?as_key; "" derives one from the key ("key-" and 8 hex digits of a hash).
	Name string `yaml:"name"`
	// CacheGroup, when set, shares one cache salt among the keys that name the same group.
	CacheGroup string `yaml:"cache_group"`
	// RequestsPerMinute limits the key's requests to the inference endpoints (a token bucket
	// refilled continuously at this rate, holding at most Burst); over it the answer is 429 with
	// Retry-After. With replicas on NATS the limit is the fleet's. 0 (the default) is no limit.
	RequestsPerMinute int `yaml:"requests_per_minute"`
	// TokensPerMinute limits the key's tokens (prompt plus max_tokens, 1,024 when the request
	// names none, corrected by the worker's usage when the response ends), as a token bucket
	// like RequestsPerMinute's. 0 (the default) is no limit.
	TokensPerMinute int `yaml:"tokens_per_minute"`
	// MaxConcurrent bounds the key's requests in flight (admitted and not finished, across the
	// fleet with replicas); over it the answer is 429. 0 (the default) is no bound.
	MaxConcurrent int `yaml:"max_concurrent"`
	// Burst is the most requests the key may send at once: the size of the requests bucket. The
	// tokens bucket holds the same span of time at its own rate (or Burst tokens without
	// RequestsPerMinute). 0 (the default) is one second of each rate, at least 1.
	Burst int `yaml:"burst"`
}

// The auth.cache_isolation values.
const (
	CacheIsolationNone   = "none"
	CacheIsolationPerKey = "per_key"
)

// KVEvents configures how kvgate follows the workers' KV events; its owner is the indexers
// package (eventsconfig.Config, which documents each key).
type KVEvents = eventsconfig.Config

// CollectorWorker reports whether w is fed through the collector (kv_events.listen).
func (c *Config) CollectorWorker(w Worker) bool {
	return c.KVEvents.Listen != "" && w.KVEvents == "" && w.Topic != ""
}

// PolicyAuto is the router.policy value (also the default, and what an empty value means) that
// resolves to "kv" when any worker has kv_events and to "round_robin" otherwise.
const PolicyAuto = "auto"

// Policies returns the router.policy names the gateway knows (besides PolicyAuto).
func Policies() []string {
	return []string{"round_robin", "random", "least_loaded", "kv", "kv_no_load", "kv_blocks"}
}

// KVAware reports whether policy is one of the KV-aware policies (they need the tokenizer).
func KVAware(policy string) bool {
	return policy == "kv" || policy == "kv_no_load" || policy == "kv_blocks"
}

// Router selects the routing policy; the knobs of the KV-aware policies (kv, kv_blocks, kv_no_load) are
// the router package's own type, routerconfig.KV, inlined under the same router: keys
// (routerconfig.KV documents what each one trades).
type Router struct {
	// Policy is one of Policies(), or "auto"/"" (kv with kv_events, else round_robin); Load
	// resolves auto, so after Load it is always a concrete name.
	Policy string `yaml:"policy"`
	// Seed seeds the random policy; 0 draws a seed at start.
	Seed uint64 `yaml:"seed"`

	routerconfig.KV `yaml:",inline"`
	// Responses bounds the Responses API pins (previous_response_id → the worker storing it).
	Responses routerconfig.Responses `yaml:"responses"`
}

// Approximate configures the cache prediction for workers without (healthy) KV events.
type Approximate = routerconfig.Approx

// Proxy bounds how requests are forwarded to workers; its owner is the server
// (serverconfig.Proxy, which documents each key).
type Proxy = serverconfig.Proxy

// Discovery configures runtime worker discovery; its owner is the workers package
// (discoveryconfig.Config, which documents each key).
type Discovery = discoveryconfig.Config

// Health configures active /health probing of workers; its owner is the workers package
// (healthconfig.Config, which documents each key).
type Health = healthconfig.Config

// Limits bound what one client can make the gateway spend; their owner is the server
// (serverconfig.Limits, which documents each key).
type Limits = serverconfig.Limits

// Sessions configures session identity, affinity and parent-aware placement; its owner is the
// sessions package (sessionsconfig.Config, which documents each key).
type Sessions = sessionsconfig.Config

// Cluster configures how replicas share state over NATS; its owner is the cluster package
// (clusterconfig.Config, which documents each key).
type Cluster = clusterconfig.Config

// Default returns the built-in defaults; configs/kvgate.yaml documents the same values.
func Default() Config {
	return Config{
		Listen:    "127.0.0.1:8000",
		BlockSize: 16,
		Router: Router{
			Policy:    PolicyAuto,
			KV:        routerconfig.Default(),
			Responses: routerconfig.DefaultResponses(),
		},
		Proxy:              serverconfig.DefaultProxy(),
		Health:             healthconfig.Default(),
		Discovery:          discoveryconfig.Default(),
		Limits:             serverconfig.DefaultLimits(),
		Anthropic:          Anthropic{CountTokens: CountTokensLocal, InlineSystem: "merge"},
		KVEvents:           eventsconfig.Default(),
		Sessions:           sessionsconfig.Default(),
		Cluster:            clusterconfig.Default(),
		ShutdownDrainDelay: Duration(5 * time.Second),
		ShutdownTimeout:    Duration(30 * time.Second),
		LogLevel:           "info",
		LogFormat:          "text",
		AccessLog:          true,
		Auth:               Auth{CacheIsolation: CacheIsolationPerKey},
	}
}
