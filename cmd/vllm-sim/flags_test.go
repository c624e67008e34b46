package main

import (
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/sim"
)

func parse(args ...string) (sim.Options, serveConfig, error) {
	var o sim.Options
	var c serveConfig
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	finish := newServeFlags(fs, &o, &c)
	if err := fs.Parse(args); err != nil {
		return o, c, err
	}
	return o, c, finish()
}

func TestServeFlags(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		check func(sim.Options, serveConfig) bool
		err   string
	}{
		{"vllm names", []string{"--port", "8101", "--served-model-name", "Qwen/Qwen3-0.6B", "--max-num-seqs", "8", "--block-size", "32", "--data-parallel-size", "2"},
			func(o sim.Options, c serveConfig) bool {
				return c.port == 8101 && o.ServedModelName == "Qwen/Qwen3-0.6B" && o.MaxNumSeqs == 8 && o.BlockSize == 32 && o.DataParallelSize == 2
			}, ""},
		{"kv events config", []string{"--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv-events","buffer_steps":100,"hwm":10}`},
			func(o sim.Options, _ serveConfig) bool {
				k := o.KVEvents
				return k.EnableKVCacheEvents && k.Publisher == "zmq" && k.Endpoint == "tcp://*:5557" && k.ReplayEndpoint == "tcp://*:5558" && k.Topic == "kv-events" && k.BufferSteps == 100 && k.HWM == 10
			}, ""},
		{"encodings", []string{"--kv-events-layout", "array", "--kv-events-hashes", "bytes", "--kv-events-replay-format", "no-topic"},
			func(o sim.Options, _ serveConfig) bool {
				return o.Encoding.Layout == indexers.LayoutArray && o.Encoding.BytesHashes && o.Encoding.Replay == indexers.ReplayNoTopic
			}, ""},
		{"no prefix caching", []string{"--no-enable-prefix-caching"}, func(o sim.Options, _ serveConfig) bool { return o.DisablePrefixCaching }, ""},
		{"lora modules", []string{"--lora-modules", "sql-lora=/a", "--lora-modules", "b=/b"},
			func(o sim.Options, _ serveConfig) bool { return strings.Join(o.LoRAModules, ",") == "sql-lora,b" }, ""},
		{"default profile is the mocker", nil,
			func(o sim.Options, _ serveConfig) bool { return o.Perf == sim.DefaultPerfModel() }, ""},
		{"calibrated profile", []string{"--profile", "llama3.1-8b-bf16-h200"},
			func(o sim.Options, _ serveConfig) bool {
				p, _ := sim.PerfProfile("llama3.1-8b-bf16-h200")
				return o.Perf == p && p != sim.DefaultPerfModel()
			}, ""},
		{"coefficient flag overrides the profile", []string{"--sim-decode-c", "7", "--profile", "llama3.1-8b-bf16-h200"},
			func(o sim.Options, _ serveConfig) bool {
				p, _ := sim.PerfProfile("llama3.1-8b-bf16-h200")
				p.DecodeC = 7
				return o.Perf == p
			}, ""},
		{"unknown profile", []string{"--profile", "gpt-5"}, nil, "unknown timing profile"},
		{"unknown kv key", []string{"--kv-events-config", `{"enable":true}`}, nil, "unknown field"},
		{"bad layout", []string{"--kv-events-layout", "xml"}, nil, "unknown kv-event layout"},
		{"bad cpu events", []string{"--cpu-events", "some"}, nil, "--cpu-events"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, c, err := parse(tc.args...)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(o, c) {
				t.Errorf("options %+v / %+v", o, c)
			}
		})
	}
}
