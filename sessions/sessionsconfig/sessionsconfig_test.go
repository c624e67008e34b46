package sessionsconfig

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/confval"
)

func TestDefault(t *testing.T) {
	d := Default()
	tests := []struct {
		name      string
		got, want any
	}{
		{"first session header", d.Headers[0], "X-Session-ID"},
		{"session headers", len(d.Headers), 8},
		{"session body fields", len(d.BodyFields), 4},
		{"parent headers", len(d.ParentHeaders), 3},
		{"final header", d.FinalHeaders[0], "X-Dynamo-Session-Final"},
		{"max_sessions", d.MaxSessions, 16384},
		{"max_nodes", d.MaxNodes, 1 << 20},
		{"affinity_blocks", d.AffinityBlocks, 16.0},
		{"parent_aware", d.ParentAware, true},
		{"parent_mode", d.ParentMode, ModeParent},
		{"parent_blocks", d.ParentBlocks, 16.0},
		{"group_targets", d.GroupTargets, 2},
		{"sibling_prefix", d.SiblingPrefix, true},
		{"pending_ttl", d.PendingTTL, confval.Duration(30 * time.Second)},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
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
		{"affinity off", func(c *Config) { c.AffinityBlocks = 0 }, ""},
		{"parent hint off", func(c *Config) { c.ParentBlocks = 0 }, ""},
		{"no session headers", func(c *Config) { c.Headers = nil }, ""},
		{"bad session header", func(c *Config) { c.Headers = []string{"X-Ok", "bad header"} }, "headers[1]: "},
		{"empty parent header", func(c *Config) { c.ParentHeaders = []string{""} }, "parent_headers[0]: "},
		{"no body fields", func(c *Config) { c.BodyFields = []string{} }, ""},
		{"bad body field", func(c *Config) { c.BodyFields = []string{"a..b"} }, "body_fields[0]: "},
		{"bad final header", func(c *Config) { c.FinalHeaders = []string{"X:Final"} }, "final_headers[0]: "},
		{"zero max_sessions", func(c *Config) { c.MaxSessions = 0 }, "max_sessions: "},
		{"zero max_nodes", func(c *Config) { c.MaxNodes = 0 }, "max_nodes: "},
		{"huge max_nodes", func(c *Config) { c.MaxNodes = math.MaxUint32 }, "max_nodes: "},
		{"negative affinity", func(c *Config) { c.AffinityBlocks = -1 }, "affinity_blocks: "},
		{"infinite affinity", func(c *Config) { c.AffinityBlocks = math.Inf(1) }, "affinity_blocks: "},
		{"NaN parent blocks", func(c *Config) { c.ParentBlocks = math.NaN() }, "parent_blocks: "},
		{"unknown parent mode", func(c *Config) { c.ParentMode = "nearest" }, "parent_mode: "},
		{"zero group_targets", func(c *Config) { c.GroupTargets = 0 }, "group_targets: "},
		{"negative pending_ttl", func(c *Config) { c.PendingTTL = confval.Duration(-time.Second) }, "pending_ttl: "},
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
