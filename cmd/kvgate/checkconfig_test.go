package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/confval"
)

// kvgate serve --check-config on a good configuration: exit 0 (nil), the effective config
// (file, env and flags merged) on stdout as YAML that reads back, every secret masked
// wherever it came from, the tokenizer loaded, and nothing listened on or contacted.
func TestCheckConfigGood(t *testing.T) {
	needModel(t)
	var contacted atomic.Int64
	worker := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { contacted.Add(1) }))
	defer worker.Close()
	// The listen address is taken: a gateway that tried to listen would fail.
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()

	dir := t.TempDir()
	path := filepath.Join(dir, "kvgate.yaml")
	file := `
model: ` + servedModel + `
tokenizer: ` + modelDir + `
admin_listen: 127.0.0.1:0
workers:
  - url: ` + worker.URL + `
    api_key: sk-worker-file-secret
  - url: http://127.0.0.1:1
auth:
  api_keys: [sk-client-file-1, sk-client-file-2]
cluster:
  nats_url: nats://kvgate:nats-url-secret@127.0.0.1:1
  embedded_nats:
    users: [{user: replica, password: embedded-user-secret}]
`
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KVGATE_AUTH_WORKER_API_KEY", "sk-env-worker-secret")
	secrets := []string{"sk-worker-file-secret", "sk-client-file-1", "sk-client-file-2", "nats-url-secret",
		"embedded-user-secret", "sk-env-worker-secret", "admin-flag-secret"}

	var stdout, stderr strings.Builder
	err = run(context.Background(), []string{"serve", "--config", path, "--check-config", "--listen", held.Addr().String(),
		"--admin-token", "admin-flag-secret"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("check-config failed: %v\n%s", err, stderr.String())
	}
	out := stdout.String()
	for _, s := range secrets {
		if strings.Contains(out, s) || strings.Contains(stderr.String(), s) {
			t.Errorf("secret %q printed", s)
		}
	}
	var printed configs.Config
	if err := configs.ParseYAML([]byte(out), &printed); err != nil {
		t.Fatalf("printed config does not read back: %v\n%s", err, out)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"listen (flag)", printed.Listen, held.Addr().String()},
		{"admin_token (flag)", printed.AdminToken, confval.Mask},
		{"workers[0].api_key (file)", printed.Workers[0].APIKey, confval.Mask},
		{"workers[1].api_key (env default)", printed.Workers[1].APIKey, confval.Mask},
		{"auth.worker_api_key (env)", printed.Auth.WorkerAPIKey, confval.Mask},
		{"auth.api_keys (file)", strings.Join(printed.Auth.APIKeys, ","), confval.Mask + "," + confval.Mask},
		{"cluster.nats_url", printed.Cluster.NATSURL, "nats://" + confval.Mask + "@127.0.0.1:1"},
		{"embedded user password", printed.Cluster.EmbeddedNATS.Users[0].Password, confval.Mask},
		{"embedded user name", printed.Cluster.EmbeddedNATS.Users[0].User, "replica"},
		{"router.policy (auto resolved)", printed.Router.Policy, "round_robin"},
		{"shutdown_drain_delay (default)", printed.ShutdownDrainDelay.String(), "5s"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: printed %v, want %v", c.name, c.got, c.want)
		}
	}
	if !strings.Contains(stderr.String(), "configuration OK") || !strings.Contains(stderr.String(), "tokenizer "+modelDir+" loaded") {
		t.Errorf("stderr %q", stderr.String())
	}
	if n := contacted.Load(); n != 0 {
		t.Errorf("a worker was contacted %d times", n)
	}
}

// kvgate serve --check-config on a bad configuration: every problem (file keys and types,
// env, flags, validation, a tokenizer that does not load) in one error (exit 1), nothing on
// stdout.
func TestCheckConfigBad(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "tok")
	if err := os.MkdirAll(tok, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tok, "tokenizer.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "kvgate.yaml")
	file := `
tokenizer: ` + tok + `
block_size: many
workers:
  - url: ftp://127.0.0.1:1
proxy:
  max_retrys: 2
limits:
  max_conns_per_ip: -1
colour: blue
`
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KVGATE_HEALTH_INTERVAL", "often")
	var stdout strings.Builder
	err := run(context.Background(), []string{"serve", "--config", path, "--check-config",
		"--shutdown-drain-delay", "-1s", "--router-policy", "best"}, &stdout, &strings.Builder{})
	if err == nil {
		t.Fatal("a bad configuration passed the check")
	}
	msg := err.Error()
	for _, want := range []string{
		"line 3: cannot unmarshal !!str `many`", // block_size: wrong type in the file
		"max_retrys",                            // unknown keys in the file
		"colour",
		"limits.max_conns_per_ip",                    // validation of the file's value
		"KVGATE_HEALTH_INTERVAL",                     // env
		"shutdown_drain_delay: must not be negative", // flag value, validated
		`router.policy: unknown policy "best"`,
		"model: is required",
		"workers[0].url",
		"tokenizer: ", // the folder exists but does not load
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("problems lack %q:\n%s", want, msg)
		}
	}
	if stdout.Len() != 0 {
		t.Errorf("a bad configuration was printed:\n%s", stdout.String())
	}
}

func TestCheckConfigFlag(t *testing.T) {
	cases := []struct {
		args    []string
		rest    []string
		check   bool
		wantErr bool
	}{
		{[]string{"--model", "m"}, []string{"--model", "m"}, false, false},
		{[]string{"--check-config", "--model", "m"}, []string{"--model", "m"}, true, false},
		{[]string{"-check-config"}, nil, true, false},
		{[]string{"--check-config=false"}, nil, false, false},
		{[]string{"--check-config=maybe"}, nil, false, true},
		{[]string{"--model", "check-config"}, []string{"--model", "check-config"}, false, false},
	}
	for _, tc := range cases {
		rest, check, err := checkConfigFlag(tc.args)
		if (err != nil) != tc.wantErr || check != tc.check || strings.Join(rest, " ") != strings.Join(tc.rest, " ") {
			t.Errorf("%v: %v %v %v, want %v %v err=%v", tc.args, rest, check, err, tc.rest, tc.check, tc.wantErr)
		}
	}
}
