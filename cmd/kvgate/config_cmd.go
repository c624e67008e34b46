package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/kvgate/kvgate/configs/configref"
)

const configUsage = `usage: kvgate config reference [--out FILE]
  print the configuration reference as Markdown (docs/configuration.md is its output): every
  key with its type, default, flag, KVGATE_* variable and the doc comment of its config field
`

// runConfig is `kvgate config reference`.
func runConfig(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "reference" {
		fmt.Fprint(stderr, configUsage)
		if len(args) == 0 {
			return errors.New("config: no subcommand given")
		}
		return fmt.Errorf("config: unknown subcommand %q", args[0])
	}
	fs := flag.NewFlagSet("kvgate config reference", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "write the reference to this file instead of stdout")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("config reference: unexpected argument %q", fs.Arg(0))
	}
	md := configref.Markdown()
	if *out == "" {
		_, err := io.WriteString(stdout, md)
		return err
	}
	if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
		return fmt.Errorf("config reference: %w", err)
	}
	return nil
}
