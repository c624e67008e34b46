package server

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/kvgate/kvgate/configs"
)

// sendWith sends body to url with the given headers and returns status and body.
func sendWith(t *testing.T, method, url, body string, header map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// checkAnthropicError checks body is exactly Anthropic's error shape with type typ.
func checkAnthropicError(t *testing.T, status int, body string, wantStatus int, typ string) {
	t.Helper()
	var e map[string]any
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("%d %q: %v", status, body, err)
	}
	inner, _ := e["error"].(map[string]any)
	msg, _ := inner["message"].(string)
	if status != wantStatus || e["type"] != "error" || len(e) != 2 || inner["type"] != typ || len(inner) != 2 || msg == "" {
		t.Fatalf("%d %s, want %d with an Anthropic %s error", status, body, wantStatus, typ)
	}
}

// Every error a client of /v1/messages* sees is Anthropic's shape with Anthropic's type for
// its status, whichever part of the gateway raised it: the auth middleware (x-api-key),
// the body limit, the request checks, the model check, routing with no worker, and unknown
// routes and methods under /v1/messages.
func TestMessagesErrorsAnthropicShaped(t *testing.T) {
	g := startGateway(t, func(c *configs.Config) {
		c.Auth.APIKeys = []string{"key-1"}
		c.Proxy.MaxBodyBytes = 4096
	}, "http://127.0.0.1:1") // no worker ever answers
	ok := `{"model":"test-model","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	okCount := `{"model":"test-model","messages":[{"role":"user","content":"hi"}]}`
	big := `{"model":"test-model","max_tokens":4,"messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`
	key := map[string]string{"x-api-key": "key-1"}
	cases := []struct {
		name, method, path, body string
		header                   map[string]string
		status                   int
		typ                      string
	}{
		{"no key", "POST", pathMessages, ok, nil, 401, "authentication_error"},
		{"wrong x-api-key", "POST", pathMessages, ok, map[string]string{"x-api-key": "key-2"}, 401, "authentication_error"},
		{"wrong bearer", "POST", pathCountTokens, okCount, map[string]string{"Authorization": "Bearer key-2"}, 401, "authentication_error"},
		{"no worker (x-api-key)", "POST", pathMessages, ok, key, 503, "overloaded_error"},
		{"no worker (bearer)", "POST", pathMessages, ok, map[string]string{"Authorization": "Bearer key-1"}, 503, "overloaded_error"},
		{"body too large", "POST", pathMessages, big, key, 413, "request_too_large"},
		{"body too large, count_tokens", "POST", pathCountTokens, big, key, 413, "request_too_large"},
		{"unknown model", "POST", pathMessages, strings.Replace(ok, "test-model", "nope", 1), key, 404, "not_found_error"},
		{"empty messages", "POST", pathMessages, `{"model":"test-model","max_tokens":4,"messages":[]}`, key, 400, "invalid_request_error"},
		{"empty messages, count_tokens", "POST", pathCountTokens, `{"model":"test-model","messages":[]}`, key, 400, "invalid_request_error"},
		{"empty content, count_tokens", "POST", pathCountTokens, `{"model":"test-model","messages":[{"role":"user","content":[]}]}`, key, 400, "invalid_request_error"},
		{"not JSON", "POST", pathMessages, `{`, key, 400, "invalid_request_error"},
		{"unknown subpath", "POST", pathMessages + "/batches", ok, key, 404, "not_found_error"},
		{"wrong method", "GET", pathMessages, "", key, 405, "invalid_request_error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := sendWith(t, tc.method, g.url+tc.path, tc.body, tc.header)
			checkAnthropicError(t, status, body, tc.status, tc.typ)
			if strings.Contains(body, "key-") {
				t.Errorf("the error echoes a key: %s", body)
			}
		})
	}
	// The same failures elsewhere keep OpenAI's shape.
	status, body := sendWith(t, "POST", g.url+pathChat, `{"model":"test-model","messages":[{"role":"user","content":"hi"}]}`, key)
	if status != 503 || !strings.HasPrefix(body, `{"error":{`) {
		t.Errorf("chat with x-api-key and no worker: %d %s", status, body)
	}
}

// The route decides the shape, so an error any handler or middleware raises through
// writeError on /v1/messages* is Anthropic's, with Anthropic's type for every status
// (https://docs.claude.com/en/api/errors), and OpenAI's elsewhere.
func TestAnthropicErrorTypes(t *testing.T) {
	cases := []struct {
		status int
		typ    string
	}{
		{400, "invalid_request_error"}, {401, "authentication_error"}, {403, "permission_error"},
		{404, "not_found_error"}, {405, "invalid_request_error"}, {408, "invalid_request_error"},
		{413, "request_too_large"}, {429, "rate_limit_error"}, {500, "api_error"},
		{502, "api_error"}, {503, "overloaded_error"}, {504, "api_error"}, {529, "overloaded_error"},
	}
	paths := []struct {
		path      string
		anthropic bool
	}{{pathMessages, true}, {pathCountTokens, true}, {pathMessages + "/x", true}, {pathChat, false}, {"/v1/messagesx", false}}
	for _, p := range paths {
		path := p.path
		for _, tc := range cases {
			w := httptest.NewRecorder()
			c, _ := gin.CreateTestContext(w)
			c.Request = httptest.NewRequest(http.MethodPost, path, nil)
			writeError(c, &apiError{Status: tc.status, Message: "m", errType: "model_not_found"})
			if !p.anthropic {
				if !strings.HasPrefix(w.Body.String(), `{"error":{`) {
					t.Errorf("%s %d: %s, want OpenAI's shape", path, tc.status, w.Body)
				}
				continue
			}
			checkAnthropicError(t, w.Code, w.Body.String(), tc.status, tc.typ)
		}
	}
}

// x-api-key is a client key on every route, as Authorization: Bearer is.
func TestClientXAPIKey(t *testing.T) {
	a := startSim(t, fastSim())
	g := startGateway(t, func(c *configs.Config) { c.Auth.APIKeys = []string{"key-1", "key-2"} }, a.srv.URL)
	chat := `{"model":"` + testModel + `","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	msgs := `{"model":"` + testModel + `","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	cases := []struct {
		name, method, path, body string
		header                   map[string]string
		want                     int
	}{
		{"chat x-api-key", "POST", pathChat, chat, map[string]string{"x-api-key": "key-2"}, 200},
		{"chat wrong x-api-key", "POST", pathChat, chat, map[string]string{"x-api-key": "key-3"}, 401},
		{"models x-api-key", "GET", "/v1/models", "", map[string]string{"x-api-key": "key-1"}, 200},
		{"messages x-api-key", "POST", pathMessages, msgs, map[string]string{"x-api-key": "key-1"}, 200},
		{"messages bearer", "POST", pathMessages, msgs, map[string]string{"Authorization": "Bearer key-1"}, 200},
		{"wrong bearer, right x-api-key", "POST", pathMessages, msgs, map[string]string{"Authorization": "Bearer nope", "x-api-key": "key-1"}, 200},
		{"empty x-api-key", "POST", pathMessages, msgs, map[string]string{"x-api-key": " "}, 401},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if status, body := sendWith(t, tc.method, g.url+tc.path, tc.body, tc.header); status != tc.want {
				t.Fatalf("%d %s, want %d", status, body, tc.want)
			}
		})
	}
	// The gateway's key never reaches a worker as x-api-key.
	for _, r := range a.rec.all() {
		if v := r.header.Get("X-Api-Key"); v != "" {
			t.Errorf("%s reached the worker with x-api-key %q", r.path, v)
		}
	}
}

// A worker's own error on /v1/messages* reaches the client in Anthropic's shape too: vLLM
// answers body-validation failures in OpenAI's shape and its --api-key check with
// {"error": "Unauthorized"}; an Anthropic-shaped error is passed through as it is.
func TestMessagesWorkerErrorsAnthropicShaped(t *testing.T) {
	cases := []struct {
		name, upstream string
		status         int
		typ, message   string
	}{
		{"openai shape", `{"error":{"message":"bad field","type":"Bad Request","param":null,"code":400}}`, 400, "invalid_request_error", "bad field"},
		{"vllm auth", `{"error":"Unauthorized"}`, 401, "authentication_error", "Unauthorized"},
		{"fastapi detail", `{"detail":"Not Found"}`, 404, "not_found_error", "Not Found"},
		{"busy", `{"error":{"message":"busy","type":"ServiceUnavailableError","param":null,"code":503}}`, 503, "overloaded_error", "busy"},
		{"already anthropic", `{"type":"error","error":{"type":"BadRequestError","message":"as is"}}`, 400, "BadRequestError", "as is"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.upstream))
			})
			g := startGateway(t, nil, up.URL)
			status, body := sendWith(t, "POST", g.url+pathMessages, `{"model":"test-model","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, nil)
			checkAnthropicError(t, status, body, tc.status, tc.typ)
			if !strings.Contains(body, `"message":"`+tc.message+`"`) {
				t.Errorf("message lost: %s", body)
			}
			// Chat keeps the worker's body byte for byte.
			status, body = sendWith(t, "POST", g.url+pathChat, `{"model":"test-model","messages":[{"role":"user","content":"hi"}]}`, nil)
			if status != tc.status || body != tc.upstream {
				t.Errorf("chat: %d %s", status, body)
			}
		})
	}
}
