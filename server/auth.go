package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
)

// keySet holds secrets as SHA-256 digests, so a check compares fixed-length values in
// constant time and its timing reveals neither a key nor its length.
type keySet [][sha256.Size]byte

func newKeySet(keys []string) keySet {
	out := make(keySet, 0, len(keys))
	for _, k := range keys {
		out = append(out, sha256.Sum256([]byte(k)))
	}
	return out
}

// has reports whether token is one of the keys; it compares against every key, whatever
// matches, so the time does not tell which key (or whether an early one) matched.
func (ks keySet) has(token string) bool {
	d := sha256.Sum256([]byte(token))
	found := 0
	for i := range ks {
		found |= subtle.ConstantTimeCompare(d[:], ks[i][:])
	}
	return found == 1
}

// bearerToken returns the token of an "Authorization: Bearer TOKEN" header (the scheme is
// case-insensitive, RFC 6750 §2.1) and whether there was one.
func bearerToken(h http.Header) (string, bool) {
	v := strings.TrimSpace(h.Get("Authorization"))
	scheme, token, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// openAIAuthError is OpenAI's 401 body: {"error": {"message", "type": "invalid_request_error",
// "param": null, "code": "invalid_api_key" | null}}.
type openAIAuthError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

const (
	msgNoAPIKey  = "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
	msgBadAPIKey = "Incorrect API key provided. Check the API key in your Authorization header (Authorization: Bearer YOUR_KEY)."
)

// clientKeys returns the API keys a client request presents: the Authorization Bearer token
// (OpenAI SDKs) and the x-api-key header (Anthropic SDKs, Claude Code with ANTHROPIC_API_KEY),
// in that order; empty ones are left out.
func clientKeys(h http.Header) []string {
	var out []string
	if t, ok := bearerToken(h); ok {
		out = append(out, t)
	}
	if k := strings.TrimSpace(h.Get("X-Api-Key")); k != "" {
		out = append(out, k)
	}
	return out
}

// Anthropic's 401 messages (authentication_error), for /v1/messages*.
const (
	msgNoAPIKeyAnthropic  = "x-api-key header is required (or Authorization: Bearer YOUR_KEY)"
	msgBadAPIKeyAnthropic = "invalid x-api-key"
)

// clientAuth checks the client's API key, sent as Authorization: Bearer or as x-api-key, on
// every path of the client listener except /health and /metrics (left open for probes and
// scrapers, as vLLM leaves them). A missing key gets OpenAI's "You didn't provide an API key"
// error (code null), a wrong one its "Incorrect API key provided" error (code
// invalid_api_key); both 401. On /v1/messages* both are Anthropic's authentication_error.
// The key is never echoed back.
func (s *Server) clientAuth(c *gin.Context) {
	switch c.Request.URL.Path {
	case "/health", "/metrics":
		c.Next()
		return
	}
	presented := clientKeys(c.Request.Header)
	for _, k := range presented {
		if s.clientKeys.has(k) {
			c.Next()
			return
		}
	}
	s.m.authFailures.WithLabelValues("client").Inc()
	if anthropicRoute(c) {
		msg := msgNoAPIKeyAnthropic
		if len(presented) > 0 {
			msg = msgBadAPIKeyAnthropic
		}
		writeError(c, &apiError{Status: http.StatusUnauthorized, Message: msg})
		return
	}
	var body openAIAuthError
	body.Error.Type = "invalid_request_error"
	body.Error.Message = msgNoAPIKey
	if len(presented) > 0 {
		code := "invalid_api_key"
		body.Error.Message, body.Error.Code = msgBadAPIKey, &code
	}
	data, _ := json.Marshal(body)
	c.Header("Content-Type", "application/json")
	c.AbortWithStatus(http.StatusUnauthorized)
	_, _ = c.Writer.Write(data)
}

// dropClientKey removes the x-api-key a client authenticated with from a request to a worker:
// that key is the gateway's (auth.api_keys), and vLLM has no use for it.
func (s *Server) dropClientKey(h http.Header) {
	if len(s.clientKeys) > 0 {
		h.Del("X-Api-Key")
	}
}

// adminAuth requires admin_token on every admin request: 401 with WWW-Authenticate otherwise.
func (s *Server) adminAuth(c *gin.Context) {
	if token, ok := bearerToken(c.Request.Header); ok && s.adminToken.has(token) {
		c.Next()
		return
	}
	s.m.authFailures.WithLabelValues("admin").Inc()
	c.Header("WWW-Authenticate", `Bearer realm="kvgate admin"`)
	writeError(c, &apiError{Status: http.StatusUnauthorized, Message: "missing or wrong admin token: send Authorization: Bearer <admin_token>"})
}
