package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/sim"
)

// TestFleetConfigLoads: the config the fleet writes is valid for kvgate and names every
// worker's URL and event endpoints.
func TestFleetConfigLoads(t *testing.T) {
	tests := []struct {
		name   string
		events bool
		dp     int
	}{{"events", true, 1}, {"no events, dp 2", false, 2}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte("{}"), 0o644); err != nil {
				t.Fatal(err)
			}
			y := fleetConfig(fleetLayout{o: sim.Options{ServedModelName: "Qwen/Qwen3-0.6B", Model: dir, BlockSize: 16, DataParallelSize: tc.dp},
				host: "127.0.0.1", n: 3, basePort: 8101, eventsBase: 5557, events: tc.events, listen: "127.0.0.1:8000", policy: "round_robin"})
			c := configs.Default()
			if err := configs.ParseYAML([]byte(y), &c); err != nil {
				t.Fatalf("%v\n%s", err, y)
			}
			if err := c.Validate(); err != nil {
				t.Fatalf("%v\n%s", err, y)
			}
			if c.Model != "Qwen/Qwen3-0.6B" || c.Tokenizer != dir || c.BlockSize != 16 || len(c.Workers) != 3 {
				t.Fatalf("config %+v", c)
			}
			w := c.Workers[2]
			if w.URL != "http://127.0.0.1:8103" || w.DPSize != tc.dp {
				t.Errorf("worker 2 = %+v", w)
			}
			if tc.events && (w.KVEvents != "tcp://127.0.0.1:5577" || w.Replay != "tcp://127.0.0.1:5582") {
				t.Errorf("worker 2 endpoints = %+v", w)
			}
			if !tc.events && (w.KVEvents != "" || w.Replay != "") {
				t.Errorf("worker 2 has endpoints without events: %+v", w)
			}
		})
	}
}
