package server

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/keylimits"
)

// defaultOutputEstimate is the output a request that names no max_tokens is charged in advance
// against tokens_per_minute. vLLM's own default is the rest of the context, which would charge
// most requests many times what they use and hold them until the bucket is full; the charge is
// corrected by the worker's usage when the response ends, so the estimate only decides how
// early such a request is admitted. It is bounded by the remaining context when known.
const defaultOutputEstimate = 1024

// newKeyLimiter holds the limits of the client keys that have any (none: nil).
func newKeyLimiter(entries []configs.ClientKey, peerTimeout time.Duration) *keylimits.Limiter {
	keys := map[string]keylimits.Limits{}
	for _, e := range entries {
		l := keylimits.Limits{RequestsPerMinute: e.RequestsPerMinute, TokensPerMinute: e.TokensPerMinute,
			MaxConcurrent: e.MaxConcurrent, Burst: e.Burst}
		if l.Limited() {
			keys[e.Name] = l
		}
	}
	if len(keys) == 0 {
		return nil
	}
	return keylimits.New(keys, peerTimeout, time.Now())
}

// KeyLimiter is the per-key limiter (nil when no client key has limits): cluster.LimitsSync
// shares its reports with the peer replicas.
func (s *Server) KeyLimiter() *keylimits.Limiter { return s.limits }

// ctxLimitTicket is the gin context key of an admitted request's keylimits.Ticket.
const ctxLimitTicket = "kvgate.limit_ticket"

// tokenEstimate is what a request is charged against tokens_per_minute when admitted: its
// prompt (the gateway's token count, else a quarter of its body's bytes) plus its max output.
func tokenEstimate(in *apireq.Request, promptTokens int) int {
	prompt := promptTokens
	if prompt <= 0 {
		prompt = len(in.Body) / 4
	}
	out := in.MaxTokens
	if in.Endpoint == apireq.MessagesCountTokens {
		out = 0 // counting generates nothing
	} else if out <= 0 {
		out = defaultOutputEstimate
		if in.MaxModelLen > prompt {
			out = min(out, in.MaxModelLen-prompt)
		}
	}
	return prompt + out
}

// admitLimits checks the request's key against its limits before the request is routed or
// queued: a refused request is answered 429 here and never occupies a queue slot or a worker.
// An admitted one holds its in-flight slot until release (call it when the response ends) and
// its token charge until the usage corrects it (correctLimits). Headers: limitHeaders.
func (s *Server) admitLimits(c *gin.Context, tn *tenant, tokens int) (release func(), e *apiError) {
	if tn == nil || !s.limits.Limited(tn.name) {
		return func() {}, nil
	}
	d := s.limits.Admit(tn.name, tokens, time.Now())
	setLimitHeaders(c.Writer.Header(), d.Status)
	if !d.Allowed {
		s.m.limited.WithLabelValues(string(d.Reason)).Inc()
		return nil, limitError(tn.name, d)
	}
	c.Set(ctxLimitTicket, d.Ticket)
	return func() { s.limits.Release(d.Ticket) }, nil
}

// precheckLimits refuses, before the body is parsed and tokenized, a request its key's limits
// would refuse whatever its size (max_concurrent full, request bucket empty): a key flooding
// past its limits then costs the gateway a body read, not a tokenization. Admission itself is
// admitLimits, with the real token count.
func (s *Server) precheckLimits(c *gin.Context, tn *tenant, bodyLen int) *apiError {
	if tn == nil || !s.limits.Limited(tn.name) {
		return nil
	}
	d := s.limits.Precheck(tn.name, bodyLen/4, time.Now())
	if d.Allowed {
		return nil
	}
	setLimitHeaders(c.Writer.Header(), d.Status)
	s.m.limited.WithLabelValues(string(d.Reason)).Inc()
	return limitError(tn.name, d)
}

// correctLimits replaces the admitted request's token charge with the worker's usage, when the
// response reported one (a stream without stream_options.include_usage keeps the estimate).
func (s *Server) correctLimits(c *gin.Context, uc *usageCapture) {
	v, ok := c.Get(ctxLimitTicket)
	if !ok {
		return
	}
	if used, ok := uc.totalTokens(); ok {
		s.limits.Correct(v.(keylimits.Ticket), used, time.Now())
	}
}

// refundLimits returns an admitted request's whole token charge when it never reached a worker
// (the gateway queue answered it 429 or 503, or its client left while it waited): it used
// nothing. Its in-flight slot returns with admitLimits' release, as on every outcome; the
// request itself stays counted against requests_per_minute (each attempt of a client retrying
// after Retry-After is a request).
func (s *Server) refundLimits(c *gin.Context) {
	v, ok := c.Get(ctxLimitTicket)
	if !ok {
		return
	}
	s.limits.Correct(v.(keylimits.Ticket), 0, time.Now())
	c.Set(ctxLimitTicket, keylimits.Ticket{}) // refunded once: a zero ticket corrects nothing
}

// limitHeaders puts a limited key's x-ratelimit headers on every response (refreshed by
// admitLimits on the routes it guards).
func (s *Server) limitHeaders(c *gin.Context) {
	if tn := tenantOf(c); tn != nil {
		if st, ok := s.limits.Status(tn.name, time.Now()); ok {
			setLimitHeaders(c.Writer.Header(), st)
		}
	}
	c.Next()
}

// setLimitHeaders writes OpenAI's rate-limit headers
// (https://platform.openai.com/docs/guides/rate-limits, "Rate limits in headers"):
// x-ratelimit-limit-requests (per minute), -remaining-requests (what may be sent now) and
// -reset-requests (until the bucket is full again, as "1s", "6m0s", "20ms"), and the same trio
// for -tokens; a bucket the key does not have is left out.
func setLimitHeaders(h http.Header, st keylimits.Status) {
	set := func(kind string, b *keylimits.BucketStatus) {
		if b == nil {
			return
		}
		h.Set("X-Ratelimit-Limit-"+kind, strconv.Itoa(b.Limit))
		h.Set("X-Ratelimit-Remaining-"+kind, strconv.Itoa(b.Remaining))
		h.Set("X-Ratelimit-Reset-"+kind, resetString(b.Reset))
	}
	set("Requests", st.Requests)
	set("Tokens", st.Tokens)
}

// resetString formats a reset time as OpenAI does: milliseconds below a second ("20ms"), Go's
// duration form above ("1.5s", "6m0s").
func resetString(d time.Duration) string {
	d = d.Round(time.Millisecond)
	if d < time.Second {
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	}
	return d.String()
}

// limitError is the 429 of a refused request: OpenAI's rate_limit_exceeded (type "requests" or
// "tokens"), Anthropic's rate_limit_error on /v1/messages (writeError shapes it by route), with
// Retry-After in whole seconds, at least 1.
func limitError(name string, d keylimits.Decision) *apiError {
	e := &apiError{Status: http.StatusTooManyRequests, code: "rate_limit_exceeded",
		RetryAfter: max(1, int(math.Ceil(d.RetryAfter.Seconds())))}
	switch d.Reason {
	case keylimits.ReasonRequests:
		e.errType = "requests"
		e.Message = fmt.Sprintf("Rate limit reached for key %s on requests per min (RPM): Limit %d. Please try again in %s.", name, d.Status.Requests.Limit, resetString(d.RetryAfter))
	case keylimits.ReasonTokens:
		e.errType = "tokens"
		e.Message = fmt.Sprintf("Rate limit reached for key %s on tokens per min (TPM): Limit %d, Remaining %d. Please try again in %s.", name, d.Status.Tokens.Limit, d.Status.Tokens.Remaining, resetString(d.RetryAfter))
	default:
		e.errType = "requests"
		e.Message = fmt.Sprintf("Too many concurrent requests for key %s (max_concurrent). Please retry when one of them has finished.", name)
	}
	return e
}

// totalTokens is the prompt plus output tokens the worker reported: total_tokens (OpenAI's
// chat, completions and Responses usage), else the prompt (see usage) plus completion_tokens
// or output_tokens (Anthropic's usage).
func (u *usageCapture) totalTokens() (int, bool) {
	prompt, ok := u.usage()
	if !ok {
		return 0, false
	}
	doc := u.buf
	if u.last != nil {
		doc = sseData(u.last)
	}
	type counts struct {
		Total      *int `json:"total_tokens"`
		Completion *int `json:"completion_tokens"`
		Output     *int `json:"output_tokens"`
	}
	var body struct {
		Usage   *counts `json:"usage"`
		Message *struct {
			Usage *counts `json:"usage"`
		} `json:"message"`
		Response *struct {
			Usage *counts `json:"usage"`
		} `json:"response"`
	}
	if json.Unmarshal(doc, &body) != nil {
		return 0, false
	}
	c := body.Usage
	if c == nil && body.Message != nil {
		c = body.Message.Usage
	}
	if c == nil && body.Response != nil {
		c = body.Response.Usage
	}
	switch {
	case c == nil:
		return 0, false
	case c.Total != nil:
		return *c.Total, true
	case c.Completion != nil:
		return prompt.PromptTokens + *c.Completion, true
	case c.Output != nil:
		return prompt.PromptTokens + *c.Output, true
	}
	return 0, false
}
