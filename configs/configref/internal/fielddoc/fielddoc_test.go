package fielddoc

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	src := `package p

// S is a section.
// Its second line.
type S struct {
	// A is the first key.
	A int
	// B and C share this comment.
	B int
	C int
	D int // D has a line comment.
	E int

	// F, alone.
	F, G string
}

// Skipped is not wanted.
type Skipped struct {
	// X is not collected.
	X int
}
`
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "p_test.go"), []byte("package p\n\ntype S2 struct {\n\t// Z.\n\tZ int\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Read(map[string]string{"m/p": dir}, map[string]bool{"m/p.S": true, "m/p.S2": true})
	if err != nil {
		t.Fatal(err)
	}
	want := Docs{
		"m/p.S":   "S is a section. Its second line.",
		"m/p.S.A": "A is the first key.",
		"m/p.S.B": "B and C share this comment.",
		"m/p.S.C": "B and C share this comment.",
		"m/p.S.D": "D has a line comment.",
		"m/p.S.F": "F, alone.",
		"m/p.S.G": "F, alone.",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Read = %#v\nwant %#v", got, want)
	}
}
