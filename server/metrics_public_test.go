package server

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/configs"
)

// The per-worker series (here the KV-event sequence number a forged publisher would need, and
// the per-worker request counter) are on the client listener's /metrics only with
// metrics.detailed_public; the admin listener's /metrics always has them, and the aggregate
// series stay public.
func TestDetailedMetricsPublic(t *testing.T) {
	for _, detailed := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "detailed_public"}[detailed], func(t *testing.T) {
			a := startSim(t, fastSim())
			g := startGateway(t, func(c *configs.Config) { c.Metrics.DetailedPublic = detailed }, a.srv.URL)
			seq := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvgate_kv_last_seq", Help: "test"}, []string{"worker", "dp_rank"})
			seq.WithLabelValues(a.srv.URL, "0").Set(41)
			g.Metrics().MustRegister(seq)
			if _, err := g.client().CreateChatCompletion(context.Background(), chatReq(false, 2)); err != nil {
				t.Fatal(err)
			}
			perWorker := []string{`kvgate_kv_last_seq{dp_rank="0",worker="` + a.srv.URL + `"} 41`,
				`kvgate_worker_requests_total{code="200",worker="` + a.srv.URL + `"}`}
			public, admin := scrape(t, g), scrapeAdmin(t, g)
			for _, s := range perWorker {
				if got := strings.Contains(public, s); got != detailed {
					t.Errorf("client /metrics has %s: %v, want %v", s, got, detailed)
				}
				if !strings.Contains(admin, s) {
					t.Errorf("admin /metrics lacks %s", s)
				}
			}
			if !strings.Contains(public, `kvgate_requests_total{code="200",endpoint="/v1/chat/completions"}`) {
				t.Error("an aggregate series left the client /metrics")
			}
		})
	}
}
