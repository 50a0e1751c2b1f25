package buildinfo

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Releases are semantic versions, MAJOR.MINOR.PATCH with an optional
// -alpha.N or -beta.N (a leading "v" is accepted). Two builds are on the
// same release line when MAJOR.MINOR match and neither is a pre-release
// or unreleased (the process-model seed): only then may one hand its
// running processes to the other without ending them.

// Version is a parsed release.
type Version struct {
	Major, Minor, Patch int
	// Pre is "alpha.N" or "beta.N", "" for a final release.
	Pre string
}

var releasePattern = regexp.MustCompile(`^v?(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})(-(alpha|beta)\.(0|[1-9][0-9]{0,5}))?$`)

// ParseRelease reads a release such as "0.2.0", "v1.4.2" or "0.3.0-beta.2".
func ParseRelease(s string) (Version, error) {
	m := releasePattern.FindStringSubmatch(s)
	if m == nil {
		return Version{}, fmt.Errorf("release %q is not MAJOR.MINOR.PATCH with an optional -alpha.N or -beta.N, such as 0.2.0 or 0.3.0-beta.1", s)
	}
	atoi := func(x string) int { n, _ := strconv.Atoi(x); return n }
	v := Version{Major: atoi(m[1]), Minor: atoi(m[2]), Patch: atoi(m[3])}
	if m[4] != "" {
		v.Pre = m[5] + "." + m[6]
	}
	return v, nil
}

func (v Version) String() string {
	s := fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
	if v.Pre != "" {
		s += "-" + v.Pre
	}
	return s
}

// Line is the release line of a final release, "MAJOR.MINOR"; "" for a
// pre-release.
func (v Version) Line() string {
	if v.Pre != "" {
		return ""
	}
	return fmt.Sprintf("%d.%d", v.Major, v.Minor)
}

// SameLine reports whether builds of releases a and b ("unreleased" or
// "" for an unreleased build) are on the same release line.
func SameLine(a, b string) bool {
	va, err := ParseRelease(a)
	if err != nil {
		return false
	}
	vb, err := ParseRelease(b)
	if err != nil {
		return false
	}
	return va.Line() != "" && va.Line() == vb.Line()
}

// Compare orders releases: -1 when v is older than w, 0 when equal, 1
// when newer. A pre-release comes before its final release, alpha before
// beta, then by number.
func (v Version) Compare(w Version) int {
	for _, d := range [][2]int{{v.Major, w.Major}, {v.Minor, w.Minor}, {v.Patch, w.Patch}} {
		if d[0] != d[1] {
			return cmpInt(d[0], d[1])
		}
	}
	switch {
	case v.Pre == w.Pre:
		return 0
	case v.Pre == "":
		return 1
	case w.Pre == "":
		return -1
	}
	vk, vn := splitPre(v.Pre)
	wk, wn := splitPre(w.Pre)
	if vk != wk {
		if vk < wk { // "alpha" < "beta"
			return -1
		}
		return 1
	}
	return cmpInt(vn, wn)
}

func splitPre(p string) (string, int) {
	kind, num, _ := strings.Cut(p, ".")
	n, _ := strconv.Atoi(num)
	return kind, n
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
