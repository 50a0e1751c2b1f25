package template

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
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
// shell, no daemons started by apt, no apt lists or package cache), then
// imaged by Build. debootstrap needs root.
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

// rootShell makes root's login shell bash when the tree has it.
func rootShell(tree string) error {
	shell := "/bin/sh"
	if _, err := os.Stat(filepath.Join(tree, "bin/bash")); err == nil {
		shell = "/bin/bash"
	}
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

// Where apt's sources live, in the order apt reads them.
var (
	aptSourcesList = "/etc/apt/sources.list"
	aptSourcesDir  = "/etc/apt/sources.list.d"
)

// HostMirror returns the Debian archive apt uses on this host for suite:
// the URI of the first enabled "deb" source listing that suite, else of the
// first one that is not a security archive. It reads
// /etc/apt/sources.list and /etc/apt/sources.list.d/*.list (one-line
// format) and /etc/apt/sources.list.d/*.sources (deb822 format).
func HostMirror(suite string) (string, error) {
	files := []string{aptSourcesList}
	for _, pattern := range []string{"*.list", "*.sources"} {
		m, _ := filepath.Glob(filepath.Join(aptSourcesDir, pattern))
		files = append(files, m...)
	}
	sort.Strings(files[1:])
	return MirrorFromFiles(files, suite)
}

// MirrorFromFiles is HostMirror over the given apt source files; a name
// ending in .sources is deb822, any other the one-line format.
func MirrorFromFiles(files []string, suite string) (string, error) {
	var all []aptSource
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if strings.HasSuffix(f, ".sources") {
			all = append(all, parseDeb822(b)...)
		} else {
			all = append(all, parseOneLine(b)...)
		}
	}
	if m := pickMirror(all, suite); m != "" {
		return m, nil
	}
	return "", fmt.Errorf("no Debian mirror found in %s: pass --mirror URL (e.g. --mirror http://deb.debian.org/debian)", strings.Join(files, ", "))
}

type aptSource struct {
	uri    string
	suites []string
}

func pickMirror(all []aptSource, suite string) string {
	for _, s := range all {
		for _, x := range s.suites {
			if x == suite {
				return s.uri
			}
		}
	}
	for _, s := range all {
		security := false
		for _, x := range s.suites {
			security = security || strings.Contains(x, "security") || strings.HasSuffix(x, "/updates")
		}
		if !security && !strings.Contains(s.uri, "security") {
			return s.uri
		}
	}
	return ""
}

func usableURI(u string) bool {
	return checkMirror(u) == nil
}

// parseOneLine reads `deb [options] URI suite component...` lines.
func parseOneLine(b []byte) []aptSource {
	var out []aptSource
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") {
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) < 2 || !usableURI(f[0]) {
			continue
		}
		out = append(out, aptSource{uri: strings.TrimRight(f[0], "/"), suites: []string{f[1]}})
	}
	return out
}

// parseDeb822 reads the stanzas of a .sources file: Types, URIs, Suites,
// Enabled; continuation lines start with a space, stanzas end at a blank
// line.
func parseDeb822(b []byte) []aptSource {
	var out []aptSource
	fields := map[string]string{}
	last := ""
	flush := func() {
		defer func() { fields, last = map[string]string{}, "" }()
		if strings.EqualFold(strings.TrimSpace(fields["enabled"]), "no") {
			return
		}
		deb := false
		for _, t := range strings.Fields(fields["types"]) {
			deb = deb || t == "deb"
		}
		if !deb {
			return
		}
		suites := strings.Fields(fields["suites"])
		for _, u := range strings.Fields(fields["uris"]) {
			if usableURI(u) {
				out = append(out, aptSource{uri: strings.TrimRight(u, "/"), suites: suites})
			}
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#"):
		case strings.TrimSpace(line) == "":
			flush()
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				fields[last] += " " + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			fields[last] = strings.TrimSpace(v)
		}
	}
	flush()
	return out
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
