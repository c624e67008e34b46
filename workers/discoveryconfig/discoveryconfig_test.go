package discoveryconfig

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want []string // substrings of the error; none: valid
	}{
		{"default: both off", func(*Config) {}, nil},
		{"kubernetes", func(c *Config) { c.Kubernetes.Service = "vllm" }, nil},
		{"dns", func(c *Config) { c.DNS.Name = "vllm.llm.svc"; c.DNS.KVEventsPort = 5557 }, nil},
		{"both", func(c *Config) { c.Kubernetes.Service = "vllm"; c.DNS.Name = "vllm" }, []string{"dns.name: is set as well as kubernetes.service"}},
		{"bad names", func(c *Config) {
			c.Kubernetes.Service, c.Kubernetes.Namespace, c.Kubernetes.PortName = "VLLM", "a_b", "http_port_name_too_long"
		}, []string{"kubernetes.service", "kubernetes.namespace", "kubernetes.port_name"}},
		{"replay without events", func(c *Config) { c.Kubernetes.Service = "vllm"; c.Kubernetes.KVEventsPortName = "" },
			[]string{"kubernetes.replay_port_name: is set but kv_events_port_name is not"}},
		{"api url", func(c *Config) { c.Kubernetes.Service = "vllm"; c.Kubernetes.APIURL = "kube:6443" }, []string{"kubernetes.api_url"}},
		{"dns ports and interval", func(c *Config) {
			c.DNS.Name, c.DNS.Port, c.DNS.ReplayPort, c.DNS.Interval = "vllm", 0, 70000, 0
		}, []string{"dns.port", "dns.replay_port: must be a port", "dns.interval"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.edit(&c)
			err := c.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %v", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	if c := Default(); c.Enabled() || c.Events() || c.Source() != "" {
		t.Error("discovery is on by default")
	}
}
