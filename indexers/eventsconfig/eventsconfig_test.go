package eventsconfig

import (
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/confval"
)

func TestDefault(t *testing.T) {
	d := Default()
	if d.Listen != "" || d.MaxMsgSize != 64<<20 || d.Settle != confval.Duration(2*time.Minute) {
		t.Fatalf("defaults %+v", d)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		set  func(*Config)
		want string // the error's key prefix; "" = valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"collector on tcp", func(c *Config) { c.Listen = "tcp://*:5557" }, ""},
		{"collector on ipc", func(c *Config) { c.Listen = "ipc:///tmp/kv" }, ""},
		{"message cap below 1KiB", func(c *Config) { c.MaxMsgSize = 1023 }, "max_msg_size: "},
		{"zero settle", func(c *Config) { c.Settle = 0 }, "settle: "},
		{"not an endpoint", func(c *Config) { c.Listen = "localhost:5557" }, "listen: "},
		{"ephemeral port", func(c *Config) { c.Listen = "tcp://*:0" }, "listen: "},
		{"wildcard port", func(c *Config) { c.Listen = "tcp://127.0.0.1:*" }, "listen: "},
		{"empty ipc path", func(c *Config) { c.Listen = "ipc://" }, "listen: "},
		{"inproc", func(c *Config) { c.Listen = "inproc://kv" }, "listen: "},
		{"allow CIDRs and addresses", func(c *Config) { c.Allow = []string{"10.0.0.0/8", "192.168.1.7", "fd00::/8"} }, ""},
		{"allow garbage", func(c *Config) { c.Allow = []string{"10.0.0.0/33"} }, "allow: "},
		{"curve key without client keys", func(c *Config) { c.CurveSecretKeyFile = "/k" }, "curve_client_keys: "},
		{"short client key", func(c *Config) { c.CurveSecretKeyFile, c.CurveClientKeys = "/k", []string{"abc"} }, "curve_client_keys[0]: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.set(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("want valid, got %v", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Fatalf("want an error starting %q, got %v", tc.want, err)
			}
		})
	}
}
