// Package testhost boots a throwaway host for tests: a full systemd as PID 1
// of new PID, mount, UTS, cgroup, network and IPC namespaces, whose root is
// an overlay of this machine's / with the upper layer on a tmpfs. What runs
// inside (dpkg, maintainer scripts, systemctl, the units it starts) writes
// into that layer and its private /tmp, /run and /dev, never onto the
// machine; when the host stops, its namespaces and layer are gone.
//
// It must never let systemd start the machine's normal unit set: with
// sysinit.target's units (tmpfiles, udev trigger, binfmt, modules-load) a
// booted systemd reaches devices and kernel settings that are shared with
// the machine. So the overlay's unit directories are emptied (whiteouts in
// the upper layer) but for the handful of units in keptUnits, generators
// are off, /proc/sys is read-only (but for /proc/sys/net, which is the
// host's own network namespace), /sys is read-only, and /dev is a tmpfs of
// its own with a few device nodes. It must never kill by name: Stop signals
// only the PID it started (PID 1 of the namespace; the kernel then kills
// the rest of the namespace).
//
// The binary re-executes itself (/proc/self/exe) as that PID 1, so a test
// binary importing this package can start one; see init.go.
package testhost

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/vmm/units"
)

// Signal 38 is glibc's SIGRTMIN+4: systemd's "power off" request.
const sigPoweroff = syscall.Signal(38)

// Share is a directory of the machine the host sees at Guest (bind mount).
type Share struct {
	Host, Guest string
	ReadOnly    bool
}

// Options of Start.
type Options struct {
	Hostname string
	Shares   []Share
}

// Host is one booted test host.
type Host struct {
	// PID is the machine's PID of the host's systemd (PID 1 inside).
	PID int
	// Dir holds root/ (the overlay's mount point, empty from outside),
	// layer/ (the tmpfs of the upper layer, mounted inside only) and
	// console.log (PID 1's console).
	Dir     string
	Console string
	cgroup  string

	cmd      *exec.Cmd
	exited   chan struct{}
	stopOnce sync.Once
	stopErr  error
}

// Available says why a host cannot boot here, or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("testhost: needs root (namespaces, mounts, cgroups)")
	}
	if _, err := os.Stat(systemdBinary); err != nil {
		return fmt.Errorf("testhost: no %s: install the Debian package systemd", systemdBinary)
	}
	for _, u := range keptUnits {
		if _, err := os.Stat(filepath.Join(unitDir, u)); err != nil {
			return fmt.Errorf("testhost: unit %s missing from %s: reinstall the Debian package systemd", u, unitDir)
		}
	}
	fsys, err := os.ReadFile("/proc/filesystems")
	if err != nil || !strings.Contains(string(fsys), "\toverlay\n") {
		return errors.New("testhost: the kernel has no overlay file system (modprobe overlay)")
	}
	if _, err := units.Cgroup2Mount(); err != nil {
		return fmt.Errorf("testhost: %w", err)
	}
	return nil
}

// Start boots a host whose state lives in dir (which must be empty or
// absent) and returns once its systemd reports running (or degraded). The
// host dies with the calling process (parent-death signal) and must be
// stopped with Stop.
func Start(ctx context.Context, dir string, o Options) (*Host, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"root", "layer"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("testhost: %w", err)
		}
	}
	cgMount, err := units.Cgroup2Mount()
	if err != nil {
		return nil, fmt.Errorf("testhost: %w", err)
	}
	sum := sha256.Sum256([]byte(dir))
	h := &Host{Dir: dir, Console: filepath.Join(dir, "console.log"), cgroup: filepath.Join(cgMount, "kibotos-testhost-"+hex.EncodeToString(sum[:6])), exited: make(chan struct{})}
	if err := os.Mkdir(h.cgroup, 0o755); err != nil {
		return nil, fmt.Errorf("testhost: create cgroup %s: %w", h.cgroup, err)
	}
	if o.Hostname == "" {
		o.Hostname = "testhost"
	}
	cfg, err := json.Marshal(initConfig{Dir: dir, Console: h.Console, Hostname: o.Hostname, Shares: o.Shares})
	if err != nil {
		return nil, err
	}
	if err := h.spawn(cfg); err != nil {
		_ = units.RemoveCgroup(h.cgroup)
		return nil, err
	}
	if err := h.waitRunning(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("testhost: systemd (PID %d) did not come up: %w; its console: %s", h.PID, err, h.ConsoleTail(2000)), h.Stop())
	}
	return h, nil
}

func (h *Host) spawn(cfg []byte) error {
	console, err := os.OpenFile(h.Console, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("testhost: %w", err)
	}
	defer console.Close()
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"kibotos-testhost-init"}
	cmd.Env = []string{initEnv + "=" + string(cfg)}
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWCGROUP |
			syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC,
		Setsid:    true,
		Pdeathsig: syscall.SIGKILL,
	}
	if err := units.StartInCgroup(cmd, h.cgroup); err != nil {
		return fmt.Errorf("testhost: start the host's systemd: %w", err)
	}
	h.cmd, h.PID = cmd, cmd.Process.Pid
	go func() {
		_ = cmd.Wait()
		close(h.exited)
	}()
	return nil
}

// waitRunning polls systemctl is-system-running inside the host.
func (h *Host) waitRunning(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	last := ""
	for {
		select {
		case <-h.exited:
			return fmt.Errorf("it exited (%v)", h.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("%w (last state: %s)", ctx.Err(), last)
		default:
		}
		out, _ := h.Command(ctx, "systemctl", "is-system-running").Output()
		last = strings.TrimSpace(string(out))
		if last == "running" || last == "degraded" {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Command is a command run inside the host: in all its namespaces, its
// root, as root. It dies with the host.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--target", strconv.Itoa(h.PID),
		"--mount", "--uts", "--ipc", "--net", "--pid", "--cgroup", "--", name}, args...)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "HOME=/root", "DEBIAN_FRONTEND=noninteractive"}
	return cmd
}

// Path is the machine's path of p inside the host (through /proc/PID/root).
func (h *Host) Path(p string) string {
	return filepath.Join(fmt.Sprintf("/proc/%d/root", h.PID), p)
}

// ConsoleTail is the end of PID 1's console.
func (h *Host) ConsoleTail(n int) string {
	b, _ := os.ReadFile(h.Console)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// Stop powers the host off (SIGRTMIN+4 to its systemd), SIGKILLs its PID 1
// after timeout (which ends every process of its PID namespace), waits for
// it and removes its cgroups. Its mounts go with its mount namespace. Safe
// to call twice.
func (h *Host) Stop() error {
	h.stopOnce.Do(func() { h.stopErr = h.stop(20 * time.Second) })
	return h.stopErr
}

func (h *Host) stop(timeout time.Duration) error {
	var errs []error
	select {
	case <-h.exited:
	default:
		_ = syscall.Kill(h.PID, sigPoweroff)
		select {
		case <-h.exited:
		case <-time.After(timeout):
			_ = syscall.Kill(h.PID, syscall.SIGKILL)
			select {
			case <-h.exited:
			case <-time.After(10 * time.Second):
				return fmt.Errorf("testhost: systemd PID %d survived SIGKILL for 10s", h.PID)
			}
		}
	}
	var pids []int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if pids, err = units.CgroupPIDs(h.cgroup); (err == nil && len(pids) == 0) || time.Now().After(deadline) {
			break
		}
	}
	if len(pids) > 0 {
		errs = append(errs, fmt.Errorf("testhost: cgroup %s still holds PIDs %v after the host's systemd exited", h.cgroup, pids))
	} else if err := units.RemoveCgroup(h.cgroup); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
