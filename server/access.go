package server

import (
	"context"
	"log/slog"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvgate/kvgate/router"
)

// accessInfo is what the handlers learn about a request for its access log line. The
// handler goroutine fills it and the access middleware reads it after the handler returned.
type accessInfo struct {
	model, session, worker string
	cachedBlocks           int
	promptTokens           int
	routed                 bool // worker and cachedBlocks are set
	ttft                   time.Duration
	hasTTFT                bool
	flow                   string        // flow control's choice: direct, or the queue's binding (best, aged, unpriced)
	flowWait               time.Duration // waited at the gateway
	flowProtected          string        // the cache-protection rule that narrowed its placement
	flowShed               string        // why the gateway's queue answered it without a worker
}

type accessKey struct{}

// accessFrom returns the request's access record (nil: the access log is off).
func accessFrom(ctx context.Context) *accessInfo {
	a, _ := ctx.Value(accessKey{}).(*accessInfo)
	return a
}

// noteRequest records the parsed request's model, hashed session and prompt size.
func (a *accessInfo) noteRequest(model, session string, promptTokens int) {
	if a != nil {
		a.model, a.session, a.promptTokens = model, session, promptTokens
	}
}

// noteRoute records the attempt's worker and its cached prefix (the last attempt wins).
func (a *accessInfo) noteRoute(worker string, d router.Decision) {
	if a != nil {
		a.worker, a.cachedBlocks, a.routed = worker, router.CachedBlocks(d), true
	}
}

// noteFlow records how flow control let the request through (nil ticket: it did not).
func (a *accessInfo) noteFlow(t *flowTicket) {
	if a != nil && t != nil {
		a.flow, a.flowWait, a.flowProtected = t.choice, t.waited, t.protected
	}
}

// noteShed records why the gateway's queue answered the request itself (server/flow.go shed
// reasons).
func (a *accessInfo) noteShed(reason string) {
	if a != nil {
		a.flowShed = reason
	}
}

// noteFirstToken records the time to the first token: the first body byte, or an Anthropic
// stream's first content_block_delta.
func (a *accessInfo) noteFirstToken(d time.Duration) {
	if a != nil && !a.hasTTFT {
		a.ttft, a.hasTTFT = d, true
	}
}

// accessLog writes one info line per client request, message "access" (access_log: true):
// method, path, status, latency, and, once known, the model, the hashed session, the prompt's
// tokens, the worker, its cached blocks and the time to the first token. Never a prompt, a
// key or a header value. /health and /metrics (probed every few seconds) are not logged; the
// probes are registered before this middleware and are not either.
func (s *Server) accessLog(c *gin.Context) {
	path := c.Request.URL.Path
	if path == "/health" || path == "/metrics" || accessFrom(c.Request.Context()) != nil {
		// A HEAD handled again as GET (headAsGet) is logged once, by its first pass.
		c.Next()
		return
	}
	info := &accessInfo{}
	c.Request = c.Request.WithContext(context.WithValue(c.Request.Context(), accessKey{}, info))
	start := time.Now()
	method := c.Request.Method
	defer func() {
		attrs := make([]slog.Attr, 0, 14)
		attrs = append(attrs, slog.String("method", method), slog.String("path", path),
			slog.Int("status", c.Writer.Status()), slog.Float64("latency_ms", ms(time.Since(start))))
		if info.hasTTFT {
			attrs = append(attrs, slog.Float64("ttft_ms", ms(info.ttft)))
		}
		if info.routed {
			attrs = append(attrs, slog.String("worker", info.worker), slog.Int("cached_blocks", info.cachedBlocks))
		}
		if info.flow != "" {
			attrs = append(attrs, slog.String("flow", info.flow), slog.Float64("flow_wait_ms", ms(info.flowWait)))
			if info.flowProtected != "" {
				attrs = append(attrs, slog.String("flow_protected", info.flowProtected))
			}
		}
		if info.flowShed != "" {
			attrs = append(attrs, slog.String("flow_shed", info.flowShed))
		}
		if info.promptTokens > 0 {
			attrs = append(attrs, slog.Int("prompt_tokens", info.promptTokens))
		}
		if info.session != "" {
			attrs = append(attrs, slog.String("session", info.session))
		}
		if info.model != "" {
			attrs = append(attrs, slog.String("model", info.model))
		}
		s.log.LogAttrs(context.WithoutCancel(c.Request.Context()), slog.LevelInfo, "access", attrs...)
	}()
	c.Next()
}

// ms is d in milliseconds with microsecond precision.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
