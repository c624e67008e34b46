// Package serverconfig holds the server's sections of the kvgate YAML, proxy (how requests are
// forwarded to workers) and limits (what the gateway admits), with their defaults and
// validation. It is a leaf, so configs composes it into the schema without importing the server.
package serverconfig

import (
	"time"

	"github.com/kvgate/kvgate/confval"
)

// Proxy bounds how requests are forwarded to workers. Every field is used as given: zero is a
// value, not "use the default"; start from DefaultProxy.
type Proxy struct {
	// MaxRetries is how many other workers a request may be retried on when a worker fails
	// before its first byte (0 = no retry).
	MaxRetries int `yaml:"max_retries"`
	// MaxBodyBytes bounds a request body (413 beyond it).
	MaxBodyBytes confval.ByteSize `yaml:"max_body_bytes"`
	// DialTimeout bounds connecting to a worker.
	DialTimeout confval.Duration `yaml:"dial_timeout"`
	// ResponseHeaderTimeout bounds waiting for a worker's response headers; 0 = none.
	// A non-stream reply arrives only when generation ends, so this also bounds non-stream
	// generation.
	ResponseHeaderTimeout confval.Duration `yaml:"response_header_timeout"`
	// StreamIdleTimeout bounds the silence between two body chunks of a worker's response; 0 = none.
	// For a stream the silence counts from sending the request, so a worker stalled before its
	// headers is retried elsewhere; there is no total timeout on streams.
	StreamIdleTimeout confval.Duration `yaml:"stream_idle_timeout"`
	// FirstByteMultiple and FirstByteFloor derive an attempt's first-byte deadline from the
	// router's prediction (kv policy): multiple × predicted TTFT + floor for a stream, multiple ×
	// (predicted TTFT + max_tokens × predicted inter-token time) + floor otherwise. A worker that
	// misses it is retried elsewhere. Multiple 0 = off (only the timeouts above bound the wait).
	FirstByteMultiple float64          `yaml:"first_byte_multiple"`
	FirstByteFloor    confval.Duration `yaml:"first_byte_floor"`
	// FirstByteEjectAfter ejects a worker after this many first-byte deadline misses in a row
	// (no response in between), even while its /health passes; 0 = never.
	// Health probes readmit it as after any ejection.
	FirstByteEjectAfter int `yaml:"first_byte_eject_after"`
	// IdleConnTimeout is how long an idle pooled connection to a worker is kept; 0 = no limit.
	IdleConnTimeout confval.Duration `yaml:"idle_conn_timeout"`
	// MaxIdleConnsPerWorker bounds the idle pooled connections to one worker.
	// It is the pool size per worker.
	MaxIdleConnsPerWorker int `yaml:"max_idle_conns_per_worker"`
	// ExposeRoutingHeaders adds X-Kvgate-Worker and X-Kvgate-Cached-Blocks to responses. Off by
	// default: the cached-block count lets a client test guesses of other users' prompts.
	ExposeRoutingHeaders bool `yaml:"expose_routing_headers"`
	// ForwardPriority writes each request's priority (the one flow control queues it by: the
	// client key's auth.keys[].priority, lowered by x-kvgate-priority or
	// x-gateway-inference-objective) into the body sent to the worker as vLLM's priority
	// field, negated (kvgate's larger is more urgent, vLLM's smaller is earlier), on chat
	// completions, completions, Responses and Messages. Turn it on when the workers run
	// vllm serve --scheduling-policy priority; it works with flow_control on or off. A client's
	// own priority field is kept only when it asks to be handled later. Default false (the body
	// is forwarded as sent).
	ForwardPriority bool `yaml:"forward_priority"`
}

// DefaultProxy returns the proxy section's defaults (configs/kvgate.yaml documents the same).
func DefaultProxy() Proxy {
	return Proxy{
		MaxRetries:            2,
		MaxBodyBytes:          32 << 20,
		DialTimeout:           confval.Duration(5 * time.Second),
		ResponseHeaderTimeout: confval.Duration(10 * time.Minute),
		StreamIdleTimeout:     confval.Duration(5 * time.Minute),
		FirstByteMultiple:     4,
		FirstByteFloor:        confval.Duration(5 * time.Second),
		FirstByteEjectAfter:   3,
		IdleConnTimeout:       confval.Duration(90 * time.Second),
		MaxIdleConnsPerWorker: 128,
	}
}

// Validate returns every invalid key, named relative to the section ("max_retries"); configs
// prefixes them with "proxy.".
func (c Proxy) Validate() error {
	var p confval.Problems
	if c.MaxRetries < 0 || c.MaxRetries > 16 {
		p.Addf("max_retries", "must be between 0 and 16, got %d", c.MaxRetries)
	}
	if c.MaxBodyBytes <= 0 {
		p.Addf("max_body_bytes", "must be positive, got %d", c.MaxBodyBytes)
	}
	if c.DialTimeout <= 0 {
		p.Addf("dial_timeout", "must be positive, got %s", c.DialTimeout)
	}
	if c.ResponseHeaderTimeout < 0 {
		p.Addf("response_header_timeout", "must not be negative, got %s", c.ResponseHeaderTimeout)
	}
	if c.FirstByteMultiple < 0 {
		p.Addf("first_byte_multiple", "must not be negative, got %v", c.FirstByteMultiple)
	}
	if c.FirstByteFloor < 0 {
		p.Addf("first_byte_floor", "must not be negative, got %s", c.FirstByteFloor)
	}
	if c.FirstByteEjectAfter < 0 {
		p.Addf("first_byte_eject_after", "must not be negative, got %d", c.FirstByteEjectAfter)
	}
	if c.StreamIdleTimeout < 0 {
		p.Addf("stream_idle_timeout", "must not be negative, got %s", c.StreamIdleTimeout)
	}
	if c.IdleConnTimeout < 0 {
		p.Addf("idle_conn_timeout", "must not be negative, got %s", c.IdleConnTimeout)
	}
	if c.MaxIdleConnsPerWorker < 1 {
		p.Addf("max_idle_conns_per_worker", "must be at least 1, got %d", c.MaxIdleConnsPerWorker)
	}
	return p.Err()
}

// Limits bounds what the gateway admits. Every field is used as given: zero is a value (for
// several keys "learn it" or "no cap", as documented on each), not "use the default"; start
// from DefaultLimits.
type Limits struct {
	// MaxModelLen is the longest prompt+output in tokens (vllm serve --max-model-len); prompts
	// of at least this many tokens get vLLM's 400 before anything is sent. 0 learns it from the
	// workers' /v1/models max_model_len.
	// Tokenizing stops as soon as the length is certain; with 0 and no worker reporting one,
	// nothing is checked.
	MaxModelLen int `yaml:"max_model_len"`
	// MaxConcurrentTokenizations caps requests being tokenized at once; 0 = GOMAXPROCS.
	// A request takes one slot per started 4 MiB of body (at most all), so a body of tens of MiB
	// is handled alone; after a body of 16 MiB or more the memory it used is returned to the OS at
	// once.
	MaxConcurrentTokenizations int `yaml:"max_concurrent_tokenizations"`
	// TokenizeQueue caps requests waiting for a tokenization slot; beyond it they get 503.
	// The 503 carries Retry-After.
	TokenizeQueue int `yaml:"tokenize_queue"`
	// TokenizeQueueTimeout is the longest wait for a tokenization slot (then 503).
	// The 503 carries Retry-After.
	TokenizeQueueTimeout confval.Duration `yaml:"tokenize_queue_timeout"`
	// BodyReadTimeout bounds reading one request's body after its headers; 0 = none. Responses
	// (streams) are never timed out by it.
	// Headers have 30s; a slow upload is cut with 408 and its connection closed.
	BodyReadTimeout confval.Duration `yaml:"body_read_timeout"`
	// MaxConnsPerIP caps concurrent client connections from one IP address; 0 = no cap.
	// More are closed at accept. Off by default because behind a load balancer all clients share
	// one address.
	MaxConnsPerIP int `yaml:"max_conns_per_ip"`
}

// DefaultLimits returns the limits section's defaults (configs/kvgate.yaml documents the same).
func DefaultLimits() Limits {
	return Limits{
		TokenizeQueue:        64,
		TokenizeQueueTimeout: confval.Duration(10 * time.Second),
		BodyReadTimeout:      confval.Duration(30 * time.Second),
	}
}

// Validate returns every invalid key, named relative to the section ("tokenize_queue");
// configs prefixes them with "limits.".
func (c Limits) Validate() error {
	var p confval.Problems
	if c.MaxModelLen < 0 {
		p.Addf("max_model_len", "must not be negative, got %d", c.MaxModelLen)
	}
	if c.MaxConcurrentTokenizations < 0 {
		p.Addf("max_concurrent_tokenizations", "must not be negative, got %d", c.MaxConcurrentTokenizations)
	}
	if c.TokenizeQueue < 0 {
		p.Addf("tokenize_queue", "must not be negative, got %d", c.TokenizeQueue)
	}
	if c.TokenizeQueueTimeout < 0 {
		p.Addf("tokenize_queue_timeout", "must not be negative, got %s", c.TokenizeQueueTimeout)
	}
	if c.BodyReadTimeout < 0 {
		p.Addf("body_read_timeout", "must not be negative, got %s", c.BodyReadTimeout)
	}
	if c.MaxConnsPerIP < 0 {
		p.Addf("max_conns_per_ip", "must not be negative, got %d", c.MaxConnsPerIP)
	}
	return p.Err()
}

// CORS configures cross-origin access to the client listener (browser clients).
type CORS struct {
	// AllowedOrigins are the origins (scheme://host[:port], or "*" for any) whose browser
	// requests get CORS headers and whose preflight OPTIONS is answered; empty (the default)
	// turns CORS off: no CORS headers, OPTIONS is an unmatched route.
	AllowedOrigins []string `yaml:"allowed_origins"`
}

// Metrics configures what GET /metrics shows where.
type Metrics struct {
	// DetailedPublic also serves the detailed series (every series with a worker label: the
	// per-worker KV-event sequence numbers and block counters, requests and health per worker)
	// on the client listener's /metrics; false (the default) serves them only on the admin
	// listener's /metrics, since they reveal when which worker cached how much of a prompt.
	DetailedPublic bool `yaml:"detailed_public"`
}
