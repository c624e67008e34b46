package sim

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvgate/kvgate/router"
)

// TestCacheConfigInfo pins vllm:cache_config_info as vLLM exports it (PrometheusStatLogger.
// log_metrics_info): a gauge fixed at 1 per engine (DP rank), labelled with CacheConfig fields
// rendered by Python's str() plus "engine", without model_name; and the gateway's metrics
// scraper reads each rank's GPU block count from it.
func TestCacheConfigInfo(t *testing.T) {
	tests := []struct {
		name      string
		o         Options
		cpuBlocks string
		prefix    string
	}{
		{"one engine, no host tier", Options{ServedModelName: "m"}, "None", "True"},
		{"two engines, host tier, no prefix caching",
			Options{ServedModelName: "m", DataParallelSize: 2, NumGPUBlocks: 1000, NumCPUBlocks: 3000, BlockSize: 32, DisablePrefixCaching: true},
			"3000", "False"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, base := startWorker(t, tc.o)
			resp, err := http.Get(base + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			parser := expfmt.NewTextParser(model.UTF8Validation)
			families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			fam := families["vllm:cache_config_info"]
			if fam == nil {
				t.Fatal("vllm:cache_config_info missing")
			}
			o, err := tc.o.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			if len(fam.GetMetric()) != o.DataParallelSize {
				t.Fatalf("%d series, want one per engine (%d)", len(fam.GetMetric()), o.DataParallelSize)
			}
			seen := map[string]bool{}
			for _, m := range fam.GetMetric() {
				if m.GetGauge().GetValue() != 1 {
					t.Errorf("value %v, want 1", m.GetGauge().GetValue())
				}
				got := map[string]string{}
				for _, lp := range m.GetLabel() {
					got[lp.GetName()] = lp.GetValue()
				}
				seen[got["engine"]] = true
				want := map[string]string{"block_size": itoa(o.BlockSize), "num_gpu_blocks": itoa(o.NumGPUBlocks),
					"num_cpu_blocks": tc.cpuBlocks, "enable_prefix_caching": tc.prefix, "cache_dtype": "auto"}
				for k, v := range want {
					if got[k] != v {
						t.Errorf("label %s = %q, want %q", k, got[k], v)
					}
				}
				if _, ok := got["model_name"]; ok {
					t.Error("vLLM's cache_config_info has no model_name label")
				}
			}
			for r := range o.DataParallelSize {
				if !seen[itoa(r)] {
					t.Errorf("no series for engine %d", r)
				}
			}
			parsed, err := router.ParseWorkerMetrics(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			for r := range o.DataParallelSize {
				if parsed[r].NumGPUBlocks != o.NumGPUBlocks {
					t.Errorf("gateway read %d GPU blocks for rank %d, want %d", parsed[r].NumGPUBlocks, r, o.NumGPUBlocks)
				}
			}
		})
	}
}
