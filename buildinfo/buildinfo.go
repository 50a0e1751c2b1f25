// Package buildinfo says which build this is: the release (set at link time
// for released builds), the source revision and whether it is released.
package buildinfo

import "runtime/debug"

// Release is set with -ldflags "-X github.com/kibotos/kibotos/buildinfo.Release=v0.1.0"
// for a released build; anything else is "unreleased".
var Release = ""

// Revision is set with -ldflags "-X ...buildinfo.Revision=<git sha>"; when
// empty, the VCS stamp of the Go toolchain is used if there is one.
var Revision = ""

// ReleaseName is the release or "unreleased".
func ReleaseName() string {
	if Release == "" {
		return "unreleased"
	}
	return Release
}

// Released reports whether this is a released build.
func Released() bool { return Release != "" }

// SourceRevision is the source revision, or "unknown".
func SourceRevision() string {
	if Revision != "" {
		return Revision
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}
