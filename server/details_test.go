package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvgate/kvgate/router"
)

type fakeDetail struct{ degraded bool }

func (f fakeDetail) HealthDetail() (string, any, bool) {
	return "cluster", map[string]any{"connected": !f.degraded}, f.degraded
}

// A degraded component (NATS down) shows in /health and /debug/workers but never turns a
// gateway with routable workers into a 503.
func TestHealthReportsDetails(t *testing.T) {
	a := startSim(t, fastSim())
	for _, degraded := range []bool{false, true} {
		cfg := testGatewayConfig(a.srv.URL)
		pol, err := router.New(cfg.Router.Policy, router.Options{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		g := startGatewayWith(t, cfg, routerFor(t, pol), nil)
		g.details = []HealthDetail{fakeDetail{degraded}}
		rec := httptest.NewRecorder()
		g.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
		var h struct {
			Status   string         `json:"status"`
			Cluster  map[string]any `json:"cluster"`
			Degraded []string       `json:"degraded"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &h); err != nil {
			t.Fatal(err)
		}
		if rec.Code != http.StatusOK || h.Status != "ok" || h.Cluster["connected"] != !degraded ||
			(len(h.Degraded) == 1) != degraded {
			t.Fatalf("degraded=%v: %d %s", degraded, rec.Code, rec.Body)
		}
		rec = httptest.NewRecorder()
		g.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/workers", nil))
		var d struct {
			Details map[string]map[string]any `json:"details"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &d); err != nil || d.Details["cluster"]["connected"] != !degraded {
			t.Fatalf("debug/workers details: %v %s", err, rec.Body)
		}
	}
}
