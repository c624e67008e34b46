// Package healthconfig holds the workers package's health-probing configuration with its
// defaults and validation. It is a leaf, so configs composes it into the kvgate YAML schema
// (under health:) while workers itself imports configs.
package healthconfig

import (
	"time"

	"github.com/kvgate/kvgate/confval"
)

// Config configures active /health probing of workers. Every field is used as given (zero is
// not "use the default"): start from Default.
type Config struct {
	// Interval is the time between /health probes of each worker.
	Interval confval.Duration `yaml:"interval"`
	// Timeout bounds one /health probe.
	Timeout confval.Duration `yaml:"timeout"`
	// FailureThreshold is how many consecutive failures eject a worker.
	// Failures are failed probes and proxy connection errors.
	FailureThreshold int `yaml:"failure_threshold"`
	// SuccessThreshold is how many consecutive successful probes readmit an ejected worker.
	SuccessThreshold int `yaml:"success_threshold"`
	// HoldDown is how long a worker ejected soon after its readmission waits before it may be
	// readmitted again; each further flap doubles it up to HoldDownMax. 0 disables hold-down.
	HoldDown confval.Duration `yaml:"hold_down"`
	// HoldDownMax is the longest hold-down of a flapping worker.
	HoldDownMax confval.Duration `yaml:"hold_down_max"`
	// HoldDownReset is how long a readmitted worker must stay healthy for its hold-down to be
	// forgotten (one halving per such period).
	HoldDownReset confval.Duration `yaml:"hold_down_reset"`
}

// Default returns the built-in defaults (configs/kvgate.yaml documents the same values).
func Default() Config {
	return Config{
		Interval:         confval.Duration(5 * time.Second),
		Timeout:          confval.Duration(2 * time.Second),
		FailureThreshold: 3,
		SuccessThreshold: 1,
		HoldDown:         confval.Duration(10 * time.Second),
		HoldDownMax:      confval.Duration(5 * time.Minute),
		HoldDownReset:    confval.Duration(2 * time.Minute),
	}
}

// Validate returns every invalid key, named relative to the section ("failure_threshold");
// configs prefixes them with "health.".
func (c Config) Validate() error {
	var p confval.Problems
	if c.Interval <= 0 {
		p.Addf("interval", "must be positive, got %s", c.Interval)
	}
	if c.Timeout <= 0 {
		p.Addf("timeout", "must be positive, got %s", c.Timeout)
	}
	if c.FailureThreshold < 1 {
		p.Addf("failure_threshold", "must be at least 1, got %d", c.FailureThreshold)
	}
	if c.SuccessThreshold < 1 {
		p.Addf("success_threshold", "must be at least 1, got %d", c.SuccessThreshold)
	}
	if c.HoldDown < 0 {
		p.Addf("hold_down", "must not be negative, got %s", c.HoldDown)
	}
	if c.HoldDown > 0 && c.HoldDownMax < c.HoldDown {
		p.Addf("hold_down_max", "must be at least health.hold_down (%s), got %s", c.HoldDown, c.HoldDownMax)
	}
	if c.HoldDown > 0 && c.HoldDownReset <= 0 {
		p.Addf("hold_down_reset", "must be positive, got %s", c.HoldDownReset)
	}
	return p.Err()
}
