package server

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/configs"
)

// TestCORS: off by default (no CORS headers, a preflight is an unmatched route); with
// cors.allowed_origins an allowed origin's preflight is answered 204 and its requests carry
// Access-Control-Allow-Origin, while another origin gets no CORS headers.
func TestCORS(t *testing.T) {
	w := startSim(t, fastSim())
	cases := []struct {
		name           string
		origins        []string
		origin         string
		preflightCode  int
		allowOriginHdr string
	}{
		{name: "off by default", origin: "https://app.example", preflightCode: http.StatusMethodNotAllowed},
		{name: "allowed origin", origins: []string{"https://app.example"}, origin: "https://app.example", preflightCode: http.StatusNoContent, allowOriginHdr: "https://app.example"},
		{name: "other origin", origins: []string{"https://app.example"}, origin: "https://evil.example", preflightCode: http.StatusMethodNotAllowed},
		{name: "any origin", origins: []string{"*"}, origin: "https://x.example", preflightCode: http.StatusNoContent, allowOriginHdr: "https://x.example"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := startGateway(t, func(c *configs.Config) { c.CORS.AllowedOrigins = tc.origins }, w.srv.URL)
			req, _ := http.NewRequest(http.MethodOptions, g.url+"/v1/chat/completions", nil)
			req.Header.Set("Origin", tc.origin)
			req.Header.Set("Access-Control-Request-Method", "POST")
			req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.preflightCode || resp.Header.Get("Access-Control-Allow-Origin") != tc.allowOriginHdr {
				t.Errorf("preflight: %d, allow-origin %q; want %d, %q", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"), tc.preflightCode, tc.allowOriginHdr)
			}
			if tc.allowOriginHdr != "" && !strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), "authorization") {
				t.Errorf("preflight allow-headers %q", resp.Header.Get("Access-Control-Allow-Headers"))
			}
			req, _ = http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions", strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`))
			req.Header.Set("Origin", tc.origin)
			resp, err = http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Access-Control-Allow-Origin") != tc.allowOriginHdr {
				t.Errorf("request: %d, allow-origin %q; want 200, %q", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"), tc.allowOriginHdr)
			}
		})
	}
}
