package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/workers"
)

// twoPools is a gateway serving two models, each with its own workers, registry and router.
type twoPools struct {
	url, adminURL string
	a, b          *simWorker
	routers       [2]*spyRouter
}

func startTwoPools(t *testing.T) *twoPools {
	t.Helper()
	oa := fastSim()
	oa.ServedModelName = "model-a"
	oa.LoRAModules = []string{"adapter-a"}
	ob := fastSim()
	ob.ServedModelName = "model-b"
	tp := &twoPools{a: startSim(t, oa), b: startSim(t, ob)}
	cfg := testGatewayConfig()
	var pools []Pool
	for i, p := range []struct {
		model   string
		aliases []string
		url     string
	}{{"model-a", []string{"a-latest"}, tp.a.srv.URL}, {"model-b", nil, tp.b.srv.URL}} {
		pc := testGatewayConfig(p.url)
		pc.Model = p.model
		reg, err := workers.NewRegistry(pc, nil)
		if err != nil {
			t.Fatal(err)
		}
		reg.ProbeAll(context.Background())
		t.Cleanup(reg.Close)
		tp.routers[i] = &spyRouter{Router: routerFor(t, &router.RoundRobin{})}
		pools = append(pools, Pool{Model: p.model, Aliases: p.aliases, BlockSize: 16 << i, Registry: reg, Router: tp.routers[i]})
	}
	s, err := New(Options{Config: cfg, Pools: pools})
	if err != nil {
		t.Fatal(err)
	}
	srv, admin := httptest.NewServer(s.Handler()), httptest.NewServer(s.AdminHandler())
	t.Cleanup(func() { srv.Close(); admin.Close() })
	tp.url, tp.adminURL = srv.URL, admin.URL
	return tp
}

// Requests go to the pool of their model (its name, an alias, an adapter its workers list);
// each pool's router alone hears its requests; an unknown model is OpenAI's 404 on OpenAI
// routes and Anthropic-shaped on /v1/messages.
func TestPoolsRouteByModel(t *testing.T) {
	tp := startTwoPools(t)
	g := &gateway{url: tp.url, adminURL: tp.adminURL}
	cases := []struct {
		model    string
		worker   string
		poolSeen int
	}{
		{"model-a", tp.a.srv.URL, 0},
		{"a-latest", tp.a.srv.URL, 0},
		{"adapter-a", tp.a.srv.URL, 0},
		{"model-b", tp.b.srv.URL, 1},
		{"", tp.a.srv.URL, 0}, // no model: the first (default) model
	}
	for _, tc := range cases {
		t.Run("model "+tc.model, func(t *testing.T) {
			before := [2]int32{tp.routers[0].started.Load(), tp.routers[1].started.Load()}
			body := `{"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
			if tc.model != "" {
				body = `{"model":"` + tc.model + `",` + body[1:]
			}
			resp, data := g.post(t, pathChat, body, nil)
			if tc.model == "a-latest" {
				// The alias reaches the worker unchanged; this worker does not serve it (the
				// docs/routing.md says to give the workers every alias): its own 404 proves the route.
				if resp.StatusCode != http.StatusNotFound || resp.Header.Get("X-Kvgate-Worker") != tc.worker {
					t.Fatalf("%d from %q: %s", resp.StatusCode, resp.Header.Get("X-Kvgate-Worker"), data)
				}
			} else if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Kvgate-Worker") != tc.worker {
				t.Fatalf("%d from %q, want 200 from %s: %s", resp.StatusCode, resp.Header.Get("X-Kvgate-Worker"), tc.worker, data)
			}
			after := [2]int32{tp.routers[0].started.Load(), tp.routers[1].started.Load()}
			other := 1 - tc.poolSeen
			if after[tc.poolSeen] != before[tc.poolSeen]+1 || after[other] != before[other] {
				t.Errorf("routers started %v -> %v, want only pool %d", before, after, tc.poolSeen)
			}
		})
	}
	t.Run("unknown model", func(t *testing.T) {
		resp, data := g.post(t, pathChat, `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}`, nil)
		checkModelNotFound(t, resp, data, "gpt-9")
		resp, data = g.post(t, "/v1/embeddings", `{"model":"gpt-9","input":"hi"}`, nil)
		checkModelNotFound(t, resp, data, "gpt-9")
	})
	t.Run("unknown model on /v1/messages", func(t *testing.T) {
		resp, data := g.post(t, pathMessages, `{"model":"gpt-9","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, nil)
		var eb anthropicErrorBody
		if resp.StatusCode != http.StatusNotFound || json.Unmarshal(data, &eb) != nil || eb.Type != "error" ||
			!strings.Contains(eb.Error.Message, "The model `gpt-9` does not exist") {
			t.Errorf("%d %s", resp.StatusCode, data)
		}
	})
	t.Run("debug route and workers per model", func(t *testing.T) {
		resp, data := g.post(t, "/debug/route", `{"model":"model-b","prompt":"x"}`, nil)
		var d struct {
			BlockSize int `json:"block_size"`
			Chosen    struct{ Worker string }
		}
		if resp.StatusCode != 200 || json.Unmarshal(data, &d) != nil || d.Chosen.Worker != tp.b.srv.URL || d.BlockSize != 32 {
			t.Errorf("/debug/route model-b: %d %s", resp.StatusCode, data)
		}
		for model, want := range map[string]string{"": tp.a.srv.URL, "model-b": tp.b.srv.URL, "adapter-a": tp.a.srv.URL} {
			r, err := http.Get(tp.adminURL + "/debug/workers?model=" + model)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(r.Body)
			r.Body.Close()
			var v struct {
				Model   string
				Targets []struct{ Worker string }
			}
			if r.StatusCode != 200 || json.Unmarshal(body, &v) != nil || len(v.Targets) != 1 || v.Targets[0].Worker != want {
				t.Errorf("/debug/workers?model=%s: %d %s", model, r.StatusCode, body)
			}
		}
	})
	t.Run("models merged", func(t *testing.T) {
		list, err := g.client().ListModels(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range list.Models {
			ids = append(ids, m.ID)
		}
		if strings.Join(ids, ",") != "model-a,adapter-a,model-b" {
			t.Errorf("ids %v", ids)
		}
	})
}

// A pool without the options' single Registry and Router is a configuration error, as are two
// pools serving one name.
func TestPoolsOptions(t *testing.T) {
	cfg := configs.Default()
	reg, err := workers.NewRegistry(testGatewayConfig("http://127.0.0.1:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	rt := routerFor(t, &router.RoundRobin{})
	cases := []struct {
		name  string
		pools []Pool
		want  string
	}{
		{"no registry", []Pool{{Model: "a", Router: rt}}, "registry and router are required"},
		{"duplicate", []Pool{{Model: "a", Registry: reg, Router: rt}, {Model: "b", Aliases: []string{"a"}, Registry: reg, Router: rt}},
			`"a" is served by two pools`},
	}
	for _, tc := range cases {
		if _, err := New(Options{Config: cfg, Pools: tc.pools}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
}

// A request for an adapter only some of a pool's workers list goes only to those.
func TestAdapterOnSomeWorkers(t *testing.T) {
	with := fastSim()
	with.LoRAModules = []string{"adapter-x"}
	a, b := startSim(t, fastSim()), startSim(t, with)
	g := startGateway(t, nil, a.srv.URL, b.srv.URL)
	for i := range 4 {
		for model, want := range map[string][]string{"adapter-x": {b.srv.URL}, testModel: {a.srv.URL, b.srv.URL}} {
			resp, data := g.post(t, pathChat, `{"model":"`+model+`","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, nil)
			got := resp.Header.Get("X-Kvgate-Worker")
			if resp.StatusCode != http.StatusOK || !slices.Contains(want, got) {
				t.Fatalf("request %d for %s: %d from %s, want 200 from %v: %s", i, model, resp.StatusCode, got, want, data)
			}
		}
	}
}
