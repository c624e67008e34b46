package configs

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// loadYAML writes file to a temporary config and loads it with env and flags.
func loadYAML(t *testing.T, file string, env map[string]string, args ...string) (Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	return Load(append([]string{"--config", path}, args...), envOf(env), io.Discard)
}

// An entry inherits every top-level key it leaves out (after env and flags), overrides only the
// router and sessions keys it names, and resolves router.policy auto from its own workers.
func TestModelsInheritAndOverride(t *testing.T) {
	tokA, tokB := tokenizerDir(t), tokenizerDir(t)
	file := `
tokenizer: ` + tokA + `
block_size: 32
router:
  prefill_weight: 2
  decode_weight: 0.5
sessions:
  affinity_blocks: 7
models:
  - name: a
    aliases: [a-latest]
    workers:
      - url: http://127.0.0.1:9001/
        kv_events: tcp://127.0.0.1:5557
  - name: b
    tokenizer: ` + tokB + `
    block_size: 16
    workers:
      - url: http://127.0.0.1:9002
    router:
      decode_weight: 0
      policy: least_loaded
    sessions:
      affinity_blocks: 0
`
	c, err := loadYAML(t, file, map[string]string{"KVGATE_ROUTER_PREFILL_WEIGHT": "3"})
	if err != nil {
		t.Fatal(err)
	}
	pools := c.Pools()
	if len(pools) != 2 {
		t.Fatalf("%d pools, want 2", len(pools))
	}
	a, b := pools[0], pools[1]
	checks := []struct {
		name      string
		got, want any
	}{
		{"a.model", a.Model, "a"},
		{"a.names", strings.Join(a.Names(), ","), "a,a-latest"},
		{"a.tokenizer", a.Tokenizer, tokA},
		{"a.block_size", a.BlockSize, 32},
		{"a.worker url", a.Workers[0].URL, "http://127.0.0.1:9001"},
		{"a.dp_size", a.Workers[0].DPSize, 1},
		{"a.policy (auto, kv_events)", a.Router.Policy, "kv"},
		{"a.prefill_weight (env over file)", a.Router.PrefillWeight, 3.0},
		{"a.decode_weight", a.Router.DecodeWeight, 0.5},
		{"a.affinity", a.Sessions.AffinityBlocks, 7},
		{"b.tokenizer", b.Tokenizer, tokB},
		{"b.block_size", b.BlockSize, 16},
		{"b.policy", b.Router.Policy, "least_loaded"},
		{"b.prefill_weight", b.Router.PrefillWeight, 3.0},
		{"b.decode_weight (zero is a value)", b.Router.DecodeWeight, 0.0},
		{"b.affinity", b.Sessions.AffinityBlocks, 0},
		{"b.key", b.Key, "models[1]"},
	}
	for _, tc := range checks {
		if fmt.Sprint(tc.got) != fmt.Sprint(tc.want) {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

// A models: entry's discovery is its own, with discoveryconfig's defaults for the keys it
// leaves out; the other entries have none.
func TestModelsDiscovery(t *testing.T) {
	c, err := loadYAML(t, `
tokenizer: `+tokenizerDir(t)+`
models:
  - name: a
    discovery: {kubernetes: {namespace: ns, service: vllm-a}}
  - name: b
    workers: [{url: "http://127.0.0.1:9002"}]
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := c.Pools()[0], c.Pools()[1]
	if !a.Discovery.Kubernetes.Enabled() || a.Discovery.Kubernetes.Service != "vllm-a" || a.Discovery.Kubernetes.PortName != "http" || b.Discovery.Enabled() {
		t.Errorf("a %+v, b %+v", a.Discovery, b.Discovery)
	}
}

// The single-model form is one pool: the top-level config itself.
func TestSingleModelIsOnePool(t *testing.T) {
	c, err := Load([]string{"--model", "m", "--worker", "http://127.0.0.1:8101"}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	pools := c.Pools()
	if len(pools) != 1 || pools[0].Model != "m" || pools[0].Key != "" || len(pools[0].Workers) != 1 ||
		pools[0].Router.Policy != "round_robin" {
		t.Fatalf("pools = %+v", pools)
	}
}

func TestModelsValidation(t *testing.T) {
	tok := tokenizerDir(t)
	cases := []struct {
		name, file string
		args       []string
		want       []string
	}{
		{"mixed forms", `
model: x
models:
  - name: a
    workers: [{url: "http://127.0.0.1:9001"}]
`, nil, []string{"model: is set together with models"}},
		{"flag worker with models", `
models:
  - name: a
    workers: [{url: "http://127.0.0.1:9001"}]
`, []string{"--worker", "http://127.0.0.1:9009"}, []string{"workers: are set together with models"}},
		{"entry problems keyed by entry", `
models:
  - name: ""
    workers: []
    block_size: 0
  - name: b
    tokenizer: /nonexistent/tok
    workers: [{url: "ftp://x"}]
    router: {policy: nope}
`, nil, []string{
			"models[0].name: is required",
			"models[0].workers: at least one worker",
			"models[0].block_size: must be a positive",
			`models[1].tokenizer: "/nonexistent/tok" is not a folder`,
			`models[1].workers[0].url: "ftp://x" must start with http://`,
			`models[1].router.policy: unknown policy "nope"`,
		}},
		{"names and workers unique", `
tokenizer: ` + tok + `
models:
  - name: a
    aliases: [b]
    workers: [{url: "http://127.0.0.1:9001"}]
  - name: b
    workers: [{url: "http://127.0.0.1:9001/"}]
`, nil, []string{
			`models[1].name: "b" is also models[0].aliases[0]`,
			`models[1].workers[0].url: "http://127.0.0.1:9001" is also models[0].workers[0].url`,
		}},
		{"unknown key in an entry", `
models:
  - name: a
    wrkers: []
`, nil, []string{"field wrkers not found"}},
		{"unknown key in an override", `
models:
  - name: a
    workers: [{url: "http://127.0.0.1:9001"}]
    router: {prefil_weight: 1}
`, nil, []string{"field prefil_weight not found"}},
		{"router values checked per entry", `
models:
  - name: a
    workers: [{url: "http://127.0.0.1:9001"}]
    router: {prefill_weight: -1}
`, nil, []string{"models[0].router.prefill_weight"}},
		{"identity headers per entry", `
models:
  - name: a
    workers: [{url: "http://127.0.0.1:9001"}]
    sessions: {headers: [x-my-session]}
`, nil, []string{"models[0].sessions: headers, parent_headers and final_headers are read before the model is known"}},
		{"several models and a cluster", `
cluster: {nats_url: "nats://127.0.0.1:4222"}
models:
  - name: a
    workers: [{url: "http://127.0.0.1:9001"}]
  - name: b
    workers: [{url: "http://127.0.0.1:9002"}]
`, nil, []string{"models: several models with cluster"}},
		{"discovery per entry", `
models:
  - name: a
    discovery: {dns: {name: vllm-a.internal, port: 8000}}
  - name: b
    workers: [{url: "http://127.0.0.1:9002"}]
`, nil, nil},
		{"top-level discovery with models", `
discovery: {dns: {name: vllm.internal, port: 8000}}
models:
  - name: a
    workers: [{url: "http://127.0.0.1:9001"}]
`, nil, []string{"discovery: is set together with models"}},
		{"hub id accepted", `
models:
  - name: a
    tokenizer: Qwen/Qwen3-0.6B
    workers: [{url: "http://127.0.0.1:9001"}]
`, nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadYAML(t, tc.file, nil, tc.args...)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestIsHubModelID(t *testing.T) {
	cases := map[string]bool{
		"Qwen/Qwen3-0.6B": true, "org/name": true, "meta-llama/Llama-3.1-8B": true,
		"name": false, "a/b/c": false, "../x": false, "/abs/path": false, "org/..": false, "org/": false, "./x": false,
	}
	for id, want := range cases {
		if got := IsHubModelID(id); got != want {
			t.Errorf("IsHubModelID(%q) = %v, want %v", id, got, want)
		}
	}
}
