package template

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// removeTree removes a build tree after unmounting anything a failed or
// cancelled debootstrap left mounted in it (/proc, /sys, a bind of /dev):
// removing through a mount would delete the host's files.
func removeTree(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	mounts := mountsUnder(abs)
	for _, m := range mounts {
		if err := syscall.Unmount(m, 0); err != nil {
			syscall.Unmount(m, syscall.MNT_DETACH)
		}
	}
	if left := mountsUnder(abs); len(left) > 0 {
		return fmt.Errorf("build tree %s kept: %s still mounted; unmount and remove it by hand", abs, strings.Join(left, ", "))
	}
	return os.RemoveAll(abs)
}

// mountsUnder lists mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func treeBytes(dir string) (int64, error) {
	var n int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n, err
}
