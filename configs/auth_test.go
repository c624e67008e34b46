package configs

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestAuthValidation(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("# no keys yet\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badLine := filepath.Join(dir, "bad")
	if err := os.WriteFile(badLine, []byte("good\nhas space\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--model", "m", "--worker", "http://127.0.0.1:8101"}
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"admin listen", append(base, "--admin-listen", "nope"), nil, `admin_listen: "nope" is not host:port`},
		{"admin same as client", append(base, "--admin-listen", "127.0.0.1:8000"), nil, "admin_listen: \"127.0.0.1:8000\" is the client listener's address"},
		{"token without listener", append(base, "--admin-token", "t"), nil, "admin_token: is set but admin_listen is not"},
		{"token with space", append(base, "--admin-listen", "127.0.0.1:8001"), map[string]string{"KVGATE_ADMIN_TOKEN": "a b"}, "admin_token: contains whitespace"},
		{"keys file missing", append(base, "--auth-api-keys-file", filepath.Join(dir, "none")), nil, "auth.api_keys_file: stat"},
		{"keys file empty", append(base, "--auth-api-keys-file", empty), nil, "holds no key (authentication would be off)"},
		{"keys file bad line", append(base, "--auth-api-keys-file", badLine), nil, "line 2: the key contains whitespace"},
		{"worker key", []string{"--model", "m", "--worker", "http://x:1,api_key=a\tb"}, nil, "workers[0].api_key: contains whitespace"},
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

func TestAuthSettings(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "keys")
	if err := os.WriteFile(file, []byte("# team a\nkey-from-file\n\n  key-2  \nflag-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load([]string{"--model", "m", "--worker", "http://x:1", "--worker", "http://y:1,api_key=own",
		"--auth-api-keys", "flag-key, other", "--auth-api-keys-file", file, "--admin-listen", "127.0.0.1:8001"},
		envOf(map[string]string{"KVGATE_AUTH_WORKER_API_KEY": "fleet", "KVGATE_ADMIN_TOKEN": "adm"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := c.ClientAPIKeys()
	if want := []string{"flag-key", "other", "key-from-file", "key-2"}; err != nil || !slices.Equal(keys, want) {
		t.Errorf("client keys = %q (%v), want %q", keys, err, want)
	}
	if c.Workers[0].APIKey != "fleet" || c.Workers[1].APIKey != "own" {
		t.Errorf("worker keys = %q, %q; want the fleet default and the worker's own", c.Workers[0].APIKey, c.Workers[1].APIKey)
	}
	if c.AdminToken != "adm" || c.AdminListen != "127.0.0.1:8001" || c.Proxy.ExposeRoutingHeaders {
		t.Errorf("admin %q %q, routing headers %v", c.AdminListen, c.AdminToken, c.Proxy.ExposeRoutingHeaders)
	}
	if d := Default(); d.AdminListen != "" || d.Proxy.ExposeRoutingHeaders || len(d.Auth.APIKeys) != 0 {
		t.Errorf("defaults must be closed: admin %q, routing headers %v, keys %q", d.AdminListen, d.Proxy.ExposeRoutingHeaders, d.Auth.APIKeys)
	}
	w, err := ParseWorkerSpec(c.Workers[1].Spec())
	if w.DPSize = 1; err != nil || w != c.Workers[1] { // dp_size 1 is implied
		t.Errorf("spec round trip: %+v (%v)", w, err)
	}
}
