package testhost

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// initEnv carries the initConfig to the re-executed binary that becomes
// PID 1 of the new namespaces; init() below takes over only when it is set
// AND the process is PID 1 of its PID namespace.
const initEnv = "KIBOTOS_TESTHOST_INIT"

const (
	systemdBinary = "/usr/lib/systemd/systemd"
	unitDir       = "/usr/lib/systemd/system"
	targetUnit    = "kibotos-testhost.target"
	emptyDir      = "/run/kibotos-testhost-empty"
)

// keptUnits are the machine's units the host keeps: power-off, the
// targets a packaged service is ordered against, and journald (so a
// service's output is in the journal, as on a real host). Everything else
// in the unit directories is whited out in the overlay.
var keptUnits = []string{
	"shutdown.target", "poweroff.target", "systemd-poweroff.service", "final.target", "umount.target",
	"multi-user.target", "network.target", "network-online.target", "sockets.target",
	"systemd-journald.service", "systemd-journald.socket", "systemd-journald-dev-log.socket",
}

// ownUnits replace the machine's: an empty sysinit.target and basic.target
// (the real ones pull in tmpfiles, udev, binfmt, modules-load...) and the
// default target.
var ownUnits = map[string]string{
	targetUnit:       "[Unit]\nDescription=kibotos test host\nWants=systemd-journald.service\nAllowIsolate=yes\n",
	"sysinit.target": "[Unit]\nDescription=sysinit (empty, kibotos test host)\n",
	"basic.target":   "[Unit]\nDescription=basic (empty, kibotos test host)\nRequires=sysinit.target\nAfter=sysinit.target\n",
}

type initConfig struct {
	Dir      string // holds root/ and layer/
	Console  string // file bound onto /dev/console
	Hostname string
	Shares   []Share
}

func init() {
	raw := os.Getenv(initEnv)
	if raw == "" || os.Getpid() != 1 {
		return
	}
	err := runInit(raw)
	fmt.Fprintf(os.Stderr, "kibotos testhost: preparing the host failed: %v\n", err)
	os.Exit(1)
}

// runInit builds the host's root and execs systemd; it returns only on error.
func runInit(raw string) error {
	var cfg initConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return fmt.Errorf("decode %s: %w", initEnv, err)
	}
	// Nothing mounted here may propagate to the machine.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make / a slave of the machine's mounts: %w", err)
	}
	root, layer := filepath.Join(cfg.Dir, "root"), filepath.Join(cfg.Dir, "layer")
	// The upper layer lives on a tmpfs: a directory of / as upper layer
	// would overlap the lower one.
	if err := unix.Mount("tmpfs", layer, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mount the upper layer's tmpfs on %s: %w", layer, err)
	}
	upper, work := filepath.Join(layer, "upper"), filepath.Join(layer, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("overlay", root, "overlay", 0, "lowerdir=/,upperdir="+upper+",workdir="+work); err != nil {
		return fmt.Errorf("mount the overlay of / on %s: %w", root, err)
	}
	if err := apiFilesystems(root, cfg.Console); err != nil {
		return err
	}
	for _, s := range cfg.Shares {
		if err := share(root, s); err != nil {
			return err
		}
	}
	if err := minimalUnits(root); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("set the host name: %w", err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/hostname"), []byte(cfg.Hostname+"\n"), 0o644); err != nil {
		return err
	}
	if lo, err := netlink.LinkByName("lo"); err != nil || netlink.LinkSetUp(lo) != nil {
		return fmt.Errorf("bring lo up in the host's network namespace: %v", err)
	}
	if err := os.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root into %s: %w", root, err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the machine's root: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	if err := os.MkdirAll(emptyDir, 0o755); err != nil {
		return err
	}
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"container=kibotos-testhost",
		"SYSTEMD_GENERATOR_PATH=" + emptyDir,
		"SYSTEMD_ENVIRONMENT_GENERATOR_PATH=" + emptyDir,
	}
	argv := []string{systemdBinary, "--system", "--unit=" + targetUnit, "--show-status=no", "--log-target=console", "--log-level=info"}
	return fmt.Errorf("exec %s: %w", systemdBinary, syscall.Exec(systemdBinary, argv, env))
}

type mount struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
	optional               bool // absent on this kernel: nothing to mount
}

// apiFilesystems mounts /proc (with /proc/sys read-only but its net/),
// a read-only /sys with the host's cgroup2 tree, a /dev of its own, and
// private /tmp and /run, under root.
func apiFilesystems(root, console string) error {
	const nosuid, nodev, noexec = unix.MS_NOSUID, unix.MS_NODEV, unix.MS_NOEXEC
	p := func(s string) string { return filepath.Join(root, s) }
	steps := []mount{
		{"proc", p("proc"), "proc", nosuid | nodev | noexec, "", false},
		{p("proc/sys"), p("proc/sys"), "", unix.MS_BIND, "", false},
		{"", p("proc/sys"), "", unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY, "", false},
		// The host's own network namespace: what the node sets there
		// (ip_forward, per-namespace settings) stays in it.
		{p("proc/sys/net"), p("proc/sys/net"), "", unix.MS_BIND, "", false},
		{"", p("proc/sys/net"), "", unix.MS_REMOUNT | unix.MS_BIND, "", false}, // a bind copies read-only
		{p("proc/sysrq-trigger"), p("proc/sysrq-trigger"), "", unix.MS_BIND, "", true},
		{"", p("proc/sysrq-trigger"), "", unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY, "", true},
		{"sysfs", p("sys"), "sysfs", unix.MS_RDONLY | nosuid | nodev | noexec, "", false},
		// Its root is the cgroup this process was cloned into.
		{"cgroup2", p("sys/fs/cgroup"), "cgroup2", nosuid | nodev | noexec, "", false},
		{"tmpfs", p("dev"), "tmpfs", nosuid, "mode=0755", false},
		{"tmpfs", p("tmp"), "tmpfs", nosuid | nodev, "mode=1777", false},
		{"tmpfs", p("run"), "tmpfs", nosuid | nodev, "mode=0755", false},
	}
	for _, m := range steps {
		if _, err := os.Stat(m.target); m.optional && err != nil {
			continue
		}
		if err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s (%s) on %s: %w", m.source, m.fstype, m.target, err)
		}
	}
	return devNodes(p("dev"), console)
}

// devNodes fills the host's /dev: the nodes a Debian host has that
// systemd, dpkg, QEMU and the node use, a devpts of its own, /dev/shm, and
// the console (a file of the machine).
func devNodes(dev, console string) error {
	for _, d := range []string{"pts", "shm", "net"} {
		if err := os.Mkdir(filepath.Join(dev, d), 0o755); err != nil {
			return err
		}
	}
	nodes := []struct {
		name         string
		major, minor uint32
		mode         uint32
	}{
		{"null", 1, 3, 0o666}, {"zero", 1, 5, 0o666}, {"full", 1, 7, 0o666}, {"random", 1, 8, 0o666},
		{"urandom", 1, 9, 0o666}, {"tty", 5, 0, 0o666}, {"net/tun", 10, 200, 0o666},
	}
	if _, err := os.Stat("/dev/kvm"); err == nil {
		nodes = append(nodes, struct {
			name         string
			major, minor uint32
			mode         uint32
		}{"kvm", 10, 232, 0o660})
	}
	old := unix.Umask(0)
	defer unix.Umask(old)
	for _, n := range nodes {
		if err := unix.Mknod(filepath.Join(dev, n.name), unix.S_IFCHR|n.mode, int(unix.Mkdev(n.major, n.minor))); err != nil {
			return fmt.Errorf("mknod /dev/%s: %w", n.name, err)
		}
	}
	if err := unix.Mount("devpts", filepath.Join(dev, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount devpts: %w", err)
	}
	if err := unix.Mount("tmpfs", filepath.Join(dev, "shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	links := map[string]string{"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return err
		}
	}
	c := filepath.Join(dev, "console")
	if err := os.WriteFile(c, nil, 0o600); err != nil {
		return err
	}
	if err := unix.Mount(console, c, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s onto /dev/console: %w", console, err)
	}
	return nil
}

func share(root string, s Share) error {
	if !filepath.IsAbs(s.Guest) || strings.Contains(s.Guest, "..") {
		return fmt.Errorf("share %s: guest path %q is not absolute and clean", s.Host, s.Guest)
	}
	target := filepath.Join(root, s.Guest)
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(s.Host, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("share %s at %s: %w", s.Host, s.Guest, err)
	}
	if s.ReadOnly {
		if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("share %s at %s read-only: %w", s.Host, s.Guest, err)
		}
	}
	return nil
}

// minimalUnits whites out the machine's unit set in the overlay (the
// system directory but for keptUnits, every enabled unit in /etc) and
// writes the host's own targets.
func minimalUnits(root string) error {
	sys := filepath.Join(root, unitDir)
	entries, err := os.ReadDir(sys)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if slices.Contains(keptUnits, e.Name()) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(sys, e.Name())); err != nil {
			return fmt.Errorf("white out unit %s: %w", e.Name(), err)
		}
	}
	etc := filepath.Join(root, "etc/systemd/system")
	entries, err = os.ReadDir(etc)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(etc, e.Name())); err != nil {
			return fmt.Errorf("white out %s: %w", filepath.Join("/etc/systemd/system", e.Name()), err)
		}
	}
	for name, body := range ownUnits {
		if err := os.WriteFile(filepath.Join(sys, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("write unit %s: %w", name, err)
		}
	}
	return nil
}
