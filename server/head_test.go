package server

import (
	"io"
	"net/http"
	"testing"

	"github.com/kvgate/kvgate/configs"
)

// HEAD is answered wherever GET is: the GET route's status and headers, no body. Claude Code
// sends HEAD / first; HEAD /v1/models was a 405.
func TestHeadWhereGetIsServed(t *testing.T) {
	a := startSim(t, fastSim())
	g := startGateway(t, nil, a.srv.URL)
	keyed := startGateway(t, func(c *configs.Config) { c.Auth.APIKeys = []string{"key-1"} }, a.srv.URL)
	cases := []struct {
		base, path string
		header     map[string]string
		want       int
	}{
		{g.url, "/", nil, 200},
		{g.url, "/v1/models", nil, 200},
		{g.url, "/v1/models/" + testModel, nil, 200},
		{g.url, "/v1/models/nope", nil, 404},
		{g.url, "/health", nil, 200},
		{g.url, "/metrics", nil, 200},
		{g.url, "/version", nil, 200},
		{g.url, "/v1/nothing", nil, 404},
		{g.url, pathChat, nil, 405}, // POST only
		{g.adminURL, "/debug/workers", nil, 200},
		{keyed.url, "/", map[string]string{"x-api-key": "key-1"}, 200},
		{keyed.url, "/v1/models", map[string]string{"Authorization": "Bearer key-1"}, 200},
		{keyed.url, "/", nil, 401},
	}
	for _, tc := range cases {
		req, _ := http.NewRequest(http.MethodHead, tc.base+tc.path, nil)
		for k, v := range tc.header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("HEAD %s: %v", tc.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || len(body) != 0 {
			t.Errorf("HEAD %s: %d with %d body bytes, want %d and none", tc.path, resp.StatusCode, len(body), tc.want)
		}
		if tc.want == 200 && resp.Header.Get("Content-Type") == "" {
			t.Errorf("HEAD %s: no Content-Type", tc.path)
		}
	}
	// GET / itself.
	if code, _, body := do(t, "GET", g.url+"/", "", ""); code != 200 || body != `{"status":"ok"}` {
		t.Errorf("GET /: %d %s", code, body)
	}
}
