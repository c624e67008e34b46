// Package discoveryconfig holds the worker discovery configuration (yaml discovery:) with its
// defaults and validation: the EndpointSlices of a Kubernetes Service, or the A/AAAA records of
// a DNS name. It is a leaf, so configs composes it (at the top level, and per model entry).
package discoveryconfig

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/kvgate/kvgate/confval"
)

// Config selects at most one discovery source; with neither, the fleet is the static workers:
// list. Every field is used as given (zero is not "use the default"): start from Default.
type Config struct {
	// Kubernetes follows the EndpointSlices of a Service; off unless kubernetes.service is set.
	Kubernetes Kubernetes `yaml:"kubernetes"`
	// DNS re-resolves a name's A/AAAA records; off unless dns.name is set.
	DNS DNS `yaml:"dns"`
}

// Kubernetes follows the EndpointSlices of one Service (label kubernetes.io/service-name).
// Each ready endpoint address with the slice's ports is one worker; a terminating or not
// ready one is drained. Needs a Role granting list and watch on discovery.k8s.io
// endpointslices in Namespace.
type Kubernetes struct {
	// Service is the Service whose slices are followed; "" turns Kubernetes discovery off.
	Service string `yaml:"service"`
	// Namespace is the Service's namespace; "" is the pod's own (the service-account
	// namespace file).
	Namespace string `yaml:"namespace"`
	// PortName is the slice port carrying vLLM's OpenAI HTTP API.
	PortName string `yaml:"port_name"`
	// KVEventsPortName is the port of vLLM's KV-event publisher (its --kv-events-config
	// endpoint); kv-events-<r> ports give DP ranks. A slice without it gives workers routed in
	// approximate mode.
	KVEventsPortName string `yaml:"kv_events_port_name"`
	// ReplayPortName is the port of vLLM's KV-event replay socket (kv-replay-<r> per rank).
	ReplayPortName string `yaml:"replay_port_name"`
	// APIURL is the Kubernetes API; "" is in-cluster: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
	APIURL string `yaml:"api_url"`
	// TokenFile holds the bearer token; it is re-read for every request (it rotates).
	// "" sends no token.
	TokenFile string `yaml:"token_file"`
	// CAFile is the PEM bundle the API's certificate is checked against; "" uses the system roots.
	CAFile string `yaml:"ca_file"`
}

// DNS resolves the A/AAAA records of a name (a headless Service, docker compose, Nomad,
// Consul) every Interval; each address is one worker.
type DNS struct {
	// Name is resolved; "" turns DNS discovery off.
	Name string `yaml:"name"`
	// Port is the workers' OpenAI HTTP port.
	Port int `yaml:"port"`
	// KVEventsPort is the workers' KV-event publisher port; 0: approximate mode.
	KVEventsPort int `yaml:"kv_events_port"`
	// ReplayPort is the workers' KV-event replay port; 0: none.
	ReplayPort int `yaml:"replay_port"`
	// Interval is the time between resolutions.
	Interval confval.Duration `yaml:"interval"`
}

// In-cluster service-account files (Kubernetes mounts them into every pod).
const (
	ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	DefaultTokenFile  = ServiceAccountDir + "/token"
	DefaultCAFile     = ServiceAccountDir + "/ca.crt"
	NamespaceFile     = ServiceAccountDir + "/namespace"
)

// Default returns the built-in defaults (configs/kvgate.yaml documents the same values):
// both sources off, the service-account files, ports named http, kv-events and kv-replay.
func Default() Config {
	return Config{
		Kubernetes: Kubernetes{
			PortName:         "http",
			KVEventsPortName: "kv-events",
			ReplayPortName:   "kv-replay",
			TokenFile:        DefaultTokenFile,
			CAFile:           DefaultCAFile,
		},
		DNS: DNS{Port: 8000, Interval: confval.Duration(10 * time.Second)},
	}
}

// Enabled reports whether a discovery source is configured.
func (c Config) Enabled() bool { return c.Kubernetes.Enabled() || c.DNS.Enabled() }

// Enabled reports whether Kubernetes discovery is configured.
func (k Kubernetes) Enabled() bool { return k.Service != "" }

// Enabled reports whether DNS discovery is configured.
func (d DNS) Enabled() bool { return d.Name != "" }

// Events reports whether the source's workers are expected to publish KV events (their
// event port is configured), which makes router.policy auto choose kv.
func (c Config) Events() bool {
	return (c.Kubernetes.Enabled() && c.Kubernetes.KVEventsPortName != "") || (c.DNS.Enabled() && c.DNS.KVEventsPort != 0)
}

// Source names the configured source ("kubernetes", "dns" or "").
func (c Config) Source() string {
	switch {
	case c.Kubernetes.Enabled():
		return "kubernetes"
	case c.DNS.Enabled():
		return "dns"
	}
	return ""
}

// portName is an IANA service name as Kubernetes accepts it for a port name.
var portName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$`)

// dnsLabel is a Kubernetes object name (RFC 1123 label).
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// Validate returns every invalid key, named relative to the section ("kubernetes.service");
// configs prefixes them with "discovery.".
func (c Config) Validate() error {
	var p confval.Problems
	if c.Kubernetes.Enabled() && c.DNS.Enabled() {
		p.Addf("dns.name", "is set as well as kubernetes.service: choose one discovery source")
	}
	if k := c.Kubernetes; k.Enabled() {
		if !dnsLabel.MatchString(k.Service) {
			p.Addf("kubernetes.service", "%q is not a Service name (lowercase letters, digits and -)", k.Service)
		}
		if k.Namespace != "" && !dnsLabel.MatchString(k.Namespace) {
			p.Addf("kubernetes.namespace", "%q is not a namespace name (lowercase letters, digits and -)", k.Namespace)
		}
		if !portName.MatchString(k.PortName) {
			p.Addf("kubernetes.port_name", "%q is not a port name (at most 15 lowercase letters, digits and -)", k.PortName)
		}
		for key, v := range map[string]string{"kubernetes.kv_events_port_name": k.KVEventsPortName, "kubernetes.replay_port_name": k.ReplayPortName} {
			if v != "" && !portName.MatchString(v) {
				p.Addf(key, "%q is not a port name (at most 15 lowercase letters, digits and -)", v)
			}
		}
		if k.ReplayPortName != "" && k.KVEventsPortName == "" {
			p.Addf("kubernetes.replay_port_name", "is set but kv_events_port_name is not (replay only fills gaps of a subscribed stream)")
		}
		if k.APIURL != "" {
			if u, err := url.Parse(k.APIURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				p.Addf("kubernetes.api_url", "%q must be an http(s) URL with a host", k.APIURL)
			}
		}
	}
	if d := c.DNS; d.Enabled() {
		if strings.ContainsAny(d.Name, " /:") {
			p.Addf("dns.name", "%q is not a host name", d.Name)
		}
		checkPort := func(key string, v int, optional bool) {
			if (v == 0 && !optional) || v < 0 || v > 65535 {
				p.Addf(key, "%s", portProblem(v))
			}
		}
		checkPort("dns.port", d.Port, false)
		checkPort("dns.kv_events_port", d.KVEventsPort, true)
		checkPort("dns.replay_port", d.ReplayPort, true)
		if d.ReplayPort != 0 && d.KVEventsPort == 0 {
			p.Addf("dns.replay_port", "is set but kv_events_port is not (replay only fills gaps of a subscribed stream)")
		}
		if d.Interval <= 0 {
			p.Addf("dns.interval", "must be positive, got %s", d.Interval)
		}
	}
	return p.Err()
}

func portProblem(v int) string { return fmt.Sprintf("must be a port number (1-65535), got %d", v) }
