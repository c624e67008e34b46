package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/router"
)

func do(t *testing.T, method, url, auth, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(data)
}

var debugPaths = []struct{ method, path, body string }{
	{"POST", "/debug/route", `{"model":"` + testModel + `","prompt":"hi"}`},
	{"GET", "/debug/workers", ""},
	{"GET", "/debug/sessions/some-session", ""},
}

// The debug endpoints are never on the client listener; they answer on the admin listener.
func TestDebugOnlyOnAdminListener(t *testing.T) {
	a := startSim(t, fastSim())
	g := startGateway(t, nil, a.srv.URL)
	for _, p := range debugPaths {
		if code, _, body := do(t, p.method, g.url+p.path, "", p.body); code != http.StatusNotFound {
			t.Errorf("client listener %s %s: %d %s, want 404", p.method, p.path, code, body)
		}
		code, _, body := do(t, p.method, g.adminURL+p.path, "", p.body)
		want := http.StatusOK
		if strings.HasPrefix(p.path, "/debug/sessions/") {
			want = http.StatusNotFound // round robin tracks no sessions: the handler's own 404
		}
		if code != want || !json.Valid([]byte(body)) {
			t.Errorf("admin listener %s %s: %d %s, want %d", p.method, p.path, code, body, want)
		}
	}
	// /metrics is on both: the admin one with the per-worker series (TestDetailedMetricsPublic).
	for _, path := range []string{"/health", "/v1/models", pathChat} {
		if code, _, _ := do(t, "GET", g.adminURL+path, "", ""); code != http.StatusNotFound {
			t.Errorf("admin listener serves %s: %d", path, code)
		}
	}
}

// With admin_token every admin request needs it: missing or wrong is 401, right passes.
func TestAdminToken(t *testing.T) {
	a := startSim(t, fastSim())
	g := startGateway(t, func(c *configs.Config) { c.AdminToken = "s3cret" }, a.srv.URL)
	cases := []struct {
		name, auth string
		want       int
	}{
		{"missing", "", http.StatusUnauthorized},
		{"wrong", "Bearer s3creT", http.StatusUnauthorized},
		{"prefix", "Bearer s3c", http.StatusUnauthorized},
		{"not bearer", "Basic s3cret", http.StatusUnauthorized},
		{"right", "Bearer s3cret", http.StatusOK},
		{"scheme case", "bearer s3cret", http.StatusOK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			paths := append(debugPaths[:2:2], struct{ method, path, body string }{"GET", "/metrics", ""})
			for _, p := range paths {
				code, h, body := do(t, p.method, g.adminURL+p.path, tc.auth, p.body)
				if code != tc.want {
					t.Errorf("%s: %d %s, want %d", p.path, code, body, tc.want)
				}
				if code == http.StatusUnauthorized && (h.Get("WWW-Authenticate") == "" || !strings.Contains(body, `"code":401`)) {
					t.Errorf("%s: 401 without WWW-Authenticate or JSON error: %v %s", p.path, h, body)
				}
			}
		})
	}
}

// X-Kvgate-Worker and X-Kvgate-Cached-Blocks are sent only with proxy.expose_routing_headers.
func TestRoutingHeadersOptIn(t *testing.T) {
	if configs.Default().Proxy.ExposeRoutingHeaders {
		t.Fatal("proxy.expose_routing_headers must default to false")
	}
	a := startSim(t, fastSim())
	for _, on := range []bool{false, true} {
		g := startGateway(t, func(c *configs.Config) { c.Proxy.ExposeRoutingHeaders = on }, a.srv.URL)
		for _, stream := range []string{"false", "true"} {
			body := `{"model":"` + testModel + `","max_tokens":2,"stream":` + stream + `,"messages":[{"role":"user","content":"hi"}]}`
			code, h, resp := do(t, "POST", g.url+pathChat, "", body)
			if code != http.StatusOK {
				t.Fatalf("%d %s", code, resp)
			}
			gotW, gotB := h.Get("X-Kvgate-Worker"), h.Get(router.HeaderCachedBlocks)
			if on && (gotW != a.srv.URL || gotB == "") {
				t.Errorf("on, stream %s: worker %q cached %q", stream, gotW, gotB)
			}
			if !on && (gotW != "" || gotB != "" || len(h.Values("X-Kvgate-Worker")) > 0) {
				t.Errorf("off, stream %s: routing headers sent: worker %q cached %q", stream, gotW, gotB)
			}
		}
	}
}

// With auth.api_keys the client listener wants a key (OpenAI's 401 bodies otherwise) on every
// path but /health and /metrics.
func TestClientAPIKeys(t *testing.T) {
	a := startSim(t, fastSim())
	g := startGateway(t, func(c *configs.Config) { c.Auth.APIKeys = []string{"key-1", "key-2"} }, a.srv.URL)
	chat := `{"model":"` + testModel + `","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	type errBody struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	cases := []struct {
		name, method, path, auth, body string
		want                           int
		code                           string // the error's code; "null" for JSON null
	}{
		{"chat no key", "POST", pathChat, "", chat, 401, "null"},
		{"chat wrong key", "POST", pathChat, "Bearer key-3", chat, 401, "invalid_api_key"},
		{"chat key prefix", "POST", pathChat, "Bearer key-", chat, 401, "invalid_api_key"},
		{"chat first key", "POST", pathChat, "Bearer key-1", chat, 200, ""},
		{"chat second key", "POST", pathChat, "Bearer key-2", chat, 200, ""},
		{"completions no key", "POST", pathCompletions, "", `{"model":"` + testModel + `","prompt":"x","max_tokens":1}`, 401, "null"},
		{"models no key", "GET", "/v1/models", "", "", 401, "null"},
		{"models key", "GET", "/v1/models", "Bearer key-2", "", 200, ""},
		{"unknown path no key", "GET", "/v1/nothing", "", "", 401, "null"},
		{"health open", "GET", "/health", "", "", 200, ""},
		{"metrics open", "GET", "/metrics", "", "", 200, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, body := do(t, tc.method, g.url+tc.path, tc.auth, tc.body)
			if code != tc.want {
				t.Fatalf("%d %s, want %d", code, body, tc.want)
			}
			if tc.want != 401 {
				return
			}
			var e errBody
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Type != "invalid_request_error" ||
				e.Error.Param != nil || e.Error.Message == "" || strings.Contains(body, "key-") {
				t.Fatalf("401 body %s (%v)", body, err)
			}
			got := "null"
			if e.Error.Code != nil {
				got = *e.Error.Code
			}
			if got != tc.code || !strings.Contains(body, `"code":`) || !strings.Contains(body, `"param":null`) {
				t.Errorf("code %s, want %s: %s", got, tc.code, body)
			}
		})
	}
	// The OpenAI SDK reads the 401 like OpenAI's own.
	cc := openai.DefaultConfig("wrong")
	cc.BaseURL = g.url + "/v1"
	_, err := openai.NewClientWithConfig(cc).CreateChatCompletion(context.Background(), chatReq(false, 1))
	var apiErr *openai.APIError
	if !errors.As(err, &apiErr) || apiErr.HTTPStatusCode != 401 || apiErr.Code != "invalid_api_key" {
		t.Errorf("SDK error %v", err)
	}
	if n := len(a.rec.all()); n != 2 {
		t.Errorf("the worker saw %d requests, want only the 2 authorised chats", n)
	}
}
