package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/configs"
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
		{"unknown model", "/debug/route", `{"model":"nope","prompt":"x"}`, 404, "The model `nope` does not exist."},
		{"session echoed", "/debug/route", `{"model":"` + testModel + `","prompt":"x","nvext":{"session_control":{"session_id":"s-1"}}}`, 200, `"session_id":"s-1"`},
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
