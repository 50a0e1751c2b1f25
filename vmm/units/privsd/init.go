package privsd

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// initEnv carries the initConfig to the re-executed binary that becomes PID 1
// of the new namespaces. A binary plays that role by calling RunIfInit
// first thing in main (or TestMain): it takes over only when this
// variable is set AND the process is PID 1 of its PID namespace.
const initEnv = "KIBOTOS_PRIVSD_INIT"

// hooked says this program calls RunIfInit: a start re-executes the
// program, which must become the private systemd's PID 1.
var hooked atomic.Bool

type initConfig struct {
	Systemd   string   // absolute path of the systemd binary
	RunDir    string   // host directory bound onto /run
	UnitDir   string   // the only unit directory
	EmptyDir  string   // empty generator directory
	Args      []string // systemd arguments after argv[0]
	Container string   // $container for systemd
	// ConsoleFile, for a detached instance (no terminal), is bound onto
	// /dev/console so PID 1 logs there, not to the host's console.
	ConsoleFile string
}

// RunIfInit makes this process the private systemd's PID 1 when it is
// the re-executed program a start made (it never returns then), and
// returns at once otherwise. Every program that starts a private systemd
// calls it first thing in main, or in TestMain for a test binary; a start
// in a program that does not is refused.
func RunIfInit() {
	hooked.Store(true)
	raw := os.Getenv(initEnv)
	if raw == "" || os.Getpid() != 1 {
		return
	}
	err := runInit(raw)
	fmt.Fprintf(os.Stderr, "kibotos privsd: preparing the private systemd failed: %v\n", err)
	os.Exit(1)
}

// runInit prepares the mount namespace and execs systemd; it returns only on error.
func runInit(raw string) error {
	var cfg initConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return fmt.Errorf("decode %s: %w", initEnv, err)
	}
	// An empty or ':'-carrying unit path would bring in the host's unit set.
	if cfg.UnitDir == "" || strings.Contains(cfg.UnitDir, ":") || cfg.EmptyDir == "" {
		return fmt.Errorf("refusing unit path %q / generator path %q: systemd would load the host's units", cfg.UnitDir, cfg.EmptyDir)
	}
	// Nothing we mount may propagate back to the host; the host's mounts
	// below a shared mount (network namespaces pinned in run/netns) still
	// reach us.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make / a slave of the host's mounts: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc for the new PID namespace: %w", err)
	}
	// A pure cgroup2 tree at /sys/fs/cgroup; its root is our cgroup namespace
	// root (the host cgroup we were cloned into). A hybrid host's v1 tree goes.
	if err := unix.Unmount("/sys/fs/cgroup", unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount the host's /sys/fs/cgroup: %w", err)
	}
	if err := unix.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount cgroup2 at /sys/fs/cgroup: %w", err)
	}
	// A private /run backed by a host directory, so the bus proxy socket is
	// reachable from the host.
	// Recursive, so run/netns (a slave of the host's shared mount) comes along.
	if err := unix.Mount(cfg.RunDir, "/run", "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s onto /run: %w", cfg.RunDir, err)
	}
	if err := os.MkdirAll("/run/lock", 0o755); err != nil {
		return err
	}
	// systemd raises fs.file-max and fs.nr_open at boot: keep that off the host.
	if err := unix.Mount("/proc/sys", "/proc/sys", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind /proc/sys: %w", err)
	}
	if err := unix.Mount("", "/proc/sys", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("make /proc/sys read-only: %w", err)
	}
	// PID 1 logs to /dev/console: give it our pty (or, detached, a log
	// file) instead of the host console.
	if cfg.ConsoleFile != "" {
		if err := unix.Mount(cfg.ConsoleFile, "/dev/console", "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s onto /dev/console: %w", cfg.ConsoleFile, err)
		}
	} else if _, err := unix.IoctlGetTermios(0, unix.TCGETS); err == nil {
		tty, err := os.Readlink("/proc/self/fd/0")
		if err != nil {
			return fmt.Errorf("find our terminal: %w", err)
		}
		if err := unix.Mount(tty, "/dev/console", "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind our terminal %s onto /dev/console: %w", tty, err)
		}
	}
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"container=" + cfg.Container,
		// No trailing ':' — with one, systemd appends the normal unit paths and
		// sysinit.target's tmpfiles-setup wipes the shared /tmp.
		"SYSTEMD_UNIT_PATH=" + cfg.UnitDir + ":/run/systemd/transient",
		"SYSTEMD_GENERATOR_PATH=" + cfg.EmptyDir,
		"SYSTEMD_ENVIRONMENT_GENERATOR_PATH=" + cfg.EmptyDir,
	}
	argv := append([]string{cfg.Systemd}, cfg.Args...)
	return fmt.Errorf("exec %s: %w", cfg.Systemd, syscall.Exec(cfg.Systemd, argv, env))
}

// errNotHooked refuses a start in a program whose main does not call
// RunIfInit: its re-executed copy would run main again instead of systemd.
var errNotHooked = errors.New("privsd: this program does not call privsd.RunIfInit first thing in main (or TestMain): it cannot become the private systemd's PID 1")
