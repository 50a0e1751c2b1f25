package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Defaults of BuildDebootstrap.
const (
	DefaultSuite   = "bookworm"
	DefaultVariant = "minbase"
	// DebianMinSizeMiB is the least file system size of a Debian
	// template: the image is sparse, so the size is the room a Workspace
	// gets for its own files (apt install and the like), not what the
	// image costs on the host.
	DebianMinSizeMiB = 4096
)

// Kinds of BuildDebootstrap errors, for errors.Is.
var (
	// ErrDebootstrapPrereq: this host cannot run debootstrap as asked
	// (not installed, not root, no mirror found).
	ErrDebootstrapPrereq = errors.New("debootstrap prerequisite missing")
	// ErrDebootstrapFailed: debootstrap ran and failed (mirror, network,
	// package names).
	ErrDebootstrapFailed = errors.New("debootstrap failed")
)

// kindError is err that also matches kind under errors.Is, with err's text.
type kindError struct{ kind, err error }

func (e kindError) Error() string    { return e.err.Error() }
func (e kindError) Unwrap() []error  { return []error{e.kind, e.err} }
func withKind(kind, err error) error { return kindError{kind, err} }

// Variants BuildDebootstrap accepts: debootstrap's minbase (essential
// packages and apt) and buildd (plus build-essential), and "standard":
// debootstrap without --variant (required and important packages).
var Variants = []string{"minbase", "buildd", "standard"}

// DebootstrapOptions of BuildDebootstrap.
type DebootstrapOptions struct {
	StorageRoot string
	Name        string
	// Suite is the Debian release, e.g. bookworm; default DefaultSuite.
	Suite string
	// Mirror is the Debian archive URL; default: the one apt uses on this
	// host (HostMirror).
	Mirror string
	// Include are extra packages to install.
	Include []string
	// Variant is one of Variants; default DefaultVariant.
	Variant string
	// SizeMiB of the image; 0: the content plus 2 GiB, at least
	// DebianMinSizeMiB.
	SizeMiB int
	// Debootstrap is the executable; default "debootstrap" on PATH.
	Debootstrap string
	// Progress receives debootstrap's output; nil discards it.
	Progress io.Writer
	// User is the account every exec runs as (AddDefaultUser); none:
	// root. With User.Sudo, Validate adds the package sudo to Include.
	User DefaultUser
}

var (
	suiteRE   = regexp.MustCompile(`^[a-z][a-z0-9.-]{0,39}$`)
	packageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]{1,99}$`)
)

// Validate checks the options and fills in the defaults except Mirror.
func (o *DebootstrapOptions) Validate() error {
	if !nameRE.MatchString(o.Name) {
		return fmt.Errorf("template name %q is not valid: use 1-63 lower-case letters, digits, '.' or '-'", o.Name)
	}
	if o.Suite == "" {
		o.Suite = DefaultSuite
	}
	if !suiteRE.MatchString(o.Suite) {
		return fmt.Errorf("template %s: suite %q is not a Debian suite name such as bookworm or trixie", o.Name, o.Suite)
	}
	if o.Variant == "" {
		o.Variant = DefaultVariant
	}
	known := false
	for _, v := range Variants {
		known = known || v == o.Variant
	}
	if !known {
		return fmt.Errorf("template %s: variant %q is not one of %s", o.Name, o.Variant, strings.Join(Variants, ", "))
	}
	for _, p := range o.Include {
		if !packageRE.MatchString(p) {
			return fmt.Errorf("template %s: %q is not a Debian package name (--include takes pkg1,pkg2)", o.Name, p)
		}
	}
	if o.User.Name != "" {
		if err := CheckUserName(o.User.Name); err != nil {
			return fmt.Errorf("template %s: %w", o.Name, err)
		}
	} else if o.User.Sudo {
		return fmt.Errorf("template %s: sudo is for the default user: name one (--user NAME)", o.Name)
	}
	if o.User.Sudo && !slices.Contains(o.Include, "sudo") {
		// A copy: the caller's slice is not ours to append to.
		o.Include = append(slices.Clip(o.Include), "sudo")
	}
	if o.Mirror != "" {
		if err := checkMirror(o.Mirror); err != nil {
			return fmt.Errorf("template %s: mirror: %w", o.Name, err)
		}
	}
	if o.SizeMiB < 0 {
		return fmt.Errorf("template %s: size %d MiB is negative", o.Name, o.SizeMiB)
	}
	return nil
}

func checkMirror(m string) error {
	u, err := url.Parse(m)
	if err != nil {
		return err
	}
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return fmt.Errorf("%q has no host", m)
		}
	case "file":
		if u.Path == "" {
			return fmt.Errorf("%q has no path", m)
		}
	default:
		return fmt.Errorf("%q is not an http, https or file URL of a Debian archive", m)
	}
	return nil
}

// BuildDebootstrap builds a Debian template with debootstrap: the tree is
// made in a temporary directory under the storage root, fitted for a
// Workspace (hostname, hosts, an empty resolv.conf the node fills in, root's
// shell, no daemons started by apt, no apt lists or package cache), given
// o.User as the account every exec runs as when it names one, then imaged
// by Build. debootstrap needs root.
func BuildDebootstrap(ctx context.Context, o DebootstrapOptions) (t *Template, err error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Mirror == "" {
		m, err := HostMirror(o.Suite)
		if err != nil {
			return nil, withKind(ErrDebootstrapPrereq, fmt.Errorf("template %s: %w", o.Name, err))
		}
		o.Mirror = m
	}
	exe := o.Debootstrap
	if exe == "" {
		exe = "debootstrap"
	}
	exe, err = exec.LookPath(exe)
	if err != nil {
		return nil, withKind(ErrDebootstrapPrereq, fmt.Errorf("template %s: debootstrap not found: install the Debian package debootstrap (scripts/install-deps.sh does)", o.Name))
	}
	if os.Geteuid() != 0 {
		return nil, withKind(ErrDebootstrapPrereq, fmt.Errorf("template %s: debootstrap needs root (it creates device nodes, chroots and sets file owners): run as root", o.Name))
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return nil, withKind(ErrDebootstrapPrereq, errors.New("template "+o.Name+": mkfs.ext4 not found: install the Debian package e2fsprogs"))
	}
	if err := os.MkdirAll(Dir(o.StorageRoot), 0o700); err != nil {
		return nil, err
	}
	// Under the storage root, not /tmp: the tree is hundreds of MiB, may
	// hold device nodes, and /tmp can be wiped under us.
	work, err := os.MkdirTemp(Dir(o.StorageRoot), ".debootstrap-"+o.Name+"-*.tmp")
	if err != nil {
		return nil, err
	}
	defer func() {
		if rerr := removeTree(work); rerr != nil {
			if err == nil {
				t, err = nil, fmt.Errorf("template %s: built %s, but %w", o.Name, t.ID, rerr)
			} else {
				err = fmt.Errorf("%w; and %v", err, rerr)
			}
		}
	}()
	tree := filepath.Join(work, "rootfs")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return nil, err
	}
	if err := runDebootstrap(ctx, exe, o, tree); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("template %s: %w", o.Name, err)
		}
		return nil, withKind(ErrDebootstrapFailed, fmt.Errorf("template %s: %w", o.Name, err))
	}
	if err := FitDebianTree(tree); err != nil {
		return nil, fmt.Errorf("template %s: fit the tree for a Workspace: %w", o.Name, err)
	}
	if o.User.Name != "" {
		if err := AddDefaultUser(tree, o.User); err != nil {
			return nil, fmt.Errorf("template %s: %w", o.Name, err)
		}
	}
	size := o.SizeMiB
	if size == 0 {
		content, err := treeBytes(tree)
		if err != nil {
			return nil, err
		}
		size = int(content>>20) + 2048
		if size < DebianMinSizeMiB {
			size = DebianMinSizeMiB
		}
	}
	source := "debootstrap:" + o.Suite + "/" + o.Variant
	if len(o.Include) > 0 {
		source += "+" + strings.Join(o.Include, ",")
	}
	if o.User.Name != "" {
		source += " user=" + o.User.Name
		if o.User.Sudo {
			source += ",sudo"
		}
	}
	source += " " + o.Mirror
	return Build(ctx, Options{StorageRoot: o.StorageRoot, Name: o.Name, FromDir: tree, SizeMiB: size, Source: source})
}

func runDebootstrap(ctx context.Context, exe string, o DebootstrapOptions, tree string) error {
	args := []string{}
	if o.Variant != "standard" {
		args = append(args, "--variant="+o.Variant)
	}
	if len(o.Include) > 0 {
		args = append(args, "--include="+strings.Join(o.Include, ","))
	}
	args = append(args, o.Suite, tree, o.Mirror)
	cmd := exec.CommandContext(ctx, exe, args...)
	// Its own process group, ended with SIGTERM so debootstrap's exit
	// trap unmounts /proc and /sys from the tree.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	tail := &tailWriter{max: 12}
	var w io.Writer = tail
	if o.Progress != nil {
		w = io.MultiWriter(tail, o.Progress)
	}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("debootstrap %s stopped: %w", o.Suite, ctx.Err())
		}
		// debootstrap's own log says what failed to download or install.
		if b, lerr := os.ReadFile(filepath.Join(tree, "debootstrap", "debootstrap.log")); lerr == nil {
			tail.Write(lastLines(b, 4))
		}
		return fmt.Errorf("debootstrap %s from %s: %v: %s (check the mirror, or pass --mirror URL and --suite)", o.Suite, o.Mirror, err, tail.oneLine())
	}
	return nil
}

// FitDebianTree makes a debootstrapped tree fit to be a Workspace's root:
// the node sets the hostname and DNS later, the guest agent execs commands
// chrooted in it (no init, no daemons), and the image stays small.
func FitDebianTree(tree string) error {
	write := func(rel, content string, mode os.FileMode) error {
		p := filepath.Join(tree, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		os.Remove(p) // may be a symlink to the host's file
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			return err
		}
		return os.Chmod(p, mode)
	}
	if err := write("etc/hostname", "kibotos\n", 0o644); err != nil {
		return err
	}
	if err := write("etc/hosts", "127.0.0.1\tlocalhost\n127.0.1.1\tkibotos\n::1\tlocalhost ip6-localhost ip6-loopback\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n", 0o644); err != nil {
		return err
	}
	// debootstrap copies the host's resolv.conf (or leaves a symlink to
	// it). An empty regular file instead: the node bind-mounts the guest
	// agent's resolv.conf, which configure writes, over it.
	if err := write("etc/resolv.conf", "", 0o644); err != nil {
		return err
	}
	// apt inside a Workspace must not start daemons: there is no init.
	if err := write("usr/sbin/policy-rc.d", "#!/bin/sh\n# kibotos: a Workspace has no init; do not start services.\nexit 101\n", 0o755); err != nil {
		return err
	}
	if err := rootShell(tree); err != nil {
		return err
	}
	// Per-machine identities must not be shared by every Workspace.
	os.Remove(filepath.Join(tree, "etc/machine-id"))
	os.Remove(filepath.Join(tree, "var/lib/dbus/machine-id"))
	if keys, _ := filepath.Glob(filepath.Join(tree, "etc/ssh/ssh_host_*")); len(keys) > 0 {
		for _, k := range keys {
			os.Remove(k)
		}
	}
	// Small image: no package lists (apt update fetches them), no .debs.
	for _, pattern := range []string{"var/lib/apt/lists/*", "var/lib/apt/lists/partial/*", "var/cache/apt/archives/*.deb", "var/cache/apt/archives/partial/*", "var/cache/apt/*.bin", "var/log/bootstrap.log"} {
		matches, _ := filepath.Glob(filepath.Join(tree, pattern))
		for _, m := range matches {
			if fi, err := os.Lstat(m); err == nil && fi.IsDir() {
				continue // lists/partial, archives/partial stay
			}
			if err := os.Remove(m); err != nil {
				return err
			}
		}
	}
	for _, d := range []string{"tmp", "var/tmp"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			return err
		}
		if err := os.Chmod(filepath.Join(tree, d), 0o777|os.ModeSticky); err != nil {
			return err
		}
	}
	return nil
}

// treeShell is /bin/bash when the tree has it, else /bin/sh: the login
// shell of the accounts a build adds or fixes.
func treeShell(tree string) string {
	r, err := os.OpenRoot(tree)
	if err != nil {
		return "/bin/sh"
	}
	defer r.Close()
	if fi, err := r.Stat("bin/bash"); err == nil && fi.Mode().IsRegular() {
		return "/bin/bash"
	}
	return "/bin/sh"
}

// rootShell makes root's login shell bash when the tree has it.
func rootShell(tree string) error {
	shell := treeShell(tree)
	p := filepath.Join(tree, "etc/passwd")
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	lines := strings.Split(string(b), "\n")
	found := false
	for i, l := range lines {
		f := strings.Split(l, ":")
		if len(f) == 7 && f[0] == "root" {
			f[5], f[6] = "/root", shell
			lines[i], found = strings.Join(f, ":"), true
		}
	}
	if !found {
		return fmt.Errorf("%s has no root account", p)
	}
	return os.WriteFile(p, []byte(strings.Join(lines, "\n")), 0o644)
}

// tailWriter keeps the last lines written.
type tailWriter struct {
	mu    sync.Mutex
	max   int
	lines []string
	part  string
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.part + strings.ReplaceAll(string(p), "\r", "\n")
	parts := strings.Split(s, "\n")
	t.part = parts[len(parts)-1]
	for _, l := range parts[:len(parts)-1] {
		if l = strings.TrimSpace(l); l != "" {
			t.lines = append(t.lines, l)
		}
	}
	if len(t.lines) > t.max {
		t.lines = t.lines[len(t.lines)-t.max:]
	}
	return len(p), nil
}

func (t *tailWriter) oneLine() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := append([]string(nil), t.lines...)
	if p := strings.TrimSpace(t.part); p != "" {
		l = append(l, p)
	}
	if len(l) > 6 {
		l = l[len(l)-6:]
	}
	if len(l) == 0 {
		return "no output"
	}
	return strings.Join(l, " | ")
}

func lastLines(b []byte, n int) []byte {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return []byte(strings.Join(lines, "\n") + "\n")
}
