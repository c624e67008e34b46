// Package buildinfo reports what a kvgate binary was built from: the version, commit and build
// date that scripts/build-release.sh stamps with -ldflags -X, or, in a plain `go build` or
// `go install`, what the Go toolchain recorded (runtime/debug.ReadBuildInfo).
package buildinfo

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// The stamped values. They are set only by the linker (-ldflags "-X
// github.com/kvgate/kvgate/internal/buildinfo.version=..."), which can write nothing but a
// package-level string variable; nothing assigns them at run time.
var (
	version string
	commit  string
	date    string
)

// Info is what a binary was built from.
type Info struct {
	Version   string // release version (a tag, or git describe), "(devel)" for a plain build
	Commit    string // full commit hash, "unknown" when neither stamped nor recorded
	Modified  bool   // the tree had uncommitted changes (known only from the toolchain's record)
	GoVersion string // the Go toolchain that built it
	Date      string // build date (RFC 3339, UTC), else the commit's date, else "unknown"
	Stamped   bool   // the values come from build-release.sh's -X flags
}

// Get returns this binary's Info: the stamped values where present, else the toolchain's
// record (module version, vcs.revision, vcs.time, vcs.modified).
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(version, commit, date, bi)
}

// resolve merges the stamped values over bi (nil when the binary carries no build info).
func resolve(version, commit, date string, bi *debug.BuildInfo) Info {
	info := Info{Version: version, Commit: commit, Date: date, GoVersion: runtime.Version(),
		Stamped: version != "" || commit != ""}
	var vcsTime string
	if bi != nil {
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
		if info.Version == "" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if info.Commit == "" {
					info.Commit = s.Value
				}
			case "vcs.time":
				vcsTime = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if info.Version == "" {
		info.Version = "(devel)"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	if info.Date == "" {
		info.Date = vcsTime
	}
	if info.Date == "" {
		info.Date = "unknown"
	}
	return info
}

// Short is the one-line form for logs: "v1.2.0 (abc1234, go1.26.8)".
func (i Info) Short() string {
	c := i.Commit
	if len(c) > 12 {
		c = c[:12]
	}
	if i.Modified {
		c += "-dirty"
	}
	return fmt.Sprintf("%s (%s, %s)", i.Version, c, i.GoVersion)
}

// Write prints the long form, one "key: value" line each, as `kvgate version` shows it.
func (i Info) Write(w io.Writer) error {
	c := i.Commit
	if i.Modified {
		c += " (modified)"
	}
	_, err := fmt.Fprintf(w, "version: %s\ncommit: %s\ngo: %s\nbuilt: %s\nplatform: %s/%s\n",
		i.Version, c, i.GoVersion, i.Date, runtime.GOOS, runtime.GOARCH)
	return err
}
