package configs

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/confval"
)

// stringValue, intValue, uint64Value and listValue bind flag.Value to config fields.
type stringValue struct{ p *string }

func (v stringValue) String() string     { return *v.p }
func (v stringValue) Set(s string) error { *v.p = s; return nil }

type intValue struct{ p *int }

func (v intValue) String() string { return strconv.Itoa(*v.p) }
func (v intValue) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q is not an integer", s)
	}
	*v.p = n
	return nil
}

type uint64Value struct{ p *uint64 }

func (v uint64Value) String() string { return strconv.FormatUint(*v.p, 10) }
func (v uint64Value) Set(s string) error {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return fmt.Errorf("%q is not an unsigned integer", s)
	}
	*v.p = n
	return nil
}

type floatValue struct{ p *float64 }

func (v floatValue) String() string { return strconv.FormatFloat(*v.p, 'g', -1, 64) }
func (v floatValue) Set(s string) error {
	n, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(n) || math.IsInf(n, 0) {
		return fmt.Errorf("%q is not a number", s)
	}
	*v.p = n
	return nil
}

type boolValue struct{ p *bool }

func (v boolValue) String() string { return strconv.FormatBool(*v.p) }
func (v boolValue) Set(s string) error {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q is not a boolean (true or false)", s)
	}
	*v.p = b
	return nil
}

// IsBoolFlag lets `--sessions-parent-aware` stand for `--sessions-parent-aware=true`.
func (v boolValue) IsBoolFlag() bool { return true }

// listValue is a comma-separated list of names.
type listValue struct{ p *[]string }

func (v listValue) String() string { return strings.Join(*v.p, ",") }
func (v listValue) Set(s string) error {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	*v.p = out
	return nil
}

// workersValue is a list of worker specs separated by whitespace or ';' (see ParseWorkerSpec).
type workersValue struct{ p *[]Worker }

func (v workersValue) String() string {
	specs := make([]string, len(*v.p))
	for i, w := range *v.p {
		specs[i] = w.Spec()
	}
	return strings.Join(specs, " ")
}

func (v workersValue) Set(s string) error {
	var out []Worker
	for _, spec := range strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == ' ' || r == '\n' || r == '\t' }) {
		w, err := ParseWorkerSpec(spec)
		if err != nil {
			return err
		}
		out = append(out, w)
	}
	*v.p = out
	return nil
}

// ParseWorkerSpec parses the flag/env form of a worker: a bare URL, or the URL followed by
// comma-separated key=value attributes (kv_events, replay, dp_size, topic, api_key), e.g.
// "http://10.0.0.5:8000,kv_events=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558,dp_size=2".
func ParseWorkerSpec(spec string) (Worker, error) {
	parts := strings.Split(strings.TrimSpace(spec), ",")
	w := Worker{URL: strings.TrimSpace(strings.TrimPrefix(parts[0], "url="))}
	for _, p := range parts[1:] {
		k, val, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok {
			return Worker{}, fmt.Errorf("worker %q: attribute %q is not key=value", spec, p)
		}
		switch k {
		case "kv_events":
			w.KVEvents = val
		case "replay":
			w.Replay = val
		case "topic":
			w.Topic = val
		case "api_key":
			w.APIKey = val
		case "dp_size":
			n, err := strconv.Atoi(val)
			if err != nil {
				return Worker{}, fmt.Errorf("worker %q: dp_size %q is not an integer", spec, val)
			}
			w.DPSize = n
		default:
			return Worker{}, fmt.Errorf("worker %q: unknown attribute %q (known: kv_events, replay, dp_size, topic, api_key)", spec, k)
		}
	}
	return w, nil
}

// Spec renders the worker in the form ParseWorkerSpec reads.
func (w Worker) Spec() string {
	s := w.URL
	if w.KVEvents != "" {
		s += ",kv_events=" + w.KVEvents
	}
	if w.Replay != "" {
		s += ",replay=" + w.Replay
	}
	if w.DPSize > 1 {
		s += ",dp_size=" + strconv.Itoa(w.DPSize)
	}
	if w.Topic != "" {
		s += ",topic=" + w.Topic
	}
	if w.APIKey != "" {
		s += ",api_key=" + w.APIKey
	}
	return s
}

// Duration is a time.Duration written as Go duration text ("5s", "10m") in YAML, flags and env.
type Duration = confval.Duration

// ByteSize is a byte count; text may carry a KB/MB/GB (1000) or KiB/MiB/GiB (1024) suffix.
type ByteSize = confval.ByteSize
