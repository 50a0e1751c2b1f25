// Package buildinfo says which build this is: the release (set at link time
// for released builds), the source revision and whether it is released.
package buildinfo

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sync"
)

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

// SourceRevision is the source revision. It names one build: two builds
// of the same revision and release are the same program (a node adopts
// the other's data-plane and egress processes). So a build from a tree
// with uncommitted changes, or without a VCS stamp, adds the start of its
// executable's digest: "<revision>+dirty.<sha256[:12]>" or
// "unknown.<sha256[:12]>".
func SourceRevision() string {
	if Revision != "" {
		return Revision
	}
	rev, modified := "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	switch {
	case rev != "" && !modified:
		return rev
	case rev != "":
		return rev + "+dirty." + exeDigest12()
	}
	return "unknown." + exeDigest12()
}

func exeDigest12() string {
	sum, err := ExecutableSHA256()
	if err != nil || len(sum) < 12 {
		return "unreadable"
	}
	return sum[:12]
}

var self struct {
	once sync.Once
	sha  string
	err  error
}

// ExecutableSHA256 is the hex sha256 of the running executable, computed
// once.
func ExecutableSHA256() (string, error) {
	self.once.Do(func() {
		exe, err := os.Executable()
		if err != nil {
			self.err = fmt.Errorf("find own executable: %w", err)
			return
		}
		f, err := os.Open(exe)
		if err != nil {
			self.err = err
			return
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			self.err = err
			return
		}
		self.sha = hex.EncodeToString(h.Sum(nil))
	})
	return self.sha, self.err
}
