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

// clientAuth checks the client's API key on every path of the client listener except
// /health and /metrics (left open for probes and scrapers, as vLLM leaves them). A missing
// key gets OpenAI's "You didn't provide an API key" error (code null), a wrong one its
// "Incorrect API key provided" error (code invalid_api_key); both 401. The key is never
// echoed back.
func (s *Server) clientAuth(c *gin.Context) {
	switch c.Request.URL.Path {
	case "/health", "/metrics":
		c.Next()
		return
	}
	token, ok := bearerToken(c.Request.Header)
	if ok && s.clientKeys.has(token) {
		c.Next()
		return
	}
	var body openAIAuthError
	body.Error.Type = "invalid_request_error"
	body.Error.Message = msgNoAPIKey
	if ok {
		code := "invalid_api_key"
		body.Error.Message, body.Error.Code = msgBadAPIKey, &code
	}
	s.m.authFailures.WithLabelValues("client").Inc()
	data, _ := json.Marshal(body)
	c.Header("Content-Type", "application/json")
	c.AbortWithStatus(http.StatusUnauthorized)
	_, _ = c.Writer.Write(data)
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
