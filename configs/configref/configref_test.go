package configref

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/configs/configref/internal/fielddoc"
	"github.com/kvgate/kvgate/confval"
)

const regenerate = "run `make docs`"

// TestFieldDocsCurrent fails when fielddocs_gen.go no longer holds the config types' comments.
func TestFieldDocsCurrent(t *testing.T) {
	want, err := fielddoc.Generate(filepath.Join("..", ".."), Module, "configref", Types())
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("fielddocs_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("fielddocs_gen.go differs from the config types' doc comments: %s", regenerate)
	}
}

// TestEveryKeyDocumented: a config field's doc comment is its reference (BRIEF: "a full
// sentence with the default"), so a key without one fails here.
func TestEveryKeyDocumented(t *testing.T) {
	for _, s := range Build() {
		for _, k := range s.Keys {
			if strings.TrimSpace(k.Doc) == "" {
				t.Errorf("%s (%s) has no doc comment: write one on the field, then %s", k.Path, k.Owner, regenerate)
			}
		}
	}
}

func TestFormatValue(t *testing.T) {
	one := 1
	for _, tc := range []struct {
		in   any
		want string
	}{
		{confval.Duration(5 * time.Minute), "5m"},
		{confval.Duration(24 * time.Hour), "24h"},
		{confval.Duration(90 * time.Second), "1m30s"},
		{confval.Duration(25 * time.Millisecond), "25ms"},
		{confval.Duration(0), "0s"},
		{confval.ByteSize(32 << 20), "32MiB"},
		{confval.ByteSize(1000), "1000"},
		{"a", `"a"`},
		{[]string{"x", "y"}, "[x, y]"},
		{[]string(nil), "[]"},
		{0.75, "0.75"},
		{map[string]int{"b": 2, "a": 1}, `{"a": 1, "b": 2}`},
		{&one, "1"},
		{(*int)(nil), "unset"},
	} {
		if got := formatValue(reflect.ValueOf(tc.in)); got != tc.want {
			t.Errorf("formatValue(%#v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestDefaultsReadBack: every default the reference prints parses back, through the
// flag/env form, to the value configs.Default() holds.
func TestDefaultsReadBack(t *testing.T) {
	def := configs.Default()
	for _, f := range configs.Fields() {
		want := f.Value(&def).String()
		text := valueAt(reflect.ValueOf(def), f.Key)
		if text == "<no such key>" {
			t.Errorf("%s: not found by its YAML path", f.Key)
			continue
		}
		if f.Key == "workers" {
			continue
		}
		text = strings.TrimSuffix(strings.TrimPrefix(text, "["), "]")
		text = strings.ReplaceAll(text, ", ", ",")
		if uq, err := strconv.Unquote(text); err == nil {
			text = uq
		}
		c := configs.Default()
		if err := f.Value(&c).Set(text); err != nil {
			t.Errorf("%s: the reference's default %q does not parse: %v", f.Key, text, err)
			continue
		}
		if got := f.Value(&c).String(); got != want {
			t.Errorf("%s: the reference's default reads back as %q, want %q", f.Key, got, want)
		}
	}
}
