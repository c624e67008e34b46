package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/kvgate/kvgate/internal/buildinfo"
)

// runVersion prints what this binary was built from (kvgate version).
func runVersion(args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("version takes no arguments, got %q", args)
	}
	return buildinfo.Get().Write(stdout)
}

// runHealthcheck is the container's HEALTHCHECK (the runtime image has no curl): GET /live,
// then /ready unless --live-only, on the client listener; nil when each answers 200.
func runHealthcheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", healthcheckAddr(os.Getenv("KVGATE_LISTEN")),
		"the gateway's client listener, host:port (default: KVGATE_LISTEN with a wildcard host as 127.0.0.1, else 127.0.0.1:8000)")
	timeout := fs.Duration("timeout", 3*time.Second, "deadline for both probes")
	liveOnly := fs.Bool("live-only", false, "check /live only (a gateway without a routable worker stays healthy)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("healthcheck takes no arguments, got %q", fs.Args())
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	paths := []string{"/live", "/ready"}
	if *liveOnly {
		paths = paths[:1]
	}
	for _, p := range paths {
		if err := probe(ctx, "http://"+*addr+p); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s ok\n", p)
	}
	return nil
}

// healthcheckAddr turns a listen address into one to dial: a wildcard or empty host is the
// loopback (the check runs inside the gateway's own container).
func healthcheckAddr(listen string) string {
	if listen == "" {
		return "127.0.0.1:8000"
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// probe GETs url and wants 200; the error carries the body's start (the /ready reasons).
func probe(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe %s: %s: %s", url, resp.Status, body)
	}
	return nil
}
