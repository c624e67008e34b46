package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/bench"
)

// capacityCmd finds the fleet's capacity from baseline runs at several rates (issue 33: the
// request rate where round robin's TTFT p90 passes 2 s) and prints each multiple of it as a
// load like the runs': "users MULTIPLE USERS" when they share a time scale, "scale MULTIPLE
// TIME_SCALE" when they share a user count.
func capacityCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench capacity", flag.ContinueOnError)
	fs.SetOutput(stderr)
	limit := fs.Duration("ttft-p90", 2*time.Second, "the TTFT p90 whose crossing marks capacity")
	multiples := fs.String("multiples", "1,1.5,2", "comma-separated multiples of capacity to print time scales for")
	within := fs.Float64("saturation-within", 0.1, "also print the lowest offered rate whose throughput is within this fraction of the highest")
	if err := fs.Parse(flagsFirst(args, map[string]bool{})); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("capacity needs the baseline's runs at two rates at least")
	}
	ms, err := parseMultiples(*multiples)
	if err != nil {
		return err
	}
	var points []bench.CapacityPoint
	for _, p := range fs.Args() {
		r, err := bench.LoadRun(p)
		if err != nil {
			return err
		}
		points = append(points, bench.CapacityPointOf(r))
	}
	for _, p := range points {
		fmt.Fprintf(stdout, "run %s: offered %.4g req/s (time scale %g), achieved %.4g req/s, TTFT p90 %.0f ms\n",
			p.Label, p.Rate, p.TimeScale, p.Throughput, p.P90MS)
	}
	if sat, err := bench.FindSaturation(points, *within); err == nil {
		fmt.Fprintf(stdout, "saturation: highest throughput %.4g req/s (%s, offered %.4g); first within %g%% of it at offered %.4g req/s (%s)\n",
			sat.Max.Throughput, sat.Max.Label, sat.Max.Rate, 100**within, sat.Knee.Rate, sat.Knee.Label)
	}
	c, err := bench.FindCapacity(points, float64(*limit)/float64(time.Millisecond))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "capacity %.4g req/s offered: TTFT p90 passes %v between %.4g req/s (%.0f ms) and %.4g req/s (%.0f ms)\n",
		c.Rate, *limit, c.Below.Rate, c.Below.P90MS, c.Above.Rate, c.Above.P90MS)
	// The multiples as a load like the runs': the users at their time scale when they share one,
	// the time scale at their users when they share those.
	scale, users := points[0].TimeScale, points[0].Users
	for _, p := range points {
		if p.TimeScale != scale {
			scale = 0
		}
		if p.Users != users {
			users = 0
		}
	}
	for _, m := range ms {
		if scale > 0 {
			fmt.Fprintf(stdout, "users %g %.3g (time scale %g)\n", m, c.UsersFor(m, scale), scale)
		}
		if users > 0 {
			fmt.Fprintf(stdout, "scale %g %.6g (%d users)\n", m, c.TimeScaleFor(m, users), users)
		}
	}
	return nil
}

func parseMultiples(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v > 0) {
			return nil, fmt.Errorf("--multiples %q: want positive numbers separated by commas", s)
		}
		out = append(out, v)
	}
	return out, nil
}

// overloadCmd prints the overload sweep's table: goodput, TTFT and captured fraction per level
// and policy, goodput against the baseline policy's.
func overloadCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench overload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mdOut := fs.String("md", "", "also write the markdown table here")
	baseline := fs.String("baseline", "round_robin", "the policy (run label) goodput ratios are against")
	if err := fs.Parse(flagsFirst(args, map[string]bool{})); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("overload needs at least one LEVEL=RUN argument")
	}
	var points []bench.OverloadPoint
	for _, a := range fs.Args() {
		level, path, ok := strings.Cut(a, "=")
		if !ok || level == "" {
			return fmt.Errorf("overload argument %q: want LEVEL=RUN, e.g. 1.5x=out/1.5x/kv", a)
		}
		r, err := bench.LoadRun(path)
		if err != nil {
			return err
		}
		points = append(points, bench.OverloadPoint{Level: level, Run: r})
	}
	if err := bench.WriteOverloadMarkdown(stdout, points, *baseline); err != nil {
		return err
	}
	if *mdOut != "" {
		return writeWith(*mdOut, func(w io.Writer) error { return bench.WriteOverloadMarkdown(w, points, *baseline) })
	}
	return nil
}
