package buildinfo

import (
	"bytes"
	"runtime/debug"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	recorded := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/kvgate/kvgate", Version: "v0.9.1"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "1111111111111111111111111111111111111111"},
			{Key: "vcs.time", Value: "2026-12-01T10:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	tests := []struct {
		name                  string
		version, commit, date string
		bi                    *debug.BuildInfo
		want                  Info
	}{
		{"stamped wins over the record", "v1.0.0", "2222222222222222222222222222222222222222", "2026-12-05T11:00:00Z", recorded,
			Info{Version: "v1.0.0", Commit: "2222222222222222222222222222222222222222", Modified: true, GoVersion: "go1.26.8", Date: "2026-12-05T11:00:00Z", Stamped: true}},
		{"unstamped falls back to the record", "", "", "", recorded,
			Info{Version: "v0.9.1", Commit: "1111111111111111111111111111111111111111", Modified: true, GoVersion: "go1.26.8", Date: "2026-12-01T10:00:00Z"}},
		{"a devel build without vcs", "", "", "", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			Info{Version: "(devel)", Commit: "unknown", GoVersion: "go1.26.8", Date: "unknown"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := resolve(tt.version, tt.commit, tt.date, tt.bi); got != tt.want {
				t.Errorf("resolve = %+v, want %+v", got, tt.want)
			}
		})
	}
	// No build info at all (a binary built without module support): still every field set.
	got := resolve("", "", "", nil)
	if got.Version != "(devel)" || got.Commit != "unknown" || got.Date != "unknown" || !strings.HasPrefix(got.GoVersion, "go") {
		t.Errorf("resolve without build info = %+v", got)
	}
}

func TestWriteAndShort(t *testing.T) {
	i := Info{Version: "v1.0.0", Commit: "0123456789abcdef0123", Modified: true, GoVersion: "go1.26.8", Date: "2026-12-05T11:00:00Z"}
	var b bytes.Buffer
	if err := i.Write(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"version: v1.0.0\n", "commit: 0123456789abcdef0123 (modified)\n", "go: go1.26.8\n", "built: 2026-12-05T11:00:00Z\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("Write output %q lacks %q", b.String(), want)
		}
	}
	if got, want := i.Short(), "v1.0.0 (0123456789ab-dirty, go1.26.8)"; got != want {
		t.Errorf("Short = %q, want %q", got, want)
	}
}
