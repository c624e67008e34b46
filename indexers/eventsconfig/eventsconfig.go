// Package eventsconfig holds the kv_events section of the kvgate YAML (the collector address,
// the ZMQ message cap, the settle window) with its defaults and validation. It is a leaf, so
// configs composes it into the schema and indexers keeps importing only kvkey.
package eventsconfig

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/confval"
)

// Config configures how kvgate follows the workers' KV events (per-worker endpoints are in the
// workers section). Every field is used as given: zero is a value (Listen "" = no collector),
// not "use the default"; start from Default.
type Config struct {
	// Listen, when set, is the address of the collector: kvgate binds one SUB there for workers
	// that publish by connecting out (vLLM connects when its endpoint has no "*"). Every worker
	// with a topic and no kv_events is fed through it, attributed by its exact topic.
	// Examples: tcp://*:5557, tcp://10.0.0.9:5557 (docs/routing.md, "Collector mode").
	Listen string `yaml:"listen"`
	// MaxMsgSize is ZMQ_MAXMSGSIZE on every KV-event socket: a larger message drops the
	// connection (which is then re-established).
	MaxMsgSize confval.ByteSize `yaml:"max_msg_size"`
	// Settle is how long a worker+rank whose event index lost batches stays approximate.
	Settle confval.Duration `yaml:"settle"`
	// Allow are the networks (CIDRs or addresses) publishers may connect to the collector
	// from; empty = only the workers' own addresses (their URL and replay hosts, resolved).
	Allow []string `yaml:"allow"`
	// CheckSender drops a collector message whose sender is not an address of the worker its
	// topic names.
	CheckSender bool `yaml:"check_sender"`
	// CurveSecretKeyFile holds the collector's CURVE secret key (Z85, 40 characters); set, the
	// collector takes only CURVE publishers whose public key is in CurveClientKeys.
	CurveSecretKeyFile string   `yaml:"curve_secret_key_file"`
	CurveClientKeys    []string `yaml:"curve_client_keys"`
}

// AllowPrefixes parses Allow (validated).
func (c Config) AllowPrefixes() ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(c.Allow))
	for _, a := range c.Allow {
		if p, err := netip.ParsePrefix(a); err == nil {
			out = append(out, p.Masked())
			continue
		}
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR or an IP address", a)
		}
		out = append(out, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
	}
	return out, nil
}

// Default returns the built-in defaults (configs/kvgate.yaml documents the same values).
func Default() Config {
	return Config{MaxMsgSize: 64 << 20, Settle: confval.Duration(2 * time.Minute), CheckSender: true}
}

// Validate returns every invalid key, named relative to the section ("settle"); configs
// prefixes them with "kv_events." and checks what spans sections (the collector's topics).
func (c Config) Validate() error {
	var p confval.Problems
	if c.MaxMsgSize < 1024 {
		p.Addf("max_msg_size", "must be at least 1KiB, got %d", c.MaxMsgSize)
	}
	if c.Settle <= 0 {
		p.Addf("settle", "must be a positive duration, got %s", c.Settle)
	}
	if c.Listen != "" {
		if msg := CheckBindEndpoint(c.Listen); msg != "" {
			p.Addf("listen", "%q %s", c.Listen, msg)
		}
	}
	if _, err := c.AllowPrefixes(); err != nil {
		p.Addf("allow", "%v", err)
	}
	if (c.CurveSecretKeyFile == "") != (len(c.CurveClientKeys) == 0) {
		p.Addf("curve_client_keys", "curve_secret_key_file and curve_client_keys go together")
	}
	for i, k := range c.CurveClientKeys {
		if len(k) != 40 {
			p.Addf("curve_client_keys["+strconv.Itoa(i)+"]", "must be a Z85 public key (40 characters), got %d characters", len(k))
		}
	}
	return p.Err()
}

// CheckBindEndpoint checks an address kvgate binds: tcp://host:port (host may be *) or
// ipc://path. It returns what is wrong, or "".
func CheckBindEndpoint(ep string) string {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok {
		return "is not a ZMQ endpoint (tcp://host:port or ipc://path)"
	}
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil || host == "" || port == "" || port == "*" || port == "0" {
			return "must be tcp://host:port with a fixed port (workers connect to it)"
		}
	case "ipc":
		if rest == "" {
			return "has an empty path"
		}
	default:
		return "must use tcp:// or ipc://"
	}
	return ""
}
