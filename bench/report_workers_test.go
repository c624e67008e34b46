package bench

import (
	"bytes"
	"strings"
	"testing"
)

// TestReportWorkerLoad: runs on the same workers are compared worker by worker; runs on
// different worker addresses (fleets side by side) are compared busiest worker first.
func TestReportWorkerLoad(t *testing.T) {
	run := func(label string, dist map[string]int) *Run {
		return &Run{Summary: &Summary{Label: label, WorkerDistribution: dist, RequestCount: 1}}
	}
	tests := []struct {
		name       string
		runs       []*Run
		want, nope []string
	}{
		{"same workers", []*Run{
			run("rr", map[string]int{"http://127.0.0.1:1": 5, "http://127.0.0.1:2": 5}),
			run("kv", map[string]int{"http://127.0.0.1:1": 9, "http://127.0.0.1:2": 1}),
		}, []string{">127.0.0.1:1<", ">127.0.0.1:2<", "kv: 9"}, []string{"busiest"}},
		{"different workers", []*Run{
			run("rr", map[string]int{"http://127.0.0.1:1": 5, "http://127.0.0.1:2": 5}),
			run("kv", map[string]int{"http://127.0.0.1:201": 1, "http://127.0.0.1:202": 9}),
		}, []string{"busiest #1", "busiest #2", "busiest #1 kv: 9", "busiest #2 kv: 1"}, []string{">127.0.0.1:201<"}},
	}
	for _, tc := range tests {
		var b bytes.Buffer
		if err := WriteReport(&b, "t", tc.runs); err != nil {
			t.Fatal(err)
		}
		h := b.String()
		for _, w := range tc.want {
			if !strings.Contains(h, w) {
				t.Errorf("%s: report lacks %q", tc.name, w)
			}
		}
		for _, n := range tc.nope {
			if strings.Contains(h, n) {
				t.Errorf("%s: report has %q", tc.name, n)
			}
		}
	}
}
