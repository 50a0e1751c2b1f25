package template

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// DefaultName is the template `kibotos dev` builds on the spot.
const DefaultName = "kibotos-base"

// BusyboxSizeMiB is the file system size of the busybox template: a
// Workspace's writable layer has the size of its template's file system.
const BusyboxSizeMiB = 1024

// BuildBusybox builds a small template from the static busybox of the
// Debian package busybox-static: a shell and the usual tools, /etc with
// root's account, and the directories a Workspace expects.
func BuildBusybox(ctx context.Context, storageRoot, name, busybox string) (*Template, error) {
	if busybox == "" {
		busybox = "/bin/busybox"
	}
	list, err := exec.CommandContext(ctx, busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("template %s: %s --list: %v (install the Debian package busybox-static)", name, busybox, err)
	}
	tree, err := os.MkdirTemp(Dir(storageRoot), ".busybox-"+name+"-*.tmp")
	if err != nil {
		if err := os.MkdirAll(Dir(storageRoot), 0o700); err != nil {
			return nil, err
		}
		if tree, err = os.MkdirTemp(Dir(storageRoot), ".busybox-"+name+"-*.tmp"); err != nil {
			return nil, err
		}
	}
	defer os.RemoveAll(tree)
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "tmp", "proc", "sys", "dev", "run", "var/tmp", "home"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			return nil, err
		}
	}
	os.Chmod(filepath.Join(tree, "tmp"), 0o777|os.ModeSticky) // 0o1777 would drop the sticky bit: FileMode has its own
	os.Chmod(filepath.Join(tree, "var/tmp"), 0o777|os.ModeSticky)
	os.Chmod(filepath.Join(tree, "root"), 0o700)
	b, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tree, "bin/busybox"), b, 0o755); err != nil {
		return nil, err
	}
	for _, a := range strings.Fields(string(list)) {
		if a == "busybox" || strings.Contains(a, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(tree, "bin", a)); err != nil && !os.IsExist(err) {
			return nil, err
		}
	}
	files := map[string]string{
		"etc/passwd":      "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":       "root:x:0:\nnogroup:x:65534:\n",
		"etc/shells":      "/bin/sh\n/bin/ash\n",
		"etc/profile":     "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nexport PS1='\\h:\\w\\$ '\n",
		"etc/os-release":  "NAME=\"Kibotos base (busybox)\"\nID=kibotos-base\n",
		"etc/resolv.conf": "",
	}
	for p, content := range files {
		if err := os.WriteFile(filepath.Join(tree, p), []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	// The image is sparse: its size is the room a Workspace gets for its
	// own files, not what it costs on the host.
	return Build(ctx, Options{StorageRoot: storageRoot, Name: name, FromDir: tree, SizeMiB: BusyboxSizeMiB})
}
