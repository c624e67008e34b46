package configs

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// The documented example must parse strictly and show the built-in default for every key
// it does not set deliberately, so the file stays an honest reference.
func TestExampleDocumentsDefaults(t *testing.T) {
	data, err := os.ReadFile("kvgate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var fromFile Config
	if err := ParseYAML(data, &fromFile); err != nil {
		t.Fatalf("example does not parse: %v", err)
	}
	def := Default()
	for _, f := range Fields() {
		switch f.Key {
		case "model", "tokenizer", "workers", "admin_listen":
			continue // example values, no default
		}
		if got, want := f.Value(&fromFile).String(), f.Value(&def).String(); got != want {
			t.Errorf("%s: example says %q, default is %q", f.Key, got, want)
		}
	}
	fromFile.Tokenizer = tokenizerDir(t) // the example's folder need not exist here
	fromFile.normalize()
	if err := fromFile.Validate(); err != nil {
		t.Errorf("example does not validate: %v", err)
	}
}

func TestPrecedenceFileEnvFlags(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	file := `
model: file-model
workers:
  - url: http://127.0.0.1:9001/
  - url: http://127.0.0.1:9002
    dp_size: 2
router:
  policy: random
proxy:
  max_retries: 1
`
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"KVGATE_CONFIG":             path,
		"KVGATE_ROUTER_POLICY":      "least_loaded",
		"KVGATE_PROXY_MAX_RETRIES":  "3",
		"KVGATE_HEALTH_INTERVAL":    "250ms",
		"KVGATE_SESSIONS_HEADERS":   "X-A, X-B",
		"KVGATE_PROXY_DIAL_TIMEOUT": "", // empty = unset
	}
	c, err := Load([]string{"--proxy-max-retries", "4", "--listen", "127.0.0.1:0"}, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"model from file", c.Model, "file-model"},
		{"policy env over file", c.Router.Policy, "least_loaded"},
		{"retries flag over env", c.Proxy.MaxRetries, 4},
		{"interval from env", c.Health.Interval.D(), 250 * time.Millisecond},
		{"dial default kept", c.Proxy.DialTimeout.D(), 5 * time.Second},
		{"listen flag", c.Listen, "127.0.0.1:0"},
		{"headers env list", strings.Join(c.Sessions.Headers, "|"), "X-A|X-B"},
		{"worker 0 trailing slash trimmed", c.Workers[0].URL, "http://127.0.0.1:9001"},
		{"worker 0 dp_size defaulted", c.Workers[0].DPSize, 1},
		{"worker 1 dp_size", c.Workers[1].DPSize, 2},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("%s: got %v, want %v", ck.name, ck.got, ck.want)
		}
	}
}

// tokenizerDir returns a folder that passes the tokenizer check (a tokenizer.json exists).
func tokenizerDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestQuickForm(t *testing.T) {
	args := []string{"--model", "m", "--tokenizer", tokenizerDir(t), "--worker", "http://127.0.0.1:8101",
		"--worker", "http://127.0.0.1:8102,kv_events=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558,dp_size=2"}
	c, err := Load(args, envOf(map[string]string{"KVGATE_WORKERS": "http://ignored:1"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Workers) != 2 {
		t.Fatalf("workers = %+v, want the two flags (flags replace env)", c.Workers)
	}
	want := Worker{URL: "http://127.0.0.1:8102", KVEvents: "tcp://127.0.0.1:5557", Replay: "tcp://127.0.0.1:5558", DPSize: 2}
	if c.Workers[1] != want {
		t.Errorf("worker 1 = %+v, want %+v", c.Workers[1], want)
	}
	// router.policy auto: a worker has kv_events, so kv.
	if c.Router.Policy != "kv" || c.BlockSize != 16 {
		t.Errorf("defaults lost: %+v", c)
	}
}

func TestEnvWorkersList(t *testing.T) {
	c, err := Load(nil, envOf(map[string]string{"KVGATE_MODEL": "m", "KVGATE_WORKERS": "http://a:1; http://b:2,dp_size=4"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Workers) != 2 || c.Workers[1].URL != "http://b:2" || c.Workers[1].DPSize != 4 {
		t.Errorf("workers = %+v", c.Workers)
	}
}

func TestEveryFieldHasFlagAndEnv(t *testing.T) {
	seenFlag, seenEnv := map[string]bool{}, map[string]bool{}
	for _, f := range Fields() {
		if seenFlag[f.Flag] || seenEnv[f.Env] {
			t.Errorf("%s: duplicate flag or env name", f.Key)
		}
		seenFlag[f.Flag], seenEnv[f.Env] = true, true
		if !strings.HasPrefix(f.Env, "KVGATE_") || f.Help == "" {
			t.Errorf("%s: env %q help %q", f.Key, f.Env, f.Help)
		}
	}
	// Every YAML key of the example must be reachable through a field.
	for _, k := range []string{"listen", "model", "tokenizer", "block_size", "workers", "router.policy",
		"proxy.max_body_bytes", "health.failure_threshold", "shutdown_timeout", "log_level"} {
		found := false
		for _, f := range Fields() {
			found = found || f.Key == k
		}
		if !found {
			t.Errorf("no field for %s", k)
		}
	}
}

func TestValidationMessages(t *testing.T) {
	base := []string{"--model", "m", "--worker", "http://127.0.0.1:8101"}
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no model", []string{"--worker", "http://x:1"}, nil, "model: is required"},
		{"no workers", []string{"--model", "m"}, nil, "workers: at least one worker"},
		{"bad scheme", []string{"--model", "m", "--worker", "ftp://x:1"}, nil, `workers[0].url: "ftp://x:1" must start with http://`},
		{"v1 suffix", []string{"--model", "m", "--worker", "http://x:1/v1"}, nil, "without /v1"},
		{"duplicate", []string{"--model", "m", "--worker", "http://x:1", "--worker", "http://x:1/"}, nil, "workers[1].url: \"http://x:1\" is the same worker as workers[0]"},
		{"bad kv endpoint", []string{"--model", "m", "--worker", "http://x:1,kv_events=tcp://*:5557"}, nil, "workers[0].kv_events"},
		{"replay without events", []string{"--model", "m", "--worker", "http://x:1,replay=tcp://x:5558"}, nil, "workers[0].replay: is set but kv_events is not"},
		{"collector without workers", append(base, "--kv-events-listen", "tcp://*:5557"), nil, "kv_events.listen: is set but no worker is fed through it"},
		{"collector ephemeral port", []string{"--model", "m", "--worker", "http://x:1,topic=kv@x", "--kv-events-listen", "tcp://*:0"}, nil, `kv_events.listen: "tcp://*:0" must be tcp://host:port with a fixed port`},
		{"collector duplicate topic", []string{"--model", "m", "--worker", "http://x:1,topic=kv@x", "--worker", "http://y:1,topic=kv@x", "--kv-events-listen", "tcp://*:5557"}, nil, `workers[1].topic: "kv@x" is also workers[0]'s`},
		{"max msg size", append(base, "--kv-events-max-msg-size", "10"), nil, "kv_events.max_msg_size: must be at least 1KiB, got 10"},
		{"settle", append(base, "--kv-events-settle", "0s"), nil, "kv_events.settle: must be a positive duration"},
		{"negative dp", []string{"--model", "m", "--worker", "http://x:1,dp_size=-1"}, nil, "workers[0].dp_size: must be at least 1"},
		{"unknown attr", []string{"--model", "m", "--worker", "http://x:1,foo=1"}, nil, `unknown attribute "foo"`},
		{"block size", append(base, "--block-size", "0"), nil, "block_size: must be a positive"},
		{"listen", append(base, "--listen", "nope"), nil, `listen: "nope" is not host:port`},
		{"retries", append(base, "--proxy-max-retries", "99"), nil, "proxy.max_retries: must be between 0 and 16"},
		{"body limit text", append(base, "--proxy-max-body-bytes", "lots"), nil, `--proxy-max-body-bytes: "lots" is not a byte size`},
		{"duration env", base, map[string]string{"KVGATE_HEALTH_INTERVAL": "5"}, `KVGATE_HEALTH_INTERVAL (health.interval): "5" is not a duration`},
		{"threshold", append(base, "--health-failure-threshold", "0"), nil, "health.failure_threshold: must be at least 1"},
		{"log level", append(base, "--log-level", "loud"), nil, `log_level: "loud" is not one of`},
		{"header name", append(base, "--sessions-headers", "X Bad"), nil, `sessions.headers[0]: "X Bad" is not a valid HTTP header name`},
		{"tokenizer missing", append(base, "--tokenizer", "/nonexistent/tok"), nil, `tokenizer: "/nonexistent/tok" is not a folder`},
		{"int flag", append(base, "--block-size", "x"), nil, `--block-size: "x" is not an integer`},
		{"unknown policy", append(base, "--router-policy", "best"), nil, `router.policy: unknown policy "best" (known: auto, round_robin, random, least_loaded, kv, kv_no_load, kv_blocks)`},
		{"kv needs tokenizer", append(base, "--router-policy", "kv_no_load"), nil, "tokenizer: is required by router.policy kv_no_load: "},
		{"auto kv needs tokenizer", []string{"--model", "m", "--worker", "http://x:1", "--worker", "http://y:1,kv_events=tcp://y:5557"}, nil,
			"tokenizer: is required by router.policy kv (the default because workers[1] has kv_events)"},
		{"negative weight", append(base, "--router-decode-weight", "-1"), nil, "router.decode_weight: must be a finite number >= 0, got -1"},
		{"credit above one", append(base, "--router-g2-credit", "1.5"), nil, "router.g2_credit: must be between 0 and 1, got 1.5"},
		{"float text", append(base, "--router-temperature", "warm"), nil, `--router-temperature: "warm" is not a number`},
		{"nan", base, map[string]string{"KVGATE_ROUTER_PREFILL_WEIGHT": "NaN"}, `KVGATE_ROUTER_PREFILL_WEIGHT (router.prefill_weight): "NaN" is not a number`},
		{"busy kv usage", append(base, "--router-busy-kv-usage", "2"), nil, "router.busy_kv_usage: must be between 0 and 1"},
		{"busy waiting", append(base, "--router-busy-waiting-requests", "-3"), nil, "router.busy_waiting_requests: must be >= 0 (0 turns it off), got -3"},
		{"metrics interval", append(base, "--router-metrics-interval", "0s"), nil, "router.metrics_interval: must be a positive duration"},
		{"max age below interval", append(base, "--router-metrics-interval", "10s"), nil, "router.metrics_max_age: (5s) must be at least router.metrics_interval (10s)"},
		{"approx ttl", append(base, "--router-approximate-ttl", "-1s"), nil, "router.approximate.ttl: must be a positive duration, got -1s"},
		{"approx budget", append(base, "--router-approximate-block-budget", "0"), nil, "router.approximate.block_budget: must be at least 1 block, got 0"},
		{"hold min blocks", append(base, "--router-hold-min-blocks", "0"), nil, "router.hold.min_blocks: must be >= 1, got 0"},
		{"hold margin", append(base, "--router-hold-margin", "-1s"), nil, "router.hold.margin: must be >= 0, got -1s"},
		{"max sessions", append(base, "--sessions-max-sessions", "0"), nil, "sessions.max_sessions: must be at least 1, got 0"},
		{"parent mode", append(base, "--sessions-parent-mode", "uncle"), nil, `sessions.parent_mode: "uncle" is not one of parent, lineage_root, sibling_group`},
		{"affinity", append(base, "--sessions-affinity-blocks", "-2"), nil, "sessions.affinity_blocks: must be a finite number >= 0 (0 turns affinity off), got -2"},
		{"bool env", base, map[string]string{"KVGATE_SESSIONS_PARENT_AWARE": "maybe"}, `KVGATE_SESSIONS_PARENT_AWARE (sessions.parent_aware): "maybe" is not a boolean`},
		{"final header", append(base, "--sessions-final-headers", "X:Y"), nil, `sessions.final_headers[0]: "X:Y" is not a valid HTTP header name`},
		{"group targets", append(base, "--sessions-group-targets", "0"), nil, "sessions.group_targets: must be at least 1, got 0"},
		{"chat template file", append(base, "--chat-template", "/nonexistent.jinja"), nil, `chat_template: "/nonexistent.jinja" is not a readable file`},
		{"template kwargs", append(base, "--default-chat-template-kwargs", "[1]"), nil, `default_chat_template_kwargs: "[1]" is not a JSON object`},
		{"positional", append(base, "extra"), nil, `unexpected argument "extra"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.args, envOf(tc.env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestYAMLErrors(t *testing.T) {
	cases := []struct {
		name, doc, want string
	}{
		{"unknown key", "model: m\nrouterr:\n  policy: x\n", "field routerr not found"},
		{"bad duration", "health:\n  interval: soon\n", `line 2: "soon" is not a duration`},
		{"bad size", "proxy:\n  max_body_bytes: [1]\n", "line 2: expected a byte size"},
		{"wrong type", "block_size: sixteen\n", "cannot unmarshal"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			err := ParseYAML([]byte(tc.doc), &c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestByteSize(t *testing.T) {
	cases := []struct {
		in   string
		want int64
	}{{"1024", 1024}, {"512KiB", 512 << 10}, {"32MiB", 32 << 20}, {"2GB", 2e9}, {"7B", 7}}
	for _, tc := range cases {
		var b ByteSize
		if err := b.Set(tc.in); err != nil || int64(b) != tc.want {
			t.Errorf("%s: got %d, %v; want %d", tc.in, b, err, tc.want)
		}
	}
	var b ByteSize
	if err := b.Set("-1"); err == nil {
		t.Error("negative size accepted")
	}
}

func TestHelp(t *testing.T) {
	var sb strings.Builder
	_, err := Load([]string{"-h"}, envOf(nil), &sb)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"--worker", "KVGATE_PROXY_MAX_RETRIES", "default auto", "--config",
		"--router-g2-credit", "KVGATE_ROUTER_APPROXIMATE_TTL", "default 0.75", "--sessions-parent-aware", "default true"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("usage lacks %q", want)
		}
	}
}

// router.policy auto (the default, also an empty value) is kv exactly when a worker has
// kv_events; an explicit policy is kept.
func TestPolicyAuto(t *testing.T) {
	tok := tokenizerDir(t)
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no events", []string{"--worker", "http://a:1"}, nil, "round_robin"},
		{"events on one worker", []string{"--worker", "http://a:1", "--worker", "http://b:1,kv_events=tcp://b:5557"}, nil, "kv"},
		{"explicit auto", []string{"--worker", "http://a:1,kv_events=tcp://a:5557", "--router-policy", "auto"}, nil, "kv"},
		{"empty env is unset", []string{"--worker", "http://a:1,kv_events=tcp://a:5557"}, map[string]string{"KVGATE_ROUTER_POLICY": ""}, "kv"},
		{"explicit policy kept", []string{"--worker", "http://a:1,kv_events=tcp://a:5557", "--router-policy", "least_loaded"}, nil, "least_loaded"},
		{"kv without events", []string{"--worker", "http://a:1", "--router-policy", "kv"}, nil, "kv"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(append([]string{"--model", "m", "--tokenizer", tok}, tc.args...), envOf(tc.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if c.Router.Policy != tc.want {
				t.Errorf("policy = %q, want %q", c.Router.Policy, tc.want)
			}
		})
	}
}

// The KV and session knobs are reachable from YAML, env and flags (a bare boolean flag means true).
func TestKVAndSessionKeys(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	doc := `
model: m
workers:
  - url: http://a:1
    kv_events: tcp://a:5557
    topic: kv-events
router:
  policy: kv_no_load
  g2_credit: 0.5
  approximate:
    ttl: 30s
  hold:
    min_blocks: 32
sessions:
  parent_aware: false
  parent_mode: sibling_group
`
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KVGATE_ROUTER_TEMPERATURE": "0.25", "KVGATE_SESSIONS_MAX_SESSIONS": "99"}
	args := []string{"--config", path, "--tokenizer", tokenizerDir(t), "--sessions-parent-aware", "--router-approximate-block-budget", "512",
		"--router-hold-margin", "1s"}
	c, err := Load(args, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"policy", c.Router.Policy, "kv_no_load"},
		{"g2 credit from file", c.Router.G2Credit, 0.5},
		{"g3 credit default", c.Router.G3Credit, 0.25},
		{"temperature from env", c.Router.Temperature, 0.25},
		{"ttl from file", c.Router.Approximate.TTL.D(), 30 * time.Second},
		{"budget from flag", c.Router.Approximate.BlockBudget, 512},
		{"hold min blocks from file", c.Router.Hold.MinBlocks, 32},
		{"hold margin from flag", c.Router.Hold.Margin.D(), time.Second},
		{"hold on by default", c.Router.Hold.Enabled, true},
		{"bare bool flag", c.Sessions.ParentAware, true},
		{"parent mode", c.Sessions.ParentMode, "sibling_group"},
		{"max sessions env", c.Sessions.MaxSessions, 99},
		{"topic", c.Workers[0].Topic, "kv-events"},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("%s: got %v, want %v", ck.name, ck.got, ck.want)
		}
	}
	w, err := ParseWorkerSpec(c.Workers[0].Spec())
	w.DPSize = max(w.DPSize, 1) // Spec omits dp_size 1; normalize fills it in
	if err != nil || w != c.Workers[0] {
		t.Errorf("spec round trip: %+v, %v; want %+v", w, err, c.Workers[0])
	}
}

// Collector mode: workers with a topic and no kv_events are fed through kv_events.listen, may
// name their replay socket, and make router.policy auto pick kv.
func TestCollectorWorkers(t *testing.T) {
	args := []string{"--model", "m", "--tokenizer", tokenizerDir(t), "--kv-events-listen", "tcp://*:5557",
		"--worker", "http://10.0.0.1:8000,topic=kv@10.0.0.1:8000@m,replay=tcp://10.0.0.1:5558,dp_size=2",
		"--worker", "http://10.0.0.2:8000"}
	c, err := Load(args, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"listen", c.KVEvents.Listen, "tcp://*:5557"},
		{"first is a collector worker", c.CollectorWorker(c.Workers[0]), true},
		{"second is not", c.CollectorWorker(c.Workers[1]), false},
		{"auto policy", c.Router.Policy, "kv"},
		{"max msg size default", int64(c.KVEvents.MaxMsgSize), int64(64 << 20)},
		{"settle default", c.KVEvents.Settle.D(), 2 * time.Minute},
	} {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

// TestZeroTurnsOff: 0 is a value, not "the default": the spelling scripts/compare-policies.sh
// uses to run kv without session hints loads, is valid and keeps the credits at 0 (off).
func TestZeroTurnsOff(t *testing.T) {
	base := []string{"--model", "m", "--worker", "http://127.0.0.1:1"}
	cases := []struct {
		name string
		args []string
		doc  string
	}{
		{"flags", append(base, "--sessions-affinity-blocks", "0", "--sessions-parent-aware=false", "--sessions-parent-blocks", "0", "--sessions-sibling-prefix=false"), ""},
		{"yaml", base, "sessions:\n  affinity_blocks: 0\n  parent_blocks: 0\n  parent_aware: false\n  sibling_prefix: false\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.doc != "" {
				path := filepath.Join(t.TempDir(), "kvgate.yaml")
				if err := os.WriteFile(path, []byte(tc.doc), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(append([]string{}, args...), "--config", path)
			}
			c, err := Load(args, envOf(nil), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			s := c.Sessions
			if s.AffinityBlocks != 0 || s.ParentBlocks != 0 || s.ParentAware || s.SiblingPrefix {
				t.Fatalf("sessions = %+v, want every hint off", s)
			}
			if d := Default().Sessions; s.MaxSessions != d.MaxSessions || s.GroupTargets != d.GroupTargets {
				t.Fatalf("keys left out lost their defaults: %+v", s)
			}
		})
	}
}
