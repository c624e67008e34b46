package configs

import (
	"io"
	"strings"
	"testing"
)

// A discovery source stands in for the static list; router.policy auto follows whether the
// discovered workers publish KV events; the section's problems carry the discovery. prefix.
func TestDiscoveryKeys(t *testing.T) {
	tok := tokenizerDir(t)
	for _, tc := range []struct {
		name   string
		args   []string
		policy string
		err    string
	}{
		{"no workers, no source", []string{"--model", "m"}, "", "workers: at least one worker is required"},
		{"dns without events", []string{"--model", "m", "--discovery-dns-name", "vllm"}, "round_robin", ""},
		{"dns with events", []string{"--model", "m", "--tokenizer", tok, "--discovery-dns-name", "vllm", "--discovery-dns-kv-events-port", "5557"}, "kv", ""},
		{"kubernetes", []string{"--model", "m", "--tokenizer", tok, "--discovery-kubernetes-service", "vllm"}, "kv", ""},
		{"kubernetes without tokenizer", []string{"--model", "m", "--discovery-kubernetes-service", "vllm"}, "",
			"the default because discovery.kubernetes finds workers with KV events"},
		{"kubernetes approximate", []string{"--model", "m", "--discovery-kubernetes-service", "vllm",
			"--discovery-kubernetes-kv-events-port-name", "", "--discovery-kubernetes-replay-port-name", ""}, "round_robin", ""},
		{"bad section", []string{"--model", "m", "--discovery-dns-name", "vllm", "--discovery-dns-interval", "0s"}, "", "discovery.dns.interval: must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.args, func(string) string { return "" }, io.Discard)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Router.Policy != tc.policy {
				t.Errorf("policy %s, want %s", c.Router.Policy, tc.policy)
			}
		})
	}
}
