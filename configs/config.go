package configs

import (
	"time"

	"github.com/kvgate/kvgate/router/routerconfig"
	"github.com/kvgate/kvgate/workers/healthconfig"
)

// Config is the whole kvgate configuration. Zero values are replaced by Default's values only
// where Default sets them; Load applies file, then KVGATE_* environment, then flags.
type Config struct {
	Listen string `yaml:"listen"`
	// AdminListen is the address of the admin listener serving /debug/*; "" (the default)
	// serves no debug endpoints at all. Bind it to loopback or a private network.
	AdminListen string `yaml:"admin_listen"`
	// AdminToken, when set, is the bearer token every admin request must carry.
	AdminToken string `yaml:"admin_token"`
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
	Router                    Router   `yaml:"router"`
	Proxy                     Proxy    `yaml:"proxy"`
	Health                    Health   `yaml:"health"`
	Limits                    Limits   `yaml:"limits"`
	Sessions                  Sessions `yaml:"sessions"`
	Auth                      Auth     `yaml:"auth"`
	KVEvents                  KVEvents `yaml:"kv_events"`
	ShutdownTimeout           Duration `yaml:"shutdown_timeout"`
	LogLevel                  string   `yaml:"log_level"`

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
	APIKey string `yaml:"api_key"`
}

// Auth holds the client API keys checked on the client listener and the key the gateway
// presents to workers.
type Auth struct {
	// APIKeys are the keys clients may send as Authorization: Bearer; with none (and no
	// APIKeysFile) the client listener is open.
	APIKeys []string `yaml:"api_keys"`
	// APIKeysFile names a file of further client keys, one per line (blank lines and lines
	// starting with # are skipped).
	APIKeysFile string `yaml:"api_keys_file"`
	// WorkerAPIKey is the fleet-wide default of workers[].api_key.
	WorkerAPIKey string `yaml:"worker_api_key"`
}

// KVEvents configures how kvgate follows the workers' KV events (per-worker endpoints are in
// Worker).
type KVEvents struct {
	// Listen, when set, is the address of the collector: kvgate binds one SUB there for workers
	// that publish by connecting out (vLLM connects when its endpoint has no "*"). Every worker
	// with a topic and no kv_events is fed through it, attributed by its exact topic.
	Listen string `yaml:"listen"`
	// MaxMsgSize is ZMQ_MAXMSGSIZE on every KV-event socket: a larger message drops the
	// connection (which is then re-established).
	MaxMsgSize ByteSize `yaml:"max_msg_size"`
	// Settle is how long a worker+rank whose event index lost batches stays approximate.
	Settle Duration `yaml:"settle"`
}

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
}

// Approximate configures the cache prediction for workers without (healthy) KV events.
type Approximate = routerconfig.Approx

// Proxy bounds how requests are forwarded to workers.
type Proxy struct {
	MaxRetries            int      `yaml:"max_retries"`
	MaxBodyBytes          ByteSize `yaml:"max_body_bytes"`
	DialTimeout           Duration `yaml:"dial_timeout"`
	ResponseHeaderTimeout Duration `yaml:"response_header_timeout"`
	StreamIdleTimeout     Duration `yaml:"stream_idle_timeout"`
	IdleConnTimeout       Duration `yaml:"idle_conn_timeout"`
	MaxIdleConnsPerWorker int      `yaml:"max_idle_conns_per_worker"`
	// ExposeRoutingHeaders adds X-Kvgate-Worker and X-Kvgate-Cached-Blocks to responses. Off by
	// default: the cached-block count lets a client test guesses of other users' prompts.
	ExposeRoutingHeaders bool `yaml:"expose_routing_headers"`
}

// Health configures active /health probing of workers; its owner is the workers package
// (healthconfig.Config, which documents each key).
type Health = healthconfig.Config

// Limits bound what one client can make the gateway spend.
type Limits struct {
	// MaxModelLen is the longest prompt+output in tokens (vllm serve --max-model-len); prompts
	// of at least this many tokens get vLLM's 400 before anything is sent. 0 learns it from the
	// workers' /v1/models max_model_len.
	MaxModelLen int `yaml:"max_model_len"`
	// MaxConcurrentTokenizations caps requests being tokenized at once; 0 = GOMAXPROCS.
	MaxConcurrentTokenizations int `yaml:"max_concurrent_tokenizations"`
	// TokenizeQueue caps requests waiting for a tokenization slot; beyond it they get 503.
	TokenizeQueue int `yaml:"tokenize_queue"`
	// TokenizeQueueTimeout is the longest wait for a tokenization slot (then 503).
	TokenizeQueueTimeout Duration `yaml:"tokenize_queue_timeout"`
	// BodyReadTimeout bounds reading one request's body after its headers; 0 = none. Responses
	// (streams) are never timed out by it.
	BodyReadTimeout Duration `yaml:"body_read_timeout"`
	// MaxConnsPerIP caps concurrent client connections from one IP address; 0 = no cap.
	MaxConnsPerIP int `yaml:"max_conns_per_ip"`
}

// Sessions names the request headers that carry session identity (docs/ARCHITECTURE.md, "Session
// identity"; first match wins) and configures session affinity and parent-aware placement (KV-aware
// policies only).
type Sessions struct {
	Headers       []string `yaml:"headers"`
	ParentHeaders []string `yaml:"parent_headers"`
	FinalHeaders  []string `yaml:"final_headers"`
	// MaxSessions bounds tracked sessions (least recently used evicted).
	MaxSessions int `yaml:"max_sessions"`
	// MaxNodes bounds the shared session prefix forest (blocks).
	MaxNodes int `yaml:"max_nodes"`
	// AffinityBlocks is the credit, in prompt blocks, a session's earlier target gets; 0 disables.
	AffinityBlocks float64 `yaml:"affinity_blocks"`
	// ParentAware turns parent-aware placement of a new child session on.
	ParentAware bool `yaml:"parent_aware"`
	// ParentMode is whose placement a new child follows: parent, lineage_root or sibling_group.
	ParentMode string `yaml:"parent_mode"`
	// ParentBlocks is the credit, in prompt blocks, of a parent-aware hint; 0 disables it.
	ParentBlocks float64 `yaml:"parent_blocks"`
	// GroupTargets bounds how many targets a sibling group remembers.
	GroupTargets int `yaml:"group_targets"`
	// SiblingPrefix credits blocks the parent's or a sibling's in-flight request is computing.
	SiblingPrefix bool `yaml:"sibling_prefix"`
	// PendingTTL is how long such an in-flight prompt is credited.
	PendingTTL Duration `yaml:"pending_ttl"`
}

// Default returns the built-in defaults; configs/kvgate.yaml documents the same values.
func Default() Config {
	return Config{
		Listen:    "127.0.0.1:8000",
		BlockSize: 16,
		Router: Router{
			Policy: PolicyAuto,
			KV:     routerconfig.Default(),
		},
		Proxy: Proxy{
			MaxRetries:            2,
			MaxBodyBytes:          32 << 20,
			DialTimeout:           Duration(5 * time.Second),
			ResponseHeaderTimeout: Duration(10 * time.Minute),
			StreamIdleTimeout:     Duration(5 * time.Minute),
			IdleConnTimeout:       Duration(90 * time.Second),
			MaxIdleConnsPerWorker: 128,
		},
		Health: healthconfig.Default(),
		Limits: Limits{
			TokenizeQueue:        64,
			TokenizeQueueTimeout: Duration(10 * time.Second),
			BodyReadTimeout:      Duration(30 * time.Second),
		},
		KVEvents: KVEvents{MaxMsgSize: 64 << 20, Settle: Duration(2 * time.Minute)},
		Sessions: Sessions{
			Headers: []string{
				"X-Session-ID", "X-Dynamo-Session-ID", "X-Correlation-ID",
				"X-Session-Affinity", "x-claude-code-session-id",
			},
			ParentHeaders: []string{
				"X-Parent-Session-ID", "X-Dynamo-Parent-Session-ID", "x-claude-code-parent-agent-id",
			},
			FinalHeaders:   []string{"X-Dynamo-Session-Final"},
			MaxSessions:    16384,
			MaxNodes:       1 << 20,
			AffinityBlocks: 16,
			ParentAware:    true,
			ParentMode:     "parent",
			ParentBlocks:   16,
			GroupTargets:   2,
			SiblingPrefix:  true,
			PendingTTL:     Duration(30 * time.Second),
		},
		ShutdownTimeout: Duration(30 * time.Second),
		LogLevel:        "info",
	}
}
