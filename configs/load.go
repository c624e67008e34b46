package configs

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/confval"
)

// Field describes one config key and its flag and environment names.
type Field struct {
	Key  string // dotted YAML path, e.g. "proxy.max_retries"
	Flag string // flag name without dashes, e.g. "proxy-max-retries"
	Env  string // environment variable, e.g. "KVGATE_PROXY_MAX_RETRIES"
	Help string
	bind func(*Config) flag.Value
}

// Value returns the field of c as a flag.Value (for printing or setting).
func (f Field) Value(c *Config) flag.Value { return f.bind(c) }

func field(key, help string, bind func(*Config) flag.Value) Field {
	name := strings.NewReplacer(".", "-", "_", "-").Replace(key)
	env := "KVGATE_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(key))
	return Field{Key: key, Flag: name, Env: env, Help: help, bind: bind}
}

// Fields lists every configuration key. Each has a flag and a KVGATE_* variable.
func Fields() []Field {
	fs := []Field{
		field("listen", "address the gateway listens on (host:port)", func(c *Config) flag.Value { return stringValue{&c.Listen} }),
		field("admin_listen", "address of the admin listener serving /debug/* (host:port); empty = no debug endpoints", func(c *Config) flag.Value { return stringValue{&c.AdminListen} }),
		field("admin_token", "bearer token the admin listener requires (empty = none; keep the listener on a private address)", func(c *Config) flag.Value { return stringValue{&c.AdminToken} }),
		field("model", "served model name clients use (required)", func(c *Config) flag.Value { return stringValue{&c.Model} }),
		field("tokenizer", "folder holding the model's tokenizer.json and tokenizer_config.json", func(c *Config) flag.Value { return stringValue{&c.Tokenizer} }),
		field("chat_template", "Jinja file overriding the tokenizer folder's chat template (as given to vllm serve --chat-template)", func(c *Config) flag.Value { return stringValue{&c.ChatTemplate} }),
		field("default_chat_template_kwargs", "JSON object merged under every request's chat_template_kwargs (vllm serve --default-chat-template-kwargs)", func(c *Config) flag.Value { return stringValue{&c.DefaultChatTemplateKwargs} }),
		field("block_size", "KV block size in tokens; must equal the workers' --block-size", func(c *Config) flag.Value { return intValue{&c.BlockSize} }),
		field("workers", "worker spec URL[,kv_events=tcp://H:P][,replay=tcp://H:P][,dp_size=N][,topic=T][,api_key=K]; flag repeatable, env separated by ';' or spaces", func(c *Config) flag.Value { return workersValue{&c.Workers} }),
		field("router.policy", "routing policy: auto (kv when any worker has kv_events, else round_robin), kv, kv_no_load, kv_blocks, round_robin, random, least_loaded", func(c *Config) flag.Value { return stringValue{&c.Router.Policy} }),
		field("router.seed", "seed of the random policy (0 = draw one at start)", func(c *Config) flag.Value { return uint64Value{&c.Router.Seed} }),
		field("router.prefill_weight", "kv: weight of the uncached prompt blocks a target would prefill; higher favours cache hits over balance", func(c *Config) flag.Value { return floatValue{&c.Router.PrefillWeight} }),
		field("router.g2_credit", "kv: credit (0..1) of a prompt block in host memory beyond the GPU match", func(c *Config) flag.Value { return floatValue{&c.Router.G2Credit} }),
		field("router.g3_credit", "kv: credit (0..1) of a prompt block on disk beyond the GPU and host match", func(c *Config) flag.Value { return floatValue{&c.Router.G3Credit} }),
		field("router.prefill_load_weight", "kv: weight of prompt tokens (in blocks) in flight before their first token; higher protects TTFT", func(c *Config) flag.Value { return floatValue{&c.Router.PrefillLoadWeight} }),
		field("router.decode_weight", "kv: weight of KV blocks held by active requests; higher balances KV memory and batch size", func(c *Config) flag.Value { return floatValue{&c.Router.DecodeWeight} }),
		field("router.request_weight", "kv: cost in blocks of each active request; raise to balance request counts", func(c *Config) flag.Value { return floatValue{&c.Router.RequestWeight} }),
		field("router.waiting_weight", "kv: cost in blocks of each waiting request the worker reports that kvgate did not send", func(c *Config) flag.Value { return floatValue{&c.Router.WaitingWeight} }),
		field("router.temperature", "kv: 0 takes the lowest cost; > 0 draws from a softmax over normalised costs (spreads load, loses some hits)", func(c *Config) flag.Value { return floatValue{&c.Router.Temperature} }),
		field("router.busy_waiting_requests", "kv: a worker reporting this many waiting requests is avoided while another is not (0 = off)", func(c *Config) flag.Value { return intValue{&c.Router.BusyWaitingRequests} }),
		field("router.busy_kv_usage", "kv: a worker reporting this KV cache usage fraction is avoided while another is not (0 = off)", func(c *Config) flag.Value { return floatValue{&c.Router.BusyKVUsage} }),
		field("router.busy_prefill_tokens", "kv: a target with this many prompt tokens in flight before their first token is avoided (0 = off)", func(c *Config) flag.Value { return intValue{&c.Router.BusyPrefillTokens} }),
		field("router.metrics_interval", "kv: how often each worker's /metrics is scraped to correct the load view", func(c *Config) flag.Value { return &c.Router.MetricsInterval }),
		field("router.metrics_max_age", "kv: scraped readings older than this are ignored", func(c *Config) flag.Value { return &c.Router.MetricsMaxAge }),
		field("router.load_expiry", "load a request still holds after this long is released anyway (must exceed the longest stream)", func(c *Config) flag.Value { return &c.Router.LoadExpiry }),
		field("router.approximate.ttl", "approximate mode: how long blocks routed to a worker are assumed cached after their last use", func(c *Config) flag.Value { return &c.Router.Approximate.TTL }),
		field("router.approximate.block_budget", "approximate mode: blocks assumed cached per worker+rank at most (set near num_gpu_blocks)", func(c *Config) flag.Value { return intValue{&c.Router.Approximate.BlockBudget} }),
		field("router.latency.frontend_ms", "kv: prior per-request constant of the TTFT model, ms (HTTP, tokenization, scheduling)", func(c *Config) flag.Value { return floatValue{&c.Router.Latency.FrontendMs} }),
		field("router.latency.prefill_ms_per_token", "kv: prior prefill time per uncached prompt token, ms", func(c *Config) flag.Value { return floatValue{&c.Router.Latency.PrefillMsPerToken} }),
		field("router.latency.attention_ms_per_pair", "kv: prior time per attention pair (new token x token before it), ms", func(c *Config) flag.Value { return floatValue{&c.Router.Latency.AttentionMsPerPair} }),
		field("router.latency.step_ms", "kv: prior fixed time of one engine step, ms", func(c *Config) flag.Value { return floatValue{&c.Router.Latency.StepMs} }),
		field("router.latency.step_ms_per_kv_token", "kv: prior step time per KV token of the running decodes, ms", func(c *Config) flag.Value { return floatValue{&c.Router.Latency.StepMsPerKVToken} }),
		field("router.latency.max_num_batched_tokens", "kv: the workers' --max-num-batched-tokens (token budget of one step)", func(c *Config) flag.Value { return intValue{&c.Router.Latency.MaxNumBatchedTokens} }),
		field("router.latency.kv_pressure_start", "kv: KV cache usage fraction above which preemption risk is added to the predicted TTFT", func(c *Config) flag.Value { return floatValue{&c.Router.Latency.KVPressureStart} }),
		field("router.latency.kv_pressure_weight", "kv: fraction of queued and own prefill time added at full KV cache (0 = off)", func(c *Config) flag.Value { return floatValue{&c.Router.Latency.KVPressureWeight} }),
		field("router.latency.fleet_weight", "kv: price of a request's prefill time per running decode on the worker it stalls (0 = off)", func(c *Config) flag.Value { return floatValue{&c.Router.Latency.FleetWeight} }),
		field("router.latency.evict_weight", "kv: price of the prefill time of the working-set blocks a prefill evicts from a full KV cache (0 = off)", func(c *Config) flag.Value { return floatValue{&c.Router.Latency.EvictWeight} }),
		field("router.latency.recompute_weight", "kv: price of the prefill time of the prompt blocks a target would compute that the best-cached candidate holds (0 = off)", func(c *Config) flag.Value { return floatValue{&c.Router.Latency.RecomputeWeight} }),
		field("router.latency.evict_stale_after", "kv: working-set blocks last routed longer ago than this are free to evict in the eviction term (0 = all count)", func(c *Config) flag.Value { return &c.Router.Latency.EvictStaleAfter }),
		field("router.latency.overflow_weight", "kv: price of the prefill time of the part of a full target's overflow this prompt's cached prefix shares in, recomputed each time its sessions cycle (0 = off)", func(c *Config) flag.Value { return floatValue{&c.Router.Latency.OverflowWeight} }),
		field("router.latency.queue_loss_weight", "kv: scale of the cached prefix priced as uncached because the prefill queued ahead would evict it: the blocks routed there since the prefix was last used, the prefix and the queue beyond num_gpu_blocks (0 = off)", func(c *Config) flag.Value { return floatValue{&c.Router.Latency.QueueLossWeight} }),
		field("router.latency.learn", "kv: fit each worker's TTFT model online from observed TTFTs (false: prior only)", func(c *Config) flag.Value { return boolValue{&c.Router.Latency.Learn} }),
		field("router.latency.learn_from", "kv: sample sources the fit learns from (comma-separated): gateway_ttft, worker_prefill, worker_step, gateway_itl", func(c *Config) flag.Value { return listValue{&c.Router.Latency.LearnFrom} }),
		field("router.latency.forgetting", "kv: forgetting factor of the online fit, (0, 1]", func(c *Config) flag.Value { return floatValue{&c.Router.Latency.Forgetting} }),
		field("router.latency.ready_samples", "kv: observed requests a worker's fit needs before it replaces the prior", func(c *Config) flag.Value { return intValue{&c.Router.Latency.ReadySamples} }),
		field("router.hold.enabled", "kv: hold a request whose prompt shares a long prefix with a prefill in flight until that prefix is computed on the same worker+rank", func(c *Config) flag.Value { return boolValue{&c.Router.Hold.Enabled} }),
		field("router.hold.min_blocks", "kv: shortest shared prefix, in blocks, worth a hold", func(c *Config) flag.Value { return intValue{&c.Router.Hold.MinBlocks} }),
		field("router.responses.max_pins", "Responses API response ids remembered with the worker that stores them (LRU; 0 = none: previous_response_id follow-ups get 404)", func(c *Config) flag.Value { return intValue{&c.Router.Responses.MaxPins} }),
		field("router.responses.pin_ttl", "a response pin unused this long is forgotten (0 = never by age)", func(c *Config) flag.Value { return &c.Router.Responses.PinTTL }),
		field("router.hold.margin", "kv: a hold lasts at most the first request's predicted remaining TTFT plus this", func(c *Config) flag.Value { return &c.Router.Hold.Margin }),
		field("router.hold.saved_weight", "kv: weight of the GPU prefill time a hold saves, times the share of other workers with requests queued, against waiting (0 = compare TTFTs alone)", func(c *Config) flag.Value { return floatValue{&c.Router.Hold.SavedWeight} }),
		field("proxy.max_retries", "extra workers tried when a worker fails before its first byte", func(c *Config) flag.Value { return intValue{&c.Proxy.MaxRetries} }),
		field("proxy.max_body_bytes", "largest accepted request body (413 above); suffixes KiB, MiB, GiB", func(c *Config) flag.Value { return &c.Proxy.MaxBodyBytes }),
		field("proxy.dial_timeout", "TCP connect timeout to a worker", func(c *Config) flag.Value { return &c.Proxy.DialTimeout }),
		field("proxy.response_header_timeout", "longest wait for a worker's response headers (a non-stream reply arrives only when generation ends); 0 = none", func(c *Config) flag.Value { return &c.Proxy.ResponseHeaderTimeout }),
		field("proxy.first_byte_multiple", "kv: an attempt's first-byte deadline is this times the predicted TTFT (non-stream: plus max_tokens x predicted inter-token time) plus first_byte_floor; 0 = off", func(c *Config) flag.Value { return floatValue{&c.Proxy.FirstByteMultiple} }),
		field("proxy.first_byte_floor", "added to the derived first-byte deadline", func(c *Config) flag.Value { return &c.Proxy.FirstByteFloor }),
		field("proxy.first_byte_eject_after", "eject a worker after this many first-byte deadline misses in a row, even while its /health passes; 0 = never", func(c *Config) flag.Value { return intValue{&c.Proxy.FirstByteEjectAfter} }),
		field("proxy.stream_idle_timeout", "a stream with no bytes from the worker for this long is failed; 0 = none", func(c *Config) flag.Value { return &c.Proxy.StreamIdleTimeout }),
		field("proxy.idle_conn_timeout", "how long an idle pooled connection to a worker is kept", func(c *Config) flag.Value { return &c.Proxy.IdleConnTimeout }),
		field("proxy.max_idle_conns_per_worker", "pooled idle connections kept per worker", func(c *Config) flag.Value { return intValue{&c.Proxy.MaxIdleConnsPerWorker} }),
		field("proxy.forward_priority", "send each request's priority to the workers as vLLM's priority body field (for vllm serve --scheduling-policy priority)", func(c *Config) flag.Value { return boolValue{&c.Proxy.ForwardPriority} }),
		field("proxy.expose_routing_headers", "add X-Kvgate-Worker and X-Kvgate-Cached-Blocks to responses (reveals cache state to clients)", func(c *Config) flag.Value { return boolValue{&c.Proxy.ExposeRoutingHeaders} }),
		field("discovery.kubernetes.service", "Kubernetes discovery: the Service whose EndpointSlices are the workers (empty = off)", func(c *Config) flag.Value { return stringValue{&c.Discovery.Kubernetes.Service} }),
		field("discovery.kubernetes.namespace", "Kubernetes discovery: the Service's namespace (empty = the pod's own)", func(c *Config) flag.Value { return stringValue{&c.Discovery.Kubernetes.Namespace} }),
		field("discovery.kubernetes.port_name", "Kubernetes discovery: the slice port name of vLLM's HTTP API", func(c *Config) flag.Value { return stringValue{&c.Discovery.Kubernetes.PortName} }),
		field("discovery.kubernetes.kv_events_port_name", "Kubernetes discovery: the slice port name of the KV-event publisher (kv-events-<r> per DP rank); empty = approximate mode", func(c *Config) flag.Value { return stringValue{&c.Discovery.Kubernetes.KVEventsPortName} }),
		field("discovery.kubernetes.replay_port_name", "Kubernetes discovery: the slice port name of the KV-event replay socket (kv-replay-<r> per DP rank)", func(c *Config) flag.Value { return stringValue{&c.Discovery.Kubernetes.ReplayPortName} }),
		field("discovery.kubernetes.api_url", "Kubernetes discovery: the API server URL (empty = in-cluster, from KUBERNETES_SERVICE_HOST/PORT)", func(c *Config) flag.Value { return stringValue{&c.Discovery.Kubernetes.APIURL} }),
		field("discovery.kubernetes.token_file", "Kubernetes discovery: bearer token file, re-read as it rotates (empty = no token)", func(c *Config) flag.Value { return stringValue{&c.Discovery.Kubernetes.TokenFile} }),
		field("discovery.kubernetes.ca_file", "Kubernetes discovery: PEM CA bundle of the API server (empty = system roots)", func(c *Config) flag.Value { return stringValue{&c.Discovery.Kubernetes.CAFile} }),
		field("discovery.dns.name", "DNS discovery: name whose A/AAAA records are the workers (empty = off)", func(c *Config) flag.Value { return stringValue{&c.Discovery.DNS.Name} }),
		field("discovery.dns.port", "DNS discovery: the workers' HTTP port", func(c *Config) flag.Value { return intValue{&c.Discovery.DNS.Port} }),
		field("discovery.dns.kv_events_port", "DNS discovery: the workers' KV-event publisher port (0 = approximate mode)", func(c *Config) flag.Value { return intValue{&c.Discovery.DNS.KVEventsPort} }),
		field("discovery.dns.replay_port", "DNS discovery: the workers' KV-event replay port (0 = none)", func(c *Config) flag.Value { return intValue{&c.Discovery.DNS.ReplayPort} }),
		field("discovery.dns.interval", "DNS discovery: time between resolutions", func(c *Config) flag.Value { return &c.Discovery.DNS.Interval }),
		field("health.interval", "time between /health probes of each worker", func(c *Config) flag.Value { return &c.Health.Interval }),
		field("health.timeout", "timeout of one /health probe", func(c *Config) flag.Value { return &c.Health.Timeout }),
		field("health.failure_threshold", "consecutive failures that eject a worker", func(c *Config) flag.Value { return intValue{&c.Health.FailureThreshold} }),
		field("health.success_threshold", "consecutive successful probes that readmit an ejected worker", func(c *Config) flag.Value { return intValue{&c.Health.SuccessThreshold} }),
		field("health.hold_down", "a worker ejected soon after readmission waits this long before it may be readmitted, doubling per flap; 0 = off", func(c *Config) flag.Value { return &c.Health.HoldDown }),
		field("health.hold_down_max", "longest hold-down of a flapping worker", func(c *Config) flag.Value { return &c.Health.HoldDownMax }),
		field("health.hold_down_reset", "a readmitted worker healthy this long has its hold-down halved (forgotten over time)", func(c *Config) flag.Value { return &c.Health.HoldDownReset }),
		field("limits.max_model_len", "longest prompt+output in tokens (vllm serve --max-model-len); longer prompts get 400 at once; 0 = learn from the workers' /v1/models", func(c *Config) flag.Value { return intValue{&c.Limits.MaxModelLen} }),
		field("limits.max_concurrent_tokenizations", "requests tokenized at once at most; 0 = GOMAXPROCS", func(c *Config) flag.Value { return intValue{&c.Limits.MaxConcurrentTokenizations} }),
		field("limits.tokenize_queue", "requests waiting for a tokenization slot at most (503 beyond)", func(c *Config) flag.Value { return intValue{&c.Limits.TokenizeQueue} }),
		field("limits.tokenize_queue_timeout", "longest wait for a tokenization slot (503 after)", func(c *Config) flag.Value { return &c.Limits.TokenizeQueueTimeout }),
		field("limits.body_read_timeout", "longest time to read one request's body after its headers (slow uploads get 408); 0 = none; responses are not limited", func(c *Config) flag.Value { return &c.Limits.BodyReadTimeout }),
		field("limits.max_conns_per_ip", "concurrent client connections per IP address at most; 0 = no cap", func(c *Config) flag.Value { return intValue{&c.Limits.MaxConnsPerIP} }),
		field("sessions.headers", "session id headers, first match wins (comma-separated)", func(c *Config) flag.Value { return listValue{&c.Sessions.Headers} }),
		field("sessions.body_fields", "session id body fields (dotted paths), after the headers, first match wins (comma-separated)", func(c *Config) flag.Value { return listValue{&c.Sessions.BodyFields} }),
		field("sessions.parent_headers", "parent session id headers, first match wins (comma-separated)", func(c *Config) flag.Value { return listValue{&c.Sessions.ParentHeaders} }),
		field("sessions.final_headers", "headers whose value true ends the session after the request (comma-separated)", func(c *Config) flag.Value { return listValue{&c.Sessions.FinalHeaders} }),
		field("sessions.max_sessions", "sessions tracked at most; the least recently used is forgotten", func(c *Config) flag.Value { return intValue{&c.Sessions.MaxSessions} }),
		field("sessions.max_nodes", "blocks the shared session prefix index holds at most", func(c *Config) flag.Value { return intValue{&c.Sessions.MaxNodes} }),
		field("sessions.affinity_blocks", "credit in prompt blocks for a session's previous worker+rank (0 = no affinity)", func(c *Config) flag.Value { return floatValue{&c.Sessions.AffinityBlocks} }),
		field("sessions.parent_aware", "place a new child session (request with a parent header) where its parent's prefix is", func(c *Config) flag.Value { return boolValue{&c.Sessions.ParentAware} }),
		field("sessions.parent_mode", "whose placement a new child follows: parent, lineage_root or sibling_group", func(c *Config) flag.Value { return stringValue{&c.Sessions.ParentMode} }),
		field("sessions.parent_blocks", "credit in prompt blocks of a parent-aware hint (0 = off)", func(c *Config) flag.Value { return floatValue{&c.Sessions.ParentBlocks} }),
		field("sessions.group_targets", "worker+ranks a sibling group keeps preferring once it spilled over", func(c *Config) flag.Value { return intValue{&c.Sessions.GroupTargets} }),
		field("sessions.sibling_prefix", "credit blocks the parent's or a sibling's in-flight request is computing, before KV events announce them", func(c *Config) flag.Value { return boolValue{&c.Sessions.SiblingPrefix} }),
		field("sessions.pending_ttl", "how long such in-flight blocks are credited", func(c *Config) flag.Value { return &c.Sessions.PendingTTL }),
		field("flow_control.enabled", "queue requests at the gateway while every candidate worker is saturated (router.busy_* or flow_control.max_*), dispatching each to the worker that frees first and gains most", func(c *Config) flag.Value { return boolValue{&c.FlowControl.Enabled} }),
		field("flow_control.max_requests", "requests waiting at the gateway per model at most (429 beyond)", func(c *Config) flag.Value { return intValue{&c.FlowControl.MaxRequests} }),
		field("flow_control.max_bytes", "request bytes waiting at the gateway per model at most (429 beyond); suffixes KiB, MiB, GiB", func(c *Config) flag.Value { return &c.FlowControl.MaxBytes }),
		field("flow_control.queue_timeout", "longest wait at the gateway (503 after)", func(c *Config) flag.Value { return &c.FlowControl.QueueTimeout }),
		field("flow_control.max_predicted_wait", "a worker is saturated when the kv time model predicts a request sent now waits longer than this before its prefill starts; 0 = off", func(c *Config) flag.Value { return &c.FlowControl.MaxPredictedWait }),
		field("flow_control.contended_predicted_wait", "max_predicted_wait for a request others contend with (a higher priority active, or its tenant over contended_share of the mean); 0 = off", func(c *Config) flag.Value { return &c.FlowControl.ContendedPredictedWait }),
		field("flow_control.contention_window", "how long a priority or tenant counts as active after its last request", func(c *Config) flag.Value { return &c.FlowControl.ContentionWindow }),
		field("flow_control.contended_share", "a tenant with more than this multiple of the active tenants' mean attained service is contended; 0 = tenants never contend", func(c *Config) flag.Value { return floatValue{&c.FlowControl.ContendedShare} }),
		field("flow_control.protect_cache", "keep a request off a worker holding the recent prompt of a class that outranks it (a higher priority, or a named tenant with less than 1/contended_share of its tenant's service) while the router counts it cached; at most half the workers", func(c *Config) flag.Value { return boolValue{&c.FlowControl.ProtectCache} }),
		field("flow_control.protect_window", "how long a class's prompt on a worker stays protected after the class last routed there", func(c *Config) flag.Value { return &c.FlowControl.ProtectWindow }),
		field("flow_control.max_prefill_tokens", "a worker is saturated with this many uncached prompt tokens in flight before their first token; 0 = off", func(c *Config) flag.Value { return intValue{&c.FlowControl.MaxPrefillTokens} }),
		field("flow_control.max_waiting_requests", "a worker is saturated when its waiting requests (scraped, moved forward by what was sent since) reach this; 0 = off", func(c *Config) flag.Value { return intValue{&c.FlowControl.MaxWaitingRequests} }),
		field("flow_control.retry_after", "Retry-After of the queue's 429 and 503 answers", func(c *Config) flag.Value { return &c.FlowControl.RetryAfter }),
		field("flow_control.fairness_header", "header whose value names the fair-share tenant (within the client key's share); empty = none", func(c *Config) flag.Value { return stringValue{&c.FlowControl.FairnessHeader} }),
		field("flow_control.service_half_life", "half-life of a tenant's attained service", func(c *Config) flag.Value { return &c.FlowControl.ServiceHalfLife }),
		field("flow_control.input_weight", "weight of a prompt token in a tenant's attained service", func(c *Config) flag.Value { return floatValue{&c.FlowControl.InputWeight} }),
		field("flow_control.output_weight", "weight of an output token in a tenant's attained service", func(c *Config) flag.Value { return floatValue{&c.FlowControl.OutputWeight} }),
		field("flow_control.age_weight", "ms of gain credited per ms waited when a freed worker picks among a tenant's waiting requests", func(c *Config) flag.Value { return floatValue{&c.FlowControl.AgeWeight} }),
		field("flow_control.recompute_weight", "the fleet's share of the prefill a request recomputes by leaving its prefix holder", func(c *Config) flag.Value { return floatValue{&c.FlowControl.RecomputeWeight} }),
		field("flow_control.poll_interval", "how often waiting requests are matched against the load besides every load change", func(c *Config) flag.Value { return &c.FlowControl.PollInterval }),
		field("cors.allowed_origins", "origins (or *) allowed cross-origin browser access to the client listener, preflight answered (comma-separated); none = CORS off", func(c *Config) flag.Value { return listValue{&c.CORS.AllowedOrigins} }),
		field("metrics.detailed_public", "also serve the per-worker series (KV-event sequence numbers, block counters, per-worker requests) on the client listener's /metrics; else only on the admin listener's", func(c *Config) flag.Value { return boolValue{&c.Metrics.DetailedPublic} }),
		field("auth.api_keys", "client API keys accepted as Authorization: Bearer (comma-separated); none = no client authentication", func(c *Config) flag.Value { return listValue{&c.Auth.APIKeys} }),
		field("auth.api_keys_file", "file of further client API keys, one per line (# comments)", func(c *Config) flag.Value { return stringValue{&c.Auth.APIKeysFile} }),
		field("auth.cache_isolation", "none | per_key: each client key's requests get a cache salt derived from the key (or its cache_group), so keys never share or probe each other's prefix cache", func(c *Config) flag.Value { return stringValue{&c.Auth.CacheIsolation} }),
		field("auth.cache_salt_secret_file", "file holding the secret (at least 32 bytes) cache groups' salts are derived from; required when auth.keys use cache_group", func(c *Config) flag.Value { return stringValue{&c.Auth.CacheSaltSecretFile} }),
		field("auth.worker_api_key", "key sent as Authorization: Bearer to every worker without its own api_key (vllm serve --api-key)", func(c *Config) flag.Value { return stringValue{&c.Auth.WorkerAPIKey} }),
		field("kv_events.listen", "collector address kvgate binds for workers that publish KV events by connecting out (e.g. tcp://*:5557); workers with a topic and no kv_events are fed through it, attributed by topic", func(c *Config) flag.Value { return stringValue{&c.KVEvents.Listen} }),
		field("kv_events.max_msg_size", "largest message accepted on a KV-event socket (ZMQ_MAXMSGSIZE); suffixes KiB, MiB, GiB", func(c *Config) flag.Value { return &c.KVEvents.MaxMsgSize }),
		field("kv_events.settle", "how long a worker+rank whose event index lost batches stays approximate (unless the engine restarts or clears its cache first)", func(c *Config) flag.Value { return &c.KVEvents.Settle }),
		field("kv_events.allow", "networks (CIDRs or addresses, comma-separated) publishers may connect to the collector from; empty = only the workers' own addresses", func(c *Config) flag.Value { return listValue{&c.KVEvents.Allow} }),
		field("kv_events.check_sender", "drop a collector message whose sender is not an address of the worker its topic names", func(c *Config) flag.Value { return boolValue{&c.KVEvents.CheckSender} }),
		field("kv_events.curve_secret_key_file", "file with the collector's CURVE secret key (Z85); set, only CURVE publishers with a listed key may connect", func(c *Config) flag.Value { return stringValue{&c.KVEvents.CurveSecretKeyFile} }),
		field("kv_events.curve_client_keys", "CURVE public keys (Z85, comma-separated) of the publishers the collector accepts", func(c *Config) flag.Value { return listValue{&c.KVEvents.CurveClientKeys} }),
		field("anthropic.count_tokens", "POST /v1/messages/count_tokens: local (count with the gateway's tokenizer) or forward (ask a worker)", func(c *Config) flag.Value { return stringValue{&c.Anthropic.CountTokens} }),
		field("anthropic.inline_system", "role system messages inside an Anthropic Messages body: merge (into the leading system message, vLLM without --chat-template) or preserve (in place); must match the workers", func(c *Config) flag.Value { return stringValue{&c.Anthropic.InlineSystem} }),
		field("cluster.nats_url", "NATS server(s) the replicas share (comma-separated nats://host:port); empty with no embedded server = one replica, no NATS", func(c *Config) flag.Value { return stringValue{&c.Cluster.NATSURL} }),
		field("cluster.embedded_nats.listen", "run a NATS server (JetStream on) inside this replica on host:port; empty = none", func(c *Config) flag.Value { return stringValue{&c.Cluster.EmbeddedNATS.Listen} }),
		field("cluster.embedded_nats.cluster_listen", "route address (host:port) of the embedded server, for a NATS cluster of embedded servers", func(c *Config) flag.Value { return stringValue{&c.Cluster.EmbeddedNATS.ClusterListen} }),
		field("cluster.embedded_nats.routes", "the embedded servers' route addresses (comma-separated host:port, all seeds)", func(c *Config) flag.Value { return listValue{&c.Cluster.EmbeddedNATS.Routes} }),
		field("cluster.embedded_nats.name", "the embedded server's name, unique in its NATS cluster (empty = the replica id)", func(c *Config) flag.Value { return stringValue{&c.Cluster.EmbeddedNATS.Name} }),
		field("cluster.embedded_nats.store_dir", "JetStream storage folder of the embedded server (empty = a fresh temporary folder)", func(c *Config) flag.Value { return stringValue{&c.Cluster.EmbeddedNATS.StoreDir} }),
		field("cluster.embedded_nats.max_memory", "JetStream memory cap of the embedded server; suffixes KiB, MiB, GiB", func(c *Config) flag.Value { return &c.Cluster.EmbeddedNATS.MaxMemory }),
		field("cluster.replica_id", "this replica's name to its peers (letters, digits, - and _; empty = host name + random)", func(c *Config) flag.Value { return stringValue{&c.Cluster.ReplicaID} }),
		field("cluster.fleet", "namespace of the NATS subjects and bucket, so several fleets can share one NATS", func(c *Config) flag.Value { return stringValue{&c.Cluster.Fleet} }),
		field("cluster.kv_replicas", "JetStream replicas of the session bucket (1, or 3 on a 3-node NATS cluster)", func(c *Config) flag.Value { return intValue{&c.Cluster.KVReplicas} }),
		field("cluster.session_ttl", "a shared session binding unused this long expires", func(c *Config) flag.Value { return &c.Cluster.SessionTTL }),
		field("cluster.kv_deadline", "longest wait for the session bucket on a request's path (then local state)", func(c *Config) flag.Value { return &c.Cluster.KVDeadline }),
		field("cluster.load_interval", "how often each replica publishes its absolute in-flight load", func(c *Config) flag.Value { return &c.Cluster.LoadInterval }),
		field("cluster.peer_timeout", "a peer silent this long has its load dropped", func(c *Config) flag.Value { return &c.Cluster.PeerTimeout }),
		field("cluster.snapshot_timeout", "longest wait of a starting replica for a peer's index snapshot of a worker", func(c *Config) flag.Value { return &c.Cluster.SnapshotTimeout }),
		field("cluster.fleet_key_file", "file with the fleet's shared secret (>= 32 bytes); every replica message is signed with it and unsigned ones dropped (empty = none, with a warning)", func(c *Config) flag.Value { return stringValue{&c.Cluster.FleetKeyFile} }),
		field("cluster.message_window", "a signed replica message further than this from the receiver's clock is a replay and dropped", func(c *Config) flag.Value { return &c.Cluster.MessageWindow }),
		field("cluster.nats_user", "NATS user this replica signs in as (with nats_password)", func(c *Config) flag.Value { return stringValue{&c.Cluster.NATSUser} }),
		field("cluster.nats_password", "password of cluster.nats_user", func(c *Config) flag.Value { return stringValue{&c.Cluster.NATSPassword} }),
		field("cluster.nats_token", "NATS token this replica signs in with", func(c *Config) flag.Value { return stringValue{&c.Cluster.NATSToken} }),
		field("cluster.nats_nkey_file", "file with the NKey seed this replica signs in to NATS with", func(c *Config) flag.Value { return stringValue{&c.Cluster.NATSNKeyFile} }),
		field("cluster.nats_creds", "NATS credentials file (JWT + NKey seed) this replica signs in with", func(c *Config) flag.Value { return stringValue{&c.Cluster.NATSCreds} }),
		field("cluster.tls.ca_file", "CA of the NATS servers' certificates (TLS to NATS)", func(c *Config) flag.Value { return stringValue{&c.Cluster.TLS.CAFile} }),
		field("cluster.tls.cert_file", "this replica's client certificate for NATS (with key_file)", func(c *Config) flag.Value { return stringValue{&c.Cluster.TLS.CertFile} }),
		field("cluster.tls.key_file", "key of cluster.tls.cert_file", func(c *Config) flag.Value { return stringValue{&c.Cluster.TLS.KeyFile} }),
		field("cluster.embedded_nats.token", "token clients of the embedded server must present (full access; prefer embedded_nats.users in the file)", func(c *Config) flag.Value { return stringValue{&c.Cluster.EmbeddedNATS.Token} }),
		field("cluster.embedded_nats.tls.ca_file", "CA the embedded server requires client and route certificates from", func(c *Config) flag.Value { return stringValue{&c.Cluster.EmbeddedNATS.TLS.CAFile} }),
		field("cluster.embedded_nats.tls.cert_file", "certificate of the embedded server (clients and routes over TLS)", func(c *Config) flag.Value { return stringValue{&c.Cluster.EmbeddedNATS.TLS.CertFile} }),
		field("cluster.embedded_nats.tls.key_file", "key of cluster.embedded_nats.tls.cert_file", func(c *Config) flag.Value { return stringValue{&c.Cluster.EmbeddedNATS.TLS.KeyFile} }),
		field("shutdown_drain_delay", "on SIGTERM, how long new requests are still accepted after /ready turned 503 (so endpoints update) before the listener closes", func(c *Config) flag.Value { return &c.ShutdownDrainDelay }),
		field("shutdown_timeout", "on SIGTERM, once the listener closed, how long running requests may finish before they are cut (a cut stream ends with an error event)", func(c *Config) flag.Value { return &c.ShutdownTimeout }),
		field("log_level", "debug, info, warn or error", func(c *Config) flag.Value { return stringValue{&c.LogLevel} }),
		field("log_format", "text or json", func(c *Config) flag.Value { return stringValue{&c.LogFormat} }),
		field("access_log", "one info log line per client request (method, path, status, latency, TTFT, worker, cached blocks, hashed session, model; never prompt text)", func(c *Config) flag.Value { return boolValue{&c.AccessLog} }),
	}
	for i := range fs {
		if fs[i].Key == "workers" {
			fs[i].Flag = "worker" // repeatable: one --worker per worker reads better than --workers
		}
	}
	return fs
}

// ParseYAML decodes a YAML document over c (keys absent from the document keep c's values).
// Unknown keys are errors, so a misspelt key is not silently ignored.
func ParseYAML(data []byte, c *Config) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// LoadFile reads defaults plus the YAML file at path, without env or flags, and validates.
func LoadFile(path string) (Config, error) {
	c := Default()
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	if err := ParseYAML(data, &c); err != nil {
		return c, fmt.Errorf("config %s: %w", path, err)
	}
	c.normalize()
	return c, c.Validate()
}

type setting struct{ name, value string }

type recorder struct {
	name string
	out  *[]setting
}

func (r recorder) String() string     { return "" }
func (r recorder) Set(s string) error { *r.out = append(*r.out, setting{r.name, s}); return nil }

// boolRecorder records a boolean flag, which may be given without a value (--flag = true).
type boolRecorder struct{ recorder }

func (boolRecorder) IsBoolFlag() bool { return true }

// Load builds the configuration of `kvgate serve` from args: defaults, then the YAML file named
// by --config (or KVGATE_CONFIG), then KVGATE_* variables from getenv, then flags; later wins.
// A repeated --worker flag replaces the file's worker list. The result is validated. With
// -h it prints usage to usage and returns flag.ErrHelp.
func Load(args []string, getenv func(string) string, usage io.Writer) (Config, error) {
	fields := Fields()
	fset := flag.NewFlagSet("kvgate serve", flag.ContinueOnError)
	fset.SetOutput(usage)
	var path string
	fset.StringVar(&path, "config", getenv("KVGATE_CONFIG"), "YAML config file (env KVGATE_CONFIG)")
	var got []setting
	for _, f := range fields {
		var rec flag.Value = recorder{f.Flag, &got}
		if _, isBool := f.Value(&Config{}).(boolValue); isBool {
			rec = boolRecorder{recorder{f.Flag, &got}}
		}
		fset.Var(rec, f.Flag, f.Help)
	}
	fset.Usage = func() { printUsage(usage, fields) }
	if err := fset.Parse(args); err != nil {
		return Config{}, err
	}
	if fset.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q (flags start with --)", fset.Arg(0))
	}

	c := Default()
	var errs []error
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return c, fmt.Errorf("config: %w", err)
		}
		if err := ParseYAML(data, &c); err != nil {
			var typeErr *yaml.TypeError
			if !errors.As(err, &typeErr) {
				return c, fmt.Errorf("config %s: %w", path, err) // not YAML: nothing else to check
			}
			// Unknown keys and values of the wrong type: the rest of the file was read, so
			// every other problem is listed with them.
			for _, msg := range typeErr.Errors {
				errs = append(errs, fmt.Errorf("config %s: %s", path, msg))
			}
		}
	}
	for _, f := range fields {
		if v, ok := lookup(getenv, f.Env); ok {
			if err := f.Value(&c).Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s (%s): %w", f.Env, f.Key, err))
			}
		}
	}
	byFlag := map[string]Field{}
	for _, f := range fields {
		byFlag[f.Flag] = f
	}
	var workerSpecs []string
	for _, s := range got {
		if s.name == "worker" {
			workerSpecs = append(workerSpecs, s.value)
			continue
		}
		if err := byFlag[s.name].Value(&c).Set(s.value); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", s.name, err))
		}
	}
	if len(workerSpecs) > 0 {
		c.Workers = nil
		for _, spec := range workerSpecs {
			w, err := ParseWorkerSpec(spec)
			if err != nil {
				errs = append(errs, fmt.Errorf("--worker: %w", err))
				continue
			}
			c.Workers = append(c.Workers, w)
		}
	}
	// A value that did not parse kept its previous one; the rest is validated too, so one run
	// lists every problem.
	c.normalize()
	return c, errors.Join(append(errs, confval.Split(c.Validate())...)...)
}

// lookup treats a set-but-empty variable as unset, so `KVGATE_X= kvgate serve` changes nothing.
func lookup(getenv func(string) string, name string) (string, bool) {
	v := getenv(name)
	return v, v != ""
}

func printUsage(w io.Writer, fields []Field) {
	def := Default()
	fmt.Fprintf(w, "usage: kvgate serve [--config FILE] [flags]\n\nFlags override KVGATE_* variables, which override the file.\n\n")
	fmt.Fprintf(w, "  --config FILE\n      YAML config file (env KVGATE_CONFIG)\n")
	fmt.Fprintf(w, "  --check-config\n      check the file, env and flags and load the tokenizer without listening or contacting a worker;\n      print the effective config (secrets masked) and exit 0, or every problem and exit 1\n")
	for _, f := range fields {
		d := f.Value(&def).String()
		if d == "" || d == "0" {
			d = "none"
		}
		fmt.Fprintf(w, "  --%s\n      %s (env %s, default %s)\n", f.Flag, f.Help, f.Env, d)
	}
}
