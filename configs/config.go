package configs

import (
	"time"

	"github.com/kvgate/kvgate/cluster/clusterconfig"
	"github.com/kvgate/kvgate/flowcontrol"
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
	// Listen is the address (host:port) the client listener binds (default 127.0.0.1:8000);
	// use 0.0.0.0:8000 to serve other hosts, after reading docs/security.md.
	Listen string `yaml:"listen"`
	// AdminListen is the address of the admin listener serving /debug/*; "" (the default)
	// serves no debug endpoints at all. Bind it to loopback or a private network.
	AdminListen string `yaml:"admin_listen"`
	// AdminToken, when set, is the bearer token every admin request must carry.
	// Without it the admin listener answers 401 with WWW-Authenticate; "" (the default) requires
	// none.
	AdminToken string `yaml:"admin_token" secret:"true"`
	// Model is the served model name clients put in "model" (vllm serve --served-model-name);
	// required in the single-model form (no default). Requests for another model get OpenAI's
	// 404 model_not_found unless a worker lists it in its /v1/models (a LoRA adapter).
	Model string `yaml:"model"`
	// Tokenizer is the folder holding the model's tokenizer.json and tokenizer_config.json
	// (chat template), or a Hugging Face model id org/name fetched at start into the hub cache
	// (docs/tokenization.md); "" (the default) is none. The KV-aware policies need it: the
	// gateway renders and tokenizes each prompt as the workers do to match its blocks.
	Tokenizer string `yaml:"tokenizer"`
	// ChatTemplate is a Jinja file overriding the tokenizer folder's template (the file the
	// workers get as vllm serve --chat-template); "" uses the folder's.
	ChatTemplate string `yaml:"chat_template"`
	// DefaultChatTemplateKwargs is a JSON object merged under every request's
	// chat_template_kwargs (vllm serve --default-chat-template-kwargs); "" for none.
	DefaultChatTemplateKwargs string `yaml:"default_chat_template_kwargs"`
	// BlockSize is the KV block size in tokens (default 16); it must equal the workers'
	// vllm serve --block-size, or no block the gateway hashes matches one they report.
	BlockSize int `yaml:"block_size"`
	// Workers is the static fleet (Worker); required unless discovery is set. In flags and
	// KVGATE_WORKERS each worker is a spec (configs.ParseWorkerSpec): a repeated --worker
	// replaces the file's list, and the variable separates workers with ';' or spaces.
	Workers []Worker `yaml:"workers"`
	// Discovery finds the workers at runtime (Kubernetes EndpointSlices or DNS), beside or
	// instead of the static workers list (discoveryconfig.Config documents each key).
	Discovery Discovery `yaml:"discovery"`
	// Router picks the routing policy and holds the KV-aware policies' knobs (docs/routing.md).
	Router Router `yaml:"router"`
	// Proxy bounds how requests are forwarded to workers: retries, body size, timeouts and the
	// connection pool.
	Proxy Proxy `yaml:"proxy"`
	// Health configures the workers' /health probes, ejection and readmission.
	Health Health `yaml:"health"`
	// Limits bound what one client can make the gateway spend: tokenization slots and their
	// queue, body read time, connections per address, prompt length.
	Limits Limits `yaml:"limits"`
	// CORS is off unless origins are listed (serverconfig.CORS).
	CORS serverconfig.CORS `yaml:"cors"`
	// Metrics chooses where the detailed series are served (serverconfig.Metrics).
	Metrics serverconfig.Metrics `yaml:"metrics"`
	// Sessions configures session identity, affinity and parent-aware placement
	// (docs/sessions.md).
	Sessions Sessions `yaml:"sessions"`
	// Auth holds the client keys the client listener requires and the key sent to workers
	// (docs/security.md).
	Auth Auth `yaml:"auth"`
	// KVEvents configures how the workers' KV events are received: message size, the settle
	// time after lost batches, and the collector for workers that publish by connecting out.
	KVEvents KVEvents `yaml:"kv_events"`
	// Anthropic configures the Anthropic Messages endpoints (/v1/messages, count_tokens).
	Anthropic Anthropic `yaml:"anthropic"`
	// Cluster joins this replica to its peers over NATS; off unless nats_url or
	// embedded_nats.listen is set (clusterconfig.Config documents each key).
	Cluster Cluster `yaml:"cluster"`
	// FlowControl queues requests at the gateway while every candidate worker is saturated,
	// with priorities and fair shares (flowcontrol.Config documents each key); on by default.
	FlowControl FlowControl `yaml:"flow_control"`
	// ShutdownDrainDelay is how long, on SIGTERM, the gateway keeps accepting requests after
	// GET /ready turned 503, so load balancers (Kubernetes Service endpoints) stop sending
	// before the listener closes.
	ShutdownDrainDelay Duration `yaml:"shutdown_drain_delay"`
	// ShutdownTimeout is how long running requests may finish once the listener closed;
	// streams still running then end with an error event.
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
	// LogLevel is debug, info (the default), warn or error. At debug every routed request logs
	// a "routed" line with its session, parent, target and the whole decision record as JSON
	// (each candidate's G1/G2/G3 overlap, load, eviction term, cost and busy flag; the reason;
	// regret; hold): block counts and targets only, no prompt text.
	LogLevel string `yaml:"log_level"`
	// LogFormat is the log lines' form on stderr: text (logfmt, the default) or json.
	LogFormat string `yaml:"log_format"`
	// AccessLog writes one info line per client request (default true), message "access":
	// method, path, status, latency_ms, and once known ttft_ms (first body byte; an Anthropic
	// stream's first content_block_delta, a Responses stream's first delta), worker,
	// cached_blocks (of the last attempt),
	// prompt_tokens, session (hashed), model; never prompt text, keys or header values.
	// /health, /metrics, /live and /ready are not logged; false (or log_level above info) logs
	// none.
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
	// URL is the worker's OpenAI base URL without /v1 (http://10.0.0.1:8000); required.
	URL string `yaml:"url"`
	// KVEvents is the worker's ZMQ PUB endpoint of KV events (tcp://10.0.0.1:5557: its
	// --kv-events-config endpoint with the worker's address instead of *); "" routes it in
	// approximate mode.
	KVEvents string `yaml:"kv_events"`
	// Replay is the worker's ZMQ replay endpoint (its --kv-events-config replay_endpoint), which
	// the gateway asks for the batches it missed; "" for none.
	Replay string `yaml:"replay"`
	// DPSize is the worker's data-parallel size (vllm serve --data-parallel-size; 0 or 1 is one
	// rank): rank r publishes on the kv_events and replay ports plus r.
	DPSize int `yaml:"dp_size"`
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
	// Clients may also send a key as x-api-key (Anthropic SDKs, Claude Code), on every route;
	// every request except GET /health, /metrics, /live and /ready then needs one.
	APIKeys []string `yaml:"api_keys" secret:"true"`
	// APIKeysFile names a file of further client keys, one per line (blank lines and lines
	// starting with # are skipped).
	// A file without any key is a configuration error.
	APIKeysFile string `yaml:"api_keys_file"`
	// WorkerAPIKey is the fleet-wide default of workers[].api_key.
	// It is sent as Authorization: Bearer to every worker without its own api_key (vllm serve
	// --api-key), on probes, model refreshes, metrics scrapes and proxied requests; without one
	// the client's Authorization is passed through.
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
	// A name is 1 to 64 of A-Za-z0-9._- and unique among the keys.
	Name string `yaml:"name"`
	// CacheGroup, when set, shares one cache salt among the keys that name the same group.
	CacheGroup string `yaml:"cache_group"`
	// RequestsPerMinute limits the key's requests to the inference endpoints (a token bucket
	// refilled continuously at this rate, holding at most burst); over it the answer is 429 with
	// Retry-After. With replicas on NATS the limit is the fleet's. 0 (the default) is no limit.
	RequestsPerMinute int `yaml:"requests_per_minute"`
	// TokensPerMinute limits the key's tokens (prompt plus max_tokens, 1,024 when the request
	// names none, corrected by the worker's usage when the response ends), as a token bucket
	// like requests_per_minute's. 0 (the default) is no limit.
	TokensPerMinute int `yaml:"tokens_per_minute"`
	// MaxConcurrent bounds the key's requests in flight (admitted and not finished, across the
	// fleet with replicas); over it the answer is 429. 0 (the default) is no bound.
	MaxConcurrent int `yaml:"max_concurrent"`
	// Burst is the most requests the key may send at once: the size of the requests bucket. The
	// tokens bucket holds the same span of time at its own rate (or burst tokens without
	// requests_per_minute). 0 (the default) is one second of each rate, at least 1.
	Burst int `yaml:"burst"`
	// Priority is the highest flow-control priority the key's requests get (default 0; -100
	// to 100): its requests have it unless a header
	// (x-kvgate-priority, x-gateway-inference-objective) asks for a lower one. Higher is
	// dispatched first when requests wait at the gateway (flow_control).
	Priority int `yaml:"priority"`
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
	// The names: auto, kv (lowest predicted time to first token), kv_no_load, kv_blocks,
	// round_robin, random, least_loaded (docs/routing.md, "Routing policies"). auto (the default)
	// needs no tokenizer unless it resolves to kv.
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

// FlowControl configures the gateway's queue, priorities and fair shares; its owner is the
// flowcontrol package (flowcontrol.Config, which documents each key).
type FlowControl = flowcontrol.Config

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
		FlowControl:        flowcontrol.Default(),
		ShutdownDrainDelay: Duration(5 * time.Second),
		ShutdownTimeout:    Duration(30 * time.Second),
		LogLevel:           "info",
		LogFormat:          "text",
		AccessLog:          true,
		Auth:               Auth{CacheIsolation: CacheIsolationPerKey},
	}
}
