package deploy

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// kvgateBinary returns a kvgate binary: $KVGATE_BIN when set (make test points it at the one
// it built), else one built here from the repository root.
func kvgateBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("KVGATE_BIN"); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	bin := filepath.Join(t.TempDir(), "kvgate")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/kvgate")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/kvgate: %v\n%s", err, out)
	}
	return bin
}

// startHub serves testdata/hub/tiny as every repo of a Hugging Face hub
// (/{org}/{name}/resolve/main/{file}), so a config's tokenizer hub ids resolve offline.
func startHub(t *testing.T) *httptest.Server {
	t.Helper()
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 5)
		if len(parts) != 5 || parts[2] != "resolve" || strings.Contains(parts[4], "/") {
			http.NotFound(w, r)
			return
		}
		data, err := os.ReadFile(filepath.Join("testdata", "hub", "tiny", parts[4]))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("X-Repo-Commit", "0123456789abcdef0123456789abcdef01234567")
		_, _ = w.Write(data)
	}))
	t.Cleanup(hub.Close)
	return hub
}

// TestChartConfigAccepted runs every rendered kvgate config through
// `kvgate serve --check-config`: the ConfigMap the chart writes is one kvgate accepts. The
// Secret mounts do not exist here, so the files the config names are created under a
// temporary folder standing for the mount root, and the tokenizer hub ids are served by a
// local hub.
func TestChartConfigAccepted(t *testing.T) {
	bin := kvgateBinary(t)
	hub := startHub(t)
	chrt := loadChart(t)
	for _, file := range valuesFiles(t) {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
			r := renderValues(t, chrt, file)
			root := t.TempDir()
			cfg := r.rawCfg
			for _, f := range r.config.files() {
				local := filepath.Join(root, f)
				if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
					t.Fatal(err)
				}
				// A key file line, a 32-byte secret and a creds file's shape alike.
				if err := os.WriteFile(local, []byte("sk-test-0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				cfg = strings.ReplaceAll(cfg, f, local)
			}
			cfgFile := filepath.Join(root, "kvgate.yaml")
			if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "serve", "--config", cfgFile, "--check-config")
			home := filepath.Join(root, "hf")
			cmd.Env = append(os.Environ(), "HF_ENDPOINT="+hub.URL, "HF_HOME="+home, "HF_HUB_CACHE=", "HF_TOKEN=")
			cmd.Env = withoutKVGATE(cmd.Env)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("kvgate serve --check-config refused the config rendered from %s: %v\n%s\nconfig:\n%s", file, err, stderr.String(), cfg)
			}
			if !strings.Contains(stdout.String(), "listen: 0.0.0.0:") {
				t.Fatalf("--check-config printed no effective config with the chart's listen:\n%s", stdout.String())
			}
		})
	}
}

// withoutKVGATE drops KVGATE_* variables (they override the file) from env.
func withoutKVGATE(env []string) []string {
	out := env[:0:0]
	for _, e := range env {
		if !strings.HasPrefix(e, "KVGATE_") {
			out = append(out, e)
		}
	}
	return out
}
