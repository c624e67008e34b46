// Command gen writes configref's table of config field doc comments (fielddocs_gen.go) from
// the source of every package whose struct types configs.Config reaches. Run it with
// `go generate ./configs/configref` or `make docs`.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kvgate/kvgate/configs/configref"
	"github.com/kvgate/kvgate/configs/configref/internal/fielddoc"
)

func main() {
	root := flag.String("root", ".", "the repository's root folder")
	out := flag.String("out", "fielddocs_gen.go", "file to write")
	flag.Parse()
	src, err := fielddoc.Generate(*root, configref.Module, "configref", configref.Types())
	if err == nil {
		err = os.WriteFile(*out, []byte(src), 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}
