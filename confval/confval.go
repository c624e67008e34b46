// Package confval holds the value types and validation helpers shared by every package's
// config: durations and byte sizes written as text in YAML, flags and KVGATE_* variables, and
// the key-path prefixing with which configs aggregates each section's problems. It imports no
// other kvgate package, so any package may own a config type built from it.
package confval

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Duration is a time.Duration written as Go duration text ("5s", "10m") in YAML, flags and env.
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String renders the duration as Go duration text.
func (d Duration) String() string { return time.Duration(d).String() }

// Set parses Go duration text (flag.Value).
func (d *Duration) Set(s string) error {
	v, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q is not a duration (use forms like 500ms, 5s, 10m)", s)
	}
	*d = Duration(v)
	return nil
}

// UnmarshalYAML reads a duration scalar.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: expected a duration like 5s", n.Line)
	}
	if err := d.Set(n.Value); err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	return nil
}

// MarshalYAML writes the duration as text.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// ByteSize is a byte count; text may carry a KB/MB/GB (1000) or KiB/MiB/GiB (1024) suffix.
type ByteSize int64

// String renders the size in bytes.
func (b ByteSize) String() string { return strconv.FormatInt(int64(b), 10) }

// Set parses "1048576", "512KiB", "32MiB", "1MB" (flag.Value).
func (b *ByteSize) Set(s string) error {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
		{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000}, {"B", 1},
	}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return fmt.Errorf("%q is not a byte size (use forms like 1048576, 512KiB, 32MiB)", s)
	}
	*b = ByteSize(n * mult)
	return nil
}

// UnmarshalYAML reads a byte-size scalar.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: expected a byte size like 32MiB", n.Line)
	}
	if err := b.Set(n.Value); err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	return nil
}

// Problems collects every problem of one config section, each naming its key relative to the
// section ("prefill_weight", "approximate.ttl"); Err joins them.
type Problems struct{ errs []error }

// Addf records that key is invalid, with a message formatted as by fmt.Sprintf.
func (p *Problems) Addf(key, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
}

// Err returns all recorded problems joined (one per line), or nil.
func (p *Problems) Err() error { return errors.Join(p.errs...) }

// Prefix puts prefix (a section's key path with its trailing dot, "router.") in front of every
// problem joined in err, so that a section's relative keys become full key paths. A nil err
// stays nil.
func Prefix(prefix string, err error) error {
	if err == nil {
		return nil
	}
	var out []error
	for _, e := range Split(err) {
		out = append(out, fmt.Errorf("%s%w", prefix, e))
	}
	return errors.Join(out...)
}

// Split returns the problems joined in err (err itself when it joins none).
func Split(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, Split(e)...)
		}
		return out
	}
	return []error{err}
}
