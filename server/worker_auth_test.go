package server

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/configs"
)

// A fleet started with vllm serve --api-key: the gateway presents the worker key on health
// probes, model refresh (so LoRA adapters are known), /v1/models and every proxied request,
// in place of the client's key. Without a worker key the client's Authorization passes through.
func TestWorkerAPIKey(t *testing.T) {
	simOpts := fastSim()
	simOpts.APIKeys = []string{"worker-key"}
	simOpts.LoRAModules = []string{"adapter-a"}
	chat := func(model string, stream bool) string {
		s := "false"
		if stream {
			s = "true"
		}
		return `{"model":"` + model + `","max_tokens":2,"stream":` + s + `,"messages":[{"role":"user","content":"hi"}]}`
	}
	cases := []struct {
		name       string
		mutate     func(c *configs.Config)
		workerSees string // the Authorization a proxied request carries
	}{
		{"fleet default", func(c *configs.Config) { c.Auth.WorkerAPIKey = "worker-key" }, "Bearer worker-key"},
		{"per worker", func(c *configs.Config) { c.Auth.WorkerAPIKey = "other"; c.Workers[0].APIKey = "worker-key" }, "Bearer worker-key"},
		{"client keys too", func(c *configs.Config) {
			c.Auth.WorkerAPIKey = "worker-key"
			c.Auth.APIKeys = []string{"client-key"}
		}, "Bearer worker-key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := startSim(t, simOpts)
			g := startGateway(t, tc.mutate, a.srv.URL)
			w := g.reg.Workers()[0]
			if st := w.Status(); st.State != "healthy" || !slices.Contains(st.Models, "adapter-a") {
				t.Fatalf("worker after probing: %+v", st)
			}
			if code, _, body := do(t, "GET", g.url+"/v1/models", "Bearer client-key", ""); code != http.StatusOK || !strings.Contains(body, "adapter-a") {
				t.Errorf("/v1/models: %d %s", code, body)
			}
			for _, req := range []string{chat(testModel, false), chat(testModel, true), chat("adapter-a", false)} {
				if code, _, body := do(t, "POST", g.url+pathChat, "Bearer client-key", req); code != http.StatusOK {
					t.Errorf("chat %s: %d %s", req, code, body)
				}
			}
			for _, r := range a.rec.all() {
				if got := r.header.Values("Authorization"); len(got) != 1 || got[0] != tc.workerSees {
					t.Errorf("%s reached the worker with Authorization %q, want %q", r.path, got, tc.workerSees)
				}
			}
			g.reg.ProbeAll(context.Background())
			if st := w.Status(); st.State != "healthy" {
				t.Errorf("probe with the key: %+v", st)
			}
		})
	}

	t.Run("no worker key passes the client's through", func(t *testing.T) {
		a := startSim(t, simOpts)
		g := startGateway(t, nil, a.srv.URL)
		if code, _, body := do(t, "POST", g.url+pathChat, "Bearer worker-key", chat(testModel, false)); code != http.StatusOK {
			t.Fatalf("chat with the worker's key as the client's: %d %s", code, body)
		}
		if code, _, _ := do(t, "POST", g.url+pathChat, "", chat(testModel, false)); code != http.StatusUnauthorized {
			t.Errorf("chat without any key reached the guarded worker: %d", code)
		}
		if rs := a.rec.all(); len(rs) != 2 || rs[0].header.Get("Authorization") != "Bearer worker-key" || rs[1].header.Get("Authorization") != "" {
			t.Errorf("pass-through: %+v", rs)
		}
	})
}
