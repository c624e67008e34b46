package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfigReferenceCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"config", "reference"}, &out, &errOut); err != nil {
		t.Fatalf("config reference: %v (%s)", err, errOut.String())
	}
	want, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != string(want) {
		t.Errorf("kvgate config reference differs from docs/configuration.md: run `make docs`")
	}

	path := filepath.Join(t.TempDir(), "ref.md")
	if err := run(context.Background(), []string{"config", "reference", "--out", path}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != string(want) {
		t.Errorf("--out wrote %d bytes (err %v), want the reference", len(got), err)
	}

	for _, args := range [][]string{{"config"}, {"config", "nonsense"}, {"config", "reference", "extra"}} {
		errOut.Reset()
		if err := run(context.Background(), args, &out, &errOut); err == nil {
			t.Errorf("kvgate %s: no error", strings.Join(args, " "))
		}
	}
}
