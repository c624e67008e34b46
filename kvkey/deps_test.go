package kvkey

import (
	"go/build"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/kvgate/kvgate"

// moduleDeps returns the module-internal packages that dir's non-test files import,
// transitively (dir relative to the repository root).
func moduleDeps(t *testing.T, root, dir string) map[string]bool {
	t.Helper()
	seen := map[string]bool{}
	var walk func(dir string)
	walk = func(dir string) {
		p, err := build.Default.ImportDir(filepath.Join(root, dir), 0)
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		for _, imp := range p.Imports {
			rel, ok := strings.CutPrefix(imp, module+"/")
			if !ok || seen[rel] {
				continue
			}
			seen[rel] = true
			walk(rel)
		}
	}
	walk(dir)
	return seen
}

// The package table in docs/ARCHITECTURE.md: kvkey is a leaf; the event index and the sessions
// layer depend on it instead of the tokenizer (whose Jinja engine they have no use for) or the
// worker registry, and sessions does not import the index (it declares Residency).
func TestImportBoundaries(t *testing.T) {
	tests := []struct {
		pkg       string
		forbidden []string // module packages (and their subpackages; "=p": p only) pkg must not reach
	}{
		{"kvkey", []string{""}},
		{"indexers", []string{"tokenize", "workers", "configs"}},
		{"sessions", []string{"indexers", "tokenize", "workers", "configs"}},
		// The request model sits below the server and the routing side; of the tokenizer it
		// needs only the body parser (tokenize/chat), not the engine or the tokenizer itself.
		{"apireq", []string{"server", "router", "sessions", "indexers", "workers", "configs", "tokenize/engine", "=tokenize"}},
		// Routing shares state with peer replicas through interfaces it declares; the NATS side
		// (cluster) depends on router, never the reverse.
		{"router", []string{"cluster"}},
	}
	for _, tc := range tests {
		t.Run(tc.pkg, func(t *testing.T) {
			for dep := range moduleDeps(t, "..", tc.pkg) {
				for _, f := range tc.forbidden {
					if exact, ok := strings.CutPrefix(f, "="); ok {
						if dep == exact {
							t.Errorf("%s depends on %s", tc.pkg, dep)
						}
						continue
					}
					if f == "" || dep == f || strings.HasPrefix(dep, f+"/") {
						t.Errorf("%s depends on %s", tc.pkg, dep)
					}
				}
			}
		})
	}
}
