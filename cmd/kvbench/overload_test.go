package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/bench"
)

// writeRun stores a summary as kvbench run would, in dir.
func writeRun(t *testing.T, dir string, s *bench.Summary) string {
	t.Helper()
	s.Schema = bench.SchemaVersion
	if err := bench.WriteOutputs(dir, s, &bench.Result{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestCapacityAndOverloadCommands: capacity finds round robin's crossing and prints the time
// scale of each multiple; overload tabulates goodput against round robin; bad arguments are
// clear errors.
func TestCapacityAndOverloadCommands(t *testing.T) {
	tmp := t.TempDir()
	quietLog := slog.New(slog.NewTextHandler(io.Discard, nil))
	var caps []string
	for _, c := range []struct {
		rate, scale, p90 float64
	}{{1, 0.2, 800}, {2, 0.1, 1600}, {4, 0.05, 2400}} {
		s := &bench.Summary{Label: "round_robin", InputConfig: bench.InputConfig{OfferedRequestRate: c.rate, TimeScale: c.scale, Repeat: 1},
			TimeToFirstToken: bench.Stat{P90: c.p90}, RequestThroughput: bench.Stat{Avg: c.rate / 2}}
		caps = append(caps, writeRun(t, filepath.Join(tmp, "cap", fmt.Sprint(c.rate)), s))
	}
	var out bytes.Buffer
	if err := run(context.Background(), append([]string{"capacity", "--multiples", "1,2"}, caps...), &out, io.Discard, quietLog); err != nil {
		t.Fatal(err)
	}
	// p90 passes 2000 ms halfway between 2 req/s (1600) and 4 (2400): 3 req/s, where
	// rate × time scale = 0.2 gives time scale 0.2/3 for 1x and 0.2/6 for 2x.
	for _, want := range []string{"capacity 3 req/s", "scale 1 0.0666667 (1 users)", "scale 2 0.0333333 (1 users)", "highest throughput 2 req/s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("capacity output lacks %q:\n%s", want, out.String())
		}
	}
	// Users as the load at one time scale: 1, 2 and 4 users offer 1, 2 and 4 req/s; the p90
	// passes 2000 ms at 3 req/s, which 1.5x makes 4.5 users.
	var byUsers []string
	for _, c := range []struct {
		users int
		p90   float64
	}{{1, 800}, {2, 1600}, {4, 2400}} {
		s := &bench.Summary{Label: "round_robin", InputConfig: bench.InputConfig{OfferedRequestRate: float64(c.users), TimeScale: 0.05, Repeat: c.users},
			TimeToFirstToken: bench.Stat{P90: c.p90}}
		byUsers = append(byUsers, writeRun(t, filepath.Join(tmp, "users", fmt.Sprint(c.users)), s))
	}
	out.Reset()
	if err := run(context.Background(), append([]string{"capacity", "--multiples", "1.5"}, byUsers...), &out, io.Discard, quietLog); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "users 1.5 4.5 (time scale 0.05)") || strings.Contains(out.String(), "\nscale ") {
		t.Errorf("capacity by users:\n%s", out.String())
	}
	if err := run(context.Background(), []string{"capacity", caps[0]}, io.Discard, io.Discard, quietLog); err == nil {
		t.Error("capacity from one run: want an error")
	}

	rr := writeRun(t, filepath.Join(tmp, "rr"), &bench.Summary{Label: "round_robin", Goodput: 0.5})
	kv := writeRun(t, filepath.Join(tmp, "kv"), &bench.Summary{Label: "kv", Goodput: 0.8, ErrorSummary: map[string]int{"http_503": 1}})
	out.Reset()
	md := filepath.Join(tmp, "overload.md")
	if err := run(context.Background(), []string{"overload", "--md", md, "1.5x=" + rr, "1.5x=" + kv}, &out, io.Discard, quietLog); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "| 1.5x | kv | 1 | 0.800 | 0.800–0.800 | 1.60 |") || !strings.Contains(out.String(), "http_503 1") {
		t.Errorf("overload table:\n%s", out.String())
	}
	for _, bad := range [][]string{{"overload"}, {"overload", rr}, {"overload", "=" + rr}, {"capacity", "--multiples", "1,-2", rr, kv}} {
		if err := run(context.Background(), bad, io.Discard, io.Discard, quietLog); err == nil {
			t.Errorf("%v: want an error", bad)
		}
	}
}
