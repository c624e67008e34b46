package healthconfig

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/confval"
)

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"defaults", func(*Config) {}, ""},
		{"hold-down off needs no max", func(c *Config) { c.HoldDown, c.HoldDownMax, c.HoldDownReset = 0, 0, 0 }, ""},
		{"zero interval", func(c *Config) { c.Interval = 0 }, "interval: must be positive"},
		{"max below hold-down", func(c *Config) { c.HoldDownMax = c.HoldDown / 2 }, "hold_down_max: must be at least health.hold_down (10s)"},
		{"all problems at once", func(c *Config) { c.FailureThreshold, c.SuccessThreshold = 0, 0 },
			"failure_threshold: must be at least 1, got 0\nsuccess_threshold: must be at least 1, got 0"},
		{"negative hold-down", func(c *Config) { c.HoldDown = confval.Duration(-1) }, "hold_down: must not be negative"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.mod(&c)
			err := c.Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
}
