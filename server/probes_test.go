package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/workers"
)

// fakeCheck is a ReadinessCheck with a fixed answer.
type fakeCheck struct {
	name   string
	ready  bool
	reason string
}

func (f fakeCheck) Readiness() (string, bool, string) { return f.name, f.ready, f.reason }

// fakeAdvisory is an AdvisoryCheck with a fixed answer.
type fakeAdvisory struct{ fakeCheck }

func (fakeAdvisory) Advisory() {}

// probeServer builds a server (not listening) over the given workers, probed once.
func probeServer(t *testing.T, mutate func(*configs.Config, *Options), urls ...string) *Server {
	t.Helper()
	cfg := testGatewayConfig(urls...)
	opts := Options{}
	if mutate != nil {
		mutate(&cfg, &opts)
	}
	reg, err := workers.NewRegistry(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	opts.Config, opts.Registry, opts.Router = cfg, reg, routerFor(t, &router.RoundRobin{})
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	reg.ProbeAll(t.Context())
	return s
}

// probe asks s's client handler for path with method and returns the status and body.
func probe(t *testing.T, s *Server, method, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(body)
}

// GET /ready lists one reason per component that holds the gateway out of service, names no
// worker, and is 200 with {"ready": true} when none does.
func TestReadyReasons(t *testing.T) {
	up := startSim(t, fastSim()).srv.URL
	down := "http://127.0.0.1:1" // nothing listens on port 1
	cases := []struct {
		name   string
		urls   []string
		mutate func(*configs.Config, *Options)
		phase  int32
		want   []readyReason // nil: ready
		warn   []readyReason
	}{
		{name: "a routable worker", urls: []string{up, down}},
		{name: "no routable worker", urls: []string{down},
			want: []readyReason{{componentWorkers, `model "test-model" has no routable worker (0 of 1)`}}},
		{name: "a check not ready", urls: []string{up},
			mutate: func(_ *configs.Config, o *Options) {
				o.Readiness = []ReadinessCheck{fakeCheck{"discovery", true, ""}, fakeCheck{"kv_events", false, "no event for 30s"}}
			},
			want: []readyReason{{"kv_events", "no event for 30s"}}},
		{name: "an advisory check not ready: a warning, still ready", urls: []string{up},
			mutate: func(_ *configs.Config, o *Options) {
				o.Readiness = []ReadinessCheck{fakeAdvisory{fakeCheck{"kv_events", false, "1 subscription silent"}}}
			},
			warn: []readyReason{{"kv_events", "1 subscription silent"}}},
		{name: "not ready with a warning", urls: []string{down},
			mutate: func(_ *configs.Config, o *Options) {
				o.Readiness = []ReadinessCheck{fakeAdvisory{fakeCheck{"kv_events", false, "1 subscription silent"}}}
			},
			want: []readyReason{{componentWorkers, `model "test-model" has no routable worker (0 of 1)`}},
			warn: []readyReason{{"kv_events", "1 subscription silent"}}},
		{name: "a check not ready without a reason", urls: []string{up},
			mutate: func(_ *configs.Config, o *Options) { o.Readiness = []ReadinessCheck{fakeCheck{"pool", false, ""}} },
			want:   []readyReason{{"pool", "not ready"}}},
		{name: "draining, every reason listed", urls: []string{down}, phase: phaseDraining,
			mutate: func(_ *configs.Config, o *Options) {
				o.Readiness = []ReadinessCheck{fakeCheck{"discovery", false, "not synced"}}
			},
			want: []readyReason{
				{componentServer, "draining: shutting down on a signal"},
				{componentWorkers, `model "test-model" has no routable worker (0 of 1)`},
				{"discovery", "not synced"},
			}},
		{name: "stopping", urls: []string{up}, phase: phaseStopping,
			want: []readyReason{{componentServer, "draining: shutting down on a signal"}}},
		{name: "pools checked by the caller", urls: []string{down},
			mutate: func(_ *configs.Config, o *Options) { o.NoFleetReadiness = true }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := probeServer(t, tc.mutate, tc.urls...)
			s.state.Store(tc.phase)
			code, body := probe(t, s, http.MethodGet, pathReady)
			var got readyBody
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatalf("body %q: %v", body, err)
			}
			wantCode := http.StatusOK
			if tc.want != nil {
				wantCode = http.StatusServiceUnavailable
			}
			if code != wantCode || got.Ready != (tc.want == nil) {
				t.Errorf("status %d ready %v, want %d", code, got.Ready, wantCode)
			}
			if len(got.Reasons) != len(tc.want) {
				t.Fatalf("reasons %+v, want %+v", got.Reasons, tc.want)
			}
			for i := range tc.want {
				if got.Reasons[i] != tc.want[i] {
					t.Errorf("reason %d = %+v, want %+v", i, got.Reasons[i], tc.want[i])
				}
			}
			if fmt.Sprint(got.Warnings) != fmt.Sprint(tc.warn) {
				t.Errorf("warnings %+v, want %+v", got.Warnings, tc.warn)
			}
			for _, u := range tc.urls {
				if strings.Contains(body, strings.TrimPrefix(u, "http://")) {
					t.Errorf("/ready names worker %s: %s", u, body)
				}
			}
			if hc, _ := probe(t, s, http.MethodHead, pathReady); hc != code {
				t.Errorf("HEAD /ready %d, GET %d", hc, code)
			}
		})
	}
}

// GET /live is 200 whatever the fleet does and while draining; 503 only once the listener is
// closing.
func TestLive(t *testing.T) {
	cases := []struct {
		phase int32
		want  int
	}{
		{phaseServing, http.StatusOK},
		{phaseDraining, http.StatusOK},
		{phaseStopping, http.StatusServiceUnavailable},
	}
	s := probeServer(t, nil, "http://127.0.0.1:1") // no routable worker: still live
	for _, tc := range cases {
		s.state.Store(tc.phase)
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			if code, body := probe(t, s, method, pathLive); code != tc.want {
				t.Errorf("phase %d: %s /live = %d %s, want %d", tc.phase, method, code, body, tc.want)
			}
		}
	}
}

// The probes need no key when the client listener has them (the kubelet sends none), and
// CORS does not change their answer; the API beside them still asks for the key.
func TestProbesNeedNoKey(t *testing.T) {
	up := startSim(t, fastSim()).srv.URL
	s := probeServer(t, func(c *configs.Config, _ *Options) {
		c.Auth.APIKeys = []string{"sk-client"}
		c.CORS.AllowedOrigins = []string{"https://app.example"}
	}, up)
	for _, path := range []string{pathLive, pathReady} {
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			if code, body := probe(t, s, method, path); code != http.StatusOK {
				t.Errorf("%s %s without a key: %d %s", method, path, code, body)
			}
		}
	}
	if code, _ := probe(t, s, http.MethodGet, "/v1/models"); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/models without a key: %d, want 401", code)
	}
}
