package doclinks

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// TestRepositoryLinks fails on any broken relative link or anchor in README.md and docs/.
func TestRepositoryLinks(t *testing.T) {
	root := filepath.Join("..", "..")
	files := []string{"README.md"}
	for _, pattern := range []string{"docs/*.md", "docs/benchmarks/*.md"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			rel, err := filepath.Rel(root, f)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, filepath.ToSlash(rel))
		}
	}
	if len(files) < 5 {
		t.Fatalf("found only %v: is the test running in internal/doclinks?", files)
	}
	problems, err := Check(root, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", "# Top\n\n[ok](docs/a.md) [ok anchor](docs/a.md#the-a-section) [self](#top)\n"+
		"[missing](docs/nope.md) [bad anchor](docs/a.md#nothing) [web](https://example.com/x)\n"+
		"```\n[in code](nowhere.md)\n```\n[dir](docs/) [escape](../outside.md)\n")
	write("docs/a.md", "# A\n\n## The `a` section\n\n## Twice\n\n## Twice\n\n[back](../README.md#top) [dup](#twice-1)\n")
	got, err := Check(dir, []string{"README.md", "docs/a.md"})
	if err != nil {
		t.Fatal(err)
	}
	var links []string
	for _, p := range got {
		links = append(links, p.Link)
	}
	sort.Strings(links)
	want := []string{"../outside.md", "docs/a.md#nothing", "docs/nope.md"}
	if !reflect.DeepEqual(links, want) {
		t.Fatalf("broken links %v, want %v (problems: %v)", links, want, got)
	}
}

func TestSlug(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"Collector mode (`kv_events.listen`)", "collector-mode-kv_eventslisten"},
		{"`scripts/replicas.sh`: several replicas behind HAProxy", "scriptsreplicassh-several-replicas-behind-haproxy"},
		{"Is the gateway's tokenization right? (usage feedback)", "is-the-gateways-tokenization-right-usage-feedback"},
		{"`GET /debug/sessions/{id}`", "get-debugsessionsid"},
	} {
		if got := Slug(tc.in); got != tc.want {
			t.Errorf("Slug(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestReadmeIsAFrontDoor keeps README.md the short front door issue 34 made it: reference
// belongs in docs/ (the README maps it).
func TestReadmeIsAFrontDoor(t *testing.T) {
	const maxLines = 250
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Split(strings.TrimRight(string(b), "\n"), "\n")); n > maxLines {
		t.Errorf("README.md has %d lines, more than %d: move reference into docs/ and link it from the README's map", n, maxLines)
	}
}
