package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
)

// The debug endpoints answer for the simple policies too: the dry run detects chat and
// completions bodies, /debug/workers lists every worker+rank, and sessions are not tracked.
func TestDebugEndpointsSimplePolicy(t *testing.T) {
	a, b := startSim(t, fastSim()), startSim(t, fastSim())
	g := startGateway(t, func(c *configs.Config) { c.Workers[1].DPSize = 2 }, a.srv.URL, b.srv.URL)

	cases := []struct {
		name, path, body string
		status           int
		want             string
	}{
		{"chat", "/debug/route", `{"model":"` + testModel + `","messages":[{"role":"user","content":"hi"}]}`, 200, `"endpoint":"/v1/chat/completions"`},
		{"completions", "/debug/route", `{"model":"` + testModel + `","prompt":"hi"}`, 200, `"endpoint":"/v1/completions"`},
		{"explicit endpoint", "/debug/route?endpoint=completions", `{"model":"` + testModel + `","prompt":[1,2,3]}`, 200, `"policy":"round_robin"`},
		{"bad endpoint", "/debug/route?endpoint=embeddings", `{}`, 400, `"param":"endpoint"`},
		{"neither", "/debug/route", `{"model":"` + testModel + `"}`, 400, `messages: must be a non-empty array`},
		{"unknown model", "/debug/route", `{"model":"nope","prompt":"x"}`, 404, `{"error":{"message":"The model ` + "`nope`" + ` does not exist or you do not have access to it.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`},
		{"session echoed", "/debug/route", `{"model":"` + testModel + `","prompt":"x","nvext":{"session_control":{"session_id":"s-1"}}}`, 200, `"session_id":"` + kvkey.HashSessionID("s-1") + `"`},
		{"bad session id", "/debug/route", `{"model":"` + testModel + `","prompt":"x","nvext":{"session_control":{"session_id":"a\u0001b"}}}`, 400, `session`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, data := g.post(t, tc.path, tc.body, nil)
			if resp.StatusCode != tc.status || !strings.Contains(string(data), tc.want) {
				t.Errorf("%d %s; want %d with %s", resp.StatusCode, data, tc.status, tc.want)
			}
		})
	}

	resp, err := http.Get(g.adminURL + "/debug/workers")
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Policy  string `json:"policy"`
		Targets []struct {
			Worker  string `json:"worker"`
			DPRank  int    `json:"dp_rank"`
			Healthy bool   `json:"healthy"`
			Mode    string `json:"mode"`
		} `json:"targets"`
	}
	err = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if err != nil || out.Policy != "round_robin" || len(out.Targets) != 3 || out.Targets[2].Worker != b.srv.URL ||
		out.Targets[2].DPRank != 1 || !out.Targets[0].Healthy || out.Targets[0].Mode != "" {
		t.Errorf("/debug/workers: %+v (%v)", out, err)
	}

	resp, err = http.Get(g.adminURL + "/debug/sessions/any/id")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("/debug/sessions without session tracking: %d", resp.StatusCode)
	}
}

// debugRouter is a round-robin router whose debug views are canned, to show that the debug
// endpoints read only the Router's views.
type debugRouter struct{ router.Router }

func (debugRouter) DebugTargets(ts []kvkey.Target) []router.TargetView {
	out := make([]router.TargetView, len(ts))
	for i, t := range ts {
		out[i] = router.TargetView{Mode: "events", IndexBlocks: 10*i + t.DPRank + 1}
	}
	return out
}

func (debugRouter) DebugFleet() router.FleetView {
	return router.FleetView{Collectors: []indexers.CollectorDebug{{Listen: "tcp://127.0.0.1:1"}}}
}

func (debugRouter) DebugSession(id string, _ bool) (any, error) {
	if id != kvkey.HashSessionID("known/one") {
		return nil, fmt.Errorf("session %q: %w", id, router.ErrNoSession)
	}
	return map[string]string{"id": id}, nil
}

func TestDebugEndpointsReadTheRouter(t *testing.T) {
	a, b := startSim(t, fastSim()), startSim(t, fastSim())
	cfg := testGatewayConfig(a.srv.URL, b.srv.URL)
	cfg.Workers[1].DPSize = 2
	g := startGatewayWith(t, cfg, debugRouter{routerFor(t, &router.RoundRobin{})}, nil)

	cases := []struct {
		path   string
		status int
		want   []string
	}{
		{"/debug/workers", 200, []string{
			`"in_flight":0,"mode":"events","index_blocks":1`,
			`"worker":"` + b.srv.URL + `","dp_rank":1,`, `"dp_rank":1,"healthy":true,"state":"healthy","in_flight":0,"mode":"events","index_blocks":22`,
			`"kv_collectors":[{"listen":"tcp://127.0.0.1:1"`}},
		{"/debug/sessions/known/one", 200, []string{`{"id":"` + kvkey.HashSessionID("known/one") + `"}`}},
		{"/debug/sessions/other", 404, []string{`session \"` + kvkey.HashSessionID("other") + `\": no such session`}},
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			resp, err := http.Get(g.adminURL + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d: %s", resp.StatusCode, tc.status, data)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(data), w) {
					t.Errorf("body %s lacks %s", data, w)
				}
			}
		})
	}
}
