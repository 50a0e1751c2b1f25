package template

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// DefaultName is the template `kibotos dev` builds on the spot.
const DefaultName = "kibotos-base"

// BusyboxSizeMiB is the file system size of the busybox template: a
// Workspace's writable layer has the size of its template's file system.
const BusyboxSizeMiB = 1024

// busyboxNeeds are the applets the template takes from busybox that a new
// user reaches for first: a shell and nc.
var busyboxNeeds = []string{"sh", "nc"}

// The template's wget is GNU wget with its shared objects, not busybox's:
// Debian 12's busybox (1.35.0-4) is built without FEATURE_WGET_TIMEOUT yet
// still parses -T into a NULL pointer, so `wget -T 5 URL` dies of SIGSEGV
// before it connects (fixed in Debian's 1.36.1-5); it also cannot verify
// TLS certificates. GNU wget from the host's package wget (installed by
// scripts/install-deps.sh) has -T and verifies against the host's
// ca-certificates bundle, copied in too. busybox's wget applet is disabled
// (disableApplet): its sh would run it for every `wget` otherwise.
var (
	hostWget     = "/usr/bin/wget"
	hostCABundle = "/etc/ssl/certs/ca-certificates.crt"
)

// busyboxNohup is the template's nohup when busybox has none (Debian
// 12's busybox-static is built without the applet): `nohup CMD &` is how
// users leave a server running after their exec ends, and without it the
// shell only says "nohup: not found" on an output they sent to /dev/null.
// It does what POSIX asks of nohup: SIGHUP ignored (inherited across
// exec), a terminal on standard output replaced by nohup.out (in the
// working directory, else in $HOME), a terminal on standard error sent
// where standard output goes, a terminal on standard input replaced by
// /dev/null (as GNU nohup does), 125 when it fails itself, and the exec's
// 126 or 127 when the command cannot run.
const busyboxNohup = `#!/bin/sh
# nohup: run a command immune to hangups (the busybox template's; see
# kibotos vmm/template/busybox.go).
[ "$1" = -- ] && shift
if [ $# -eq 0 ] || [ "$1" = --help ]; then
	echo "usage: nohup COMMAND [ARG]..." >&2
	exit 125
fi
if [ -t 0 ]; then
	exec </dev/null
fi
if [ -t 1 ]; then
	out=nohup.out
	if ! ( : >>"$out" ) 2>/dev/null; then
		out="${HOME:-/}/nohup.out"
		if ! ( : >>"$out" ) 2>/dev/null; then
			echo "nohup: cannot open nohup.out here or in ${HOME:-/}: make one of them writable" >&2
			exit 125
		fi
	fi
	echo "nohup: ignoring input and appending output to '$out'" >&2
	exec >>"$out"
fi
if [ -t 2 ]; then
	exec 2>&1
fi
trap '' HUP
exec "$@"
`

// busyboxEtc is the /etc of the busybox template.
//
// Name resolution needs no NSS modules: since glibc 2.34 the files and dns
// modules are part of libc itself, so the static busybox of Debian 12
// (glibc 2.36) and wget's copied libc.so.6 read nsswitch.conf, hosts and
// resolv.conf on their own and dlopen no libnss_*.so (checked with strace).
//
// What they do need are the files: without /etc/hosts "localhost" does
// not resolve at all. nsswitch.conf writes down the order Debian's glibc
// defaults to anyway (files, then dns) for the programs that read it
// themselves. resolv.conf is an empty regular file: the node bind-mounts
// the guest agent's resolv.conf, which Configure writes, over it (a
// symlink there would be followed outside the Workspace's root).
var busyboxEtc = map[string]string{
	"etc/passwd":        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
	"etc/group":         "root:x:0:\nnogroup:x:65534:\n",
	"etc/shells":        "/bin/sh\n/bin/ash\n",
	"etc/profile":       "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nexport PS1='\\h:\\w\\$ '\n",
	"etc/os-release":    "NAME=\"Kibotos base (busybox)\"\nID=kibotos-base\n",
	"etc/hosts":         "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	"etc/nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n",
	"etc/resolv.conf":   "",
}

// BuildBusybox builds a small template from the static busybox of the
// Debian package busybox-static: a shell and the usual tools, nc among
// them, GNU wget (see hostWget), name resolution through /etc/hosts and
// the nameserver of /etc/resolv.conf, /etc with root's account, and the
// directories a Workspace expects.
func BuildBusybox(ctx context.Context, storageRoot, name, busybox string) (*Template, error) {
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
	if err := busyboxTree(ctx, tree, busybox); err != nil {
		return nil, fmt.Errorf("template %s: %w", name, err)
	}
	// The image is sparse: its size is the room a Workspace gets for its
	// own files, not what it costs on the host.
	return Build(ctx, Options{StorageRoot: storageRoot, Name: name, FromDir: tree, SizeMiB: BusyboxSizeMiB})
}

// busyboxTree writes the busybox template's tree into the empty
// directory tree.
func busyboxTree(ctx context.Context, tree, busybox string) error {
	if busybox == "" {
		busybox = "/bin/busybox"
	}
	list, err := exec.CommandContext(ctx, busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("%s --list: %v (install the Debian package busybox-static)", busybox, err)
	}
	applets := strings.Fields(string(list))
	for _, a := range busyboxNeeds {
		if !slices.Contains(applets, a) {
			return fmt.Errorf("%s has no %s applet; the template needs %s (the Debian package busybox-static has them)", busybox, a, strings.Join(busyboxNeeds, ", "))
		}
	}
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "tmp", "proc", "sys", "dev", "run", "var/tmp", "home"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			return err
		}
	}
	os.Chmod(filepath.Join(tree, "tmp"), 0o777|os.ModeSticky) // 0o1777 would drop the sticky bit: FileMode has its own
	os.Chmod(filepath.Join(tree, "var/tmp"), 0o777|os.ModeSticky)
	os.Chmod(filepath.Join(tree, "root"), 0o700)
	b, err := os.ReadFile(busybox)
	if err != nil {
		return err
	}
	disabled := ""
	if slices.Contains(applets, "wget") {
		if b, disabled, err = disableApplet(b, applets, "wget"); err != nil {
			return fmt.Errorf("%s: %w", busybox, err)
		}
	}
	bin := filepath.Join(tree, "bin/busybox")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		return err
	}
	if disabled != "" {
		// The changed busybox must list every other applet as before.
		list, err := exec.CommandContext(ctx, bin, "--list").Output()
		want := slices.Clone(applets)
		want[slices.Index(want, "wget")] = disabled
		if err != nil || !slices.Equal(strings.Fields(string(list)), want) {
			return fmt.Errorf("%s with its wget applet disabled does not list its other applets as before (%v): keep busybox-static as Debian ships it", busybox, err)
		}
	}
	for _, a := range applets {
		if a == "busybox" || a == "wget" || strings.Contains(a, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(tree, "bin", a)); err != nil && !os.IsExist(err) {
			return err
		}
	}
	for p, content := range busyboxEtc {
		if err := os.WriteFile(filepath.Join(tree, p), []byte(content), 0o644); err != nil {
			return err
		}
	}
	if !slices.Contains(applets, "nohup") {
		if err := os.WriteFile(filepath.Join(tree, "usr/bin/nohup"), []byte(busyboxNohup), 0o755); err != nil {
			return err
		}
	}
	if _, err := os.Stat(hostWget); err != nil {
		return fmt.Errorf("wget for the template: %w (install the Debian package wget)", err)
	}
	if err := copyProgram(tree, hostWget, "usr/bin/wget"); err != nil {
		return fmt.Errorf("wget for the template: %w", err)
	}
	// Scripts that call /bin/wget get the same one.
	if err := os.Symlink("../usr/bin/wget", filepath.Join(tree, "bin/wget")); err != nil {
		return err
	}
	if err := copyResolved(hostCABundle, filepath.Join(tree, "etc/ssl/certs/ca-certificates.crt")); err != nil {
		return fmt.Errorf("CA certificates for the template's wget: %w (install the Debian package ca-certificates)", err)
	}
	return nil
}
