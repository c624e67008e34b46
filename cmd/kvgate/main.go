// Command kvgate is the OpenAI-compatible gateway with KV-cache-aware routing.
//
//	kvgate serve --config configs/kvgate.yaml
//	kvgate serve --model M --tokenizer DIR --worker URL --worker URL
//	kvgate serve --config configs/kvgate.yaml --check-config
//	kvgate tokenize --tokenizer DIR --request FILE|-
//	kvgate config reference [--out docs/configuration.md]
//	kvgate version
//	kvgate healthcheck [--addr HOST:PORT] [--live-only]
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `kvgate: OpenAI-compatible gateway with KV-cache-aware routing for vLLM fleets.

usage:
  kvgate serve [--config FILE] [flags]   run the gateway (kvgate serve -h lists every flag)
  kvgate serve --check-config [...]      check the configuration, load the tokenizer, print it
                                         (secrets masked); exit 0 when the gateway would start
  kvgate tokenize --tokenizer DIR --request FILE|-
                                         print the prompt, token ids and block hashes of a request
  kvgate config reference [--out FILE]   print the configuration reference (Markdown: every key,
                                         its type, default, flag, variable and meaning)
  kvgate version                         version, commit, Go version and build date
  kvgate healthcheck [--addr HOST:PORT] [--live-only]
                                         exit 0 when GET /live and /ready answer 200 (the
                                         container's HEALTHCHECK; the image has no curl)
  kvgate help                            this text
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal starts the drain (serve.go); a second one gets the default action and
	// ends the process at once.
	context.AfterFunc(ctx, stop)
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kvgate:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	switch args[0] {
	case "serve":
		return runServe(ctx, args[1:], stdout, stderr)
	case "tokenize":
		return runTokenize(ctx, args[1:], stdout)
	case "config":
		return runConfig(args[1:], stdout, stderr)
	case "version", "--version":
		return runVersion(args[1:], stdout)
	case "healthcheck":
		return runHealthcheck(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}
