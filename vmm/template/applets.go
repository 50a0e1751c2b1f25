package template

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
)

// disableApplet returns a copy of the busybox binary bin that no longer
// knows the applet name, and the name the applet now has. applets is what
// `busybox --list` printed: busybox keeps the names in that order, NUL
// separated, in one sorted table that it searches for every applet call,
// so the table is found by its whole content (exactly once, or nothing is
// changed) and the name is overwritten in place by one of the same length
// that keeps the table sorted and that no one types ("wget" -> "wge~").
//
// A copy of the GNU tool is not enough: Debian's busybox-static is built
// with FEATURE_SH_STANDALONE, so its sh runs an applet for a command of
// that name before looking at PATH at all.
func disableApplet(bin []byte, applets []string, name string) ([]byte, string, error) {
	i := slices.Index(applets, name)
	if i < 0 {
		return nil, "", fmt.Errorf("busybox has no %s applet to disable", name)
	}
	table := []byte("\x00" + strings.Join(applets, "\x00") + "\x00")
	at := bytes.Index(bin, table)
	if at < 0 || bytes.Index(bin[at+1:], table) >= 0 {
		return nil, "", fmt.Errorf("busybox's table of applet names not found exactly once: cannot disable %s", name)
	}
	renamed := name[:len(name)-1] + "~"
	if renamed <= name || (i > 0 && renamed <= applets[i-1]) || (i+1 < len(applets) && renamed >= applets[i+1]) || slices.Contains(applets, renamed) {
		return nil, "", fmt.Errorf("cannot rename busybox's %s applet to %s and keep its table sorted", name, renamed)
	}
	off := at + 1 + len(strings.Join(applets[:i], "\x00"))
	if i > 0 {
		off++ // the NUL after the previous name
	}
	out := bytes.Clone(bin)
	copy(out[off:], renamed)
	return out, renamed, nil
}
