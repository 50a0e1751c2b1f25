// Package privsd runs a private systemd for tests and for `kibotos dev` on
// hosts whose PID 1 is not systemd. The private systemd is PID 1 of new
// PID, mount, UTS and cgroup namespaces, with cgroup2 mounted inside, a
// private /run backed by a host directory, and a minimal unit set of its own.
//
// It must never start systemd with the host's unit set: sysinit.target pulls
// in systemd-tmpfiles-setup, which wipes the /tmp it shares with the host.
// It must never kill by name: Stop signals only the PID it started (PID 1 of
// the namespace; the kernel then kills the rest of the namespace).
//
// The binary re-executes itself (/proc/self/exe) as that PID 1, so any binary
// that imports this package can start an Instance; see init.go.
package privsd

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	godbus "github.com/godbus/dbus/v5"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/units"
)

// BootTimeout bounds Start when ctx has no deadline.
const BootTimeout = 30 * time.Second

// Signal 38 is glibc's SIGRTMIN+4 (glibc reserves 32 and 33): systemd's
// "power off" request.
const sigPoweroff = syscall.Signal(38)

// Timeouts of Stop: graceful poweroff, then SIGKILL of the namespace's PID 1.
var (
	PoweroffTimeout = 5 * time.Second
	KillTimeout     = 10 * time.Second
)

const (
	busSocketName = "kibotos-bus.sock"
	targetUnit    = "kibotos-privsd.target"
	// unixPathMax is sun_path's size including the terminating NUL.
	unixPathMax = 108
)

// shutdownUnits are copied from the host's systemd so SIGRTMIN+4 powers off.
var shutdownUnits = []string{"shutdown.target", "poweroff.target", "systemd-poweroff.service", "final.target", "umount.target"}

// Instance is one running private systemd.
type Instance struct {
	// PID is the host PID of the private systemd (PID 1 of its namespace).
	PID int
	// BusSocket is the host path of a socket proxied to the manager's
	// private bus (systemd refuses direct peers from other PID namespaces).
	BusSocket string
	// CgroupRoot is the host cgroup2 directory that is the root of the
	// private systemd's cgroup namespace.
	CgroupRoot string
	// Dir holds run/ (its /run), units/, systemd.log (its console) and
	// logs/ (UnitLogDir).
	Dir string
	// NetNSDir is the host directory that is the manager's /run/netns, a
	// shared mount: a network namespace pinned there from the host
	// appears for the manager too (NetworkNamespacePath of a unit).
	NetNSDir string
	LogPath  string
	// BootTime is the time from Start to the manager reporting running.
	BootTime time.Duration
	// EndedLeftover is the PID of a private systemd that Start ended
	// first: one tied to a process that died, left running in the same
	// directory (0: none).
	EndedLeftover int

	noDeathSignal bool
	cmd           *exec.Cmd // nil when attached
	exited        chan struct{}
	ptmx          *os.File
	pts           *os.File
	logDone       chan struct{}

	// The watch of an attached instance (detached.go), ended by Release.
	watchStop   chan struct{}
	watchDone   chan struct{}
	releaseOnce sync.Once

	stopOnce sync.Once
	stopErr  error
}

// Target is the units.Target for this instance.
func (i *Instance) Target() units.Target {
	return units.Target{Socket: i.BusSocket, CgroupRoot: i.CgroupRoot, ManagerPID: i.PID, NetNSDir: i.NetNSDir, LogDir: i.UnitLogDir()}
}

// UnitLogDir holds a log file per unit this systemd ran (units.Target
// LogDir): it has no journal.
func (i *Instance) UnitLogDir() string {
	if i.Dir == "" {
		return ""
	}
	return filepath.Join(i.Dir, "logs")
}

type binaries struct {
	systemd, proxyd, unitDir string
}

func findBinaries() (binaries, error) {
	for _, libdir := range []string{"/lib/systemd", "/usr/lib/systemd"} {
		b := binaries{
			systemd: filepath.Join(libdir, "systemd"),
			proxyd:  filepath.Join(libdir, "systemd-socket-proxyd"),
			unitDir: filepath.Join(libdir, "system"),
		}
		if isExec(b.systemd) && isExec(b.proxyd) {
			return b, nil
		}
	}
	return binaries{}, errors.New("no systemd and systemd-socket-proxyd in /lib/systemd or /usr/lib/systemd: install the Debian package systemd (apt-get install systemd)")
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// Available says why a private systemd cannot run here, or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("privsd: needs root (namespaces, cgroups, mounts)")
	}
	b, err := findBinaries()
	if err != nil {
		return fmt.Errorf("privsd: %w", err)
	}
	for _, u := range shutdownUnits {
		if _, err := os.Stat(filepath.Join(b.unitDir, u)); err != nil {
			return fmt.Errorf("privsd: unit %s missing from %s: reinstall the systemd package", u, b.unitDir)
		}
	}
	if _, err := units.Cgroup2Mount(); err != nil {
		return fmt.Errorf("privsd: %w", err)
	}
	return nil
}

// cgroupName is derived from the directory so that a restart with the same
// directory finds (and refuses, or cleans) a previous instance's cgroup.
func cgroupName(dir string) string {
	h := sha256.Sum256([]byte(dir))
	return "kibotos-privsd-" + hex.EncodeToString(h[:6])
}

// Start boots a private systemd whose state lives in dir and returns when its
// manager answers on BusSocket. The instance dies with the calling process
// (SIGKILL as parent-death signal, which Linux ties to the calling OS
// thread: do not call Start from a goroutine locked to a thread that will
// exit), and must be stopped with Stop.
func Start(ctx context.Context, dir string) (*Instance, error) {
	return StartWith(ctx, dir, Options{})
}

// Options of StartWith.
type Options struct {
	// Detached instances outlive the process that started them (kibotos
	// dev restarts take their VMs over): no parent-death signal, the
	// console goes to systemd.log directly, and the PID is recorded in
	// <dir>/systemd.pid for Attach.
	Detached bool

	// noDeathSignal leaves the parent-death signal out: tests make the
	// leftover of a starter the kernel did not take its systemd with.
	noDeathSignal bool
}

// StartWith starts a private systemd with options.
func StartWith(ctx context.Context, dir string, o Options) (*Instance, error) {
	t0 := time.Now()
	if err := Available(); err != nil {
		return nil, err
	}
	bins, _ := findBinaries()
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("privsd: %w", err)
	}
	if _, hasDeadline := ctx.Deadline(); !hasDeadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, BootTimeout)
		defer cancel()
	}
	cgMount, err := units.Cgroup2Mount()
	if err != nil {
		return nil, fmt.Errorf("privsd: %w", err)
	}
	sweepStaleCgroups(cgMount)
	cg := filepath.Join(cgMount, cgroupName(dir))
	leftover := 0
	if _, err := os.Stat(cg); err == nil {
		pids, err := units.CgroupPIDs(cg)
		if err != nil {
			return nil, fmt.Errorf("privsd: check cgroup %s of a previous instance: %w", cg, err)
		}
		if len(pids) > 0 {
			ended, why := endLeftover(dir, cg, pids)
			if ended == 0 {
				return nil, fmt.Errorf("privsd: a private systemd for %s seems to run already: cgroup %s holds host PIDs %v (%v); stop it first", dir, cg, pids, why)
			}
			leftover = ended
		}
		if err := units.RemoveCgroup(cg); err != nil {
			return nil, fmt.Errorf("privsd: remove the empty cgroup %s of a previous instance: %w", cg, err)
		}
	}

	runDir, unitDir, emptyDir := filepath.Join(dir, "run"), filepath.Join(dir, "units"), filepath.Join(dir, "empty")
	sock := filepath.Join(runDir, busSocketName)
	if len(sock) >= unixPathMax {
		return nil, fmt.Errorf("privsd: bus socket path %s is longer than %d bytes: use a shorter directory", sock, unixPathMax-1)
	}
	// Namespaces an earlier instance's node pinned are host mounts.
	if err := unmountTree(filepath.Join(runDir, "netns")); err != nil {
		return nil, err
	}
	for _, d := range []string{runDir, unitDir, emptyDir} {
		if err := os.RemoveAll(d); err != nil {
			return nil, fmt.Errorf("privsd: clear %s: %w", d, err)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("privsd: %w", err)
		}
	}
	if err := writeUnits(unitDir, bins); err != nil {
		return nil, err
	}
	cfg, err := json.Marshal(initConfig{
		Systemd:   bins.systemd,
		RunDir:    runDir,
		UnitDir:   unitDir,
		EmptyDir:  emptyDir,
		Container: "kibotos-privsd",
		Args: []string{"--system", "--unit=" + targetUnit, "--show-status=no", "--log-target=console", "--log-level=info",
			"--default-standard-output=inherit", "--default-standard-error=inherit"},
		ConsoleFile: consoleFileFor(o, dir),
	})
	if err != nil {
		return nil, fmt.Errorf("privsd: %w", err)
	}

	netnsDir, err := shareNetNSDir(runDir)
	if err != nil {
		return nil, err
	}
	if err := os.Mkdir(cg, 0o755); err != nil {
		return nil, errors.Join(fmt.Errorf("privsd: create cgroup %s: %w", cg, err), unmountTree(netnsDir))
	}
	inst := &Instance{
		BusSocket:  sock,
		CgroupRoot: cg,
		Dir:        dir,
		LogPath:    filepath.Join(dir, "systemd.log"),
		NetNSDir:   netnsDir,
		exited:     make(chan struct{}),
		logDone:    make(chan struct{}),
	}
	inst.noDeathSignal = o.noDeathSignal
	spawn := inst.spawn
	if o.Detached {
		spawn = inst.spawnDetached
	}
	if err := spawn(cfg); err != nil {
		_ = units.RemoveCgroup(cg)
		return nil, errors.Join(err, unmountTree(netnsDir))
	}
	if err := inst.waitReady(ctx); err != nil {
		stopErr := inst.Stop()
		return nil, errors.Join(fmt.Errorf("privsd: private systemd (host PID %d) did not come up: %w; its console: %s", inst.PID, err, inst.logTail()), stopErr)
	}
	record := writeStarterFile
	if o.Detached {
		record = writePIDFile
	}
	if err := record(dir, inst.PID); err != nil {
		return nil, errors.Join(err, inst.Stop())
	}
	inst.BootTime = time.Since(t0)
	inst.EndedLeftover = leftover
	return inst, nil
}

func writeUnits(unitDir string, bins binaries) error {
	files := map[string]string{
		targetUnit: "[Unit]\nDescription=kibotos private systemd\nWants=kibotos-privsd-bus.socket\n",
		// Host-reachable bus: a proxy inside the namespace re-dials the private bus.
		"kibotos-privsd-bus.socket":  "[Unit]\nDefaultDependencies=no\n[Socket]\nListenStream=/run/" + busSocketName + "\nSocketMode=0600\n",
		"kibotos-privsd-bus.service": "[Unit]\nDefaultDependencies=no\n[Service]\nExecStart=" + bins.proxyd + " /run/systemd/private\n",
		// Empty stand-ins: the real ones pull in tmpfiles-setup, journald, mounts...
		"sysinit.target": "[Unit]\nDescription=sysinit (empty, kibotos private systemd)\n",
		"basic.target":   "[Unit]\nDescription=basic (empty, kibotos private systemd)\nRequires=sysinit.target\nAfter=sysinit.target\n",
	}
	for _, u := range shutdownUnits {
		b, err := os.ReadFile(filepath.Join(bins.unitDir, u))
		if err != nil {
			return fmt.Errorf("privsd: read unit %s: %w", u, err)
		}
		files[u] = string(b)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(unitDir, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("privsd: write unit %s: %w", name, err)
		}
	}
	return nil
}

// spawn clones the re-executed binary straight into the new cgroup
// (clone3 CLONE_INTO_CGROUP), so that cgroup becomes its cgroup namespace
// root, with a pty as console.
func (i *Instance) spawn(cfg []byte) error {
	if !hooked.Load() {
		return errNotHooked
	}
	ptmx, pts, err := openPTY()
	if err != nil {
		return fmt.Errorf("privsd: console pty: %w", err)
	}
	logf, err := os.OpenFile(i.LogPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		ptmx.Close()
		pts.Close()
		return fmt.Errorf("privsd: %w", err)
	}
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"kibotos-privsd-init"}
	cmd.Env = []string{initEnv + "=" + string(cfg)}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pts, pts, pts
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWCGROUP,
		Setsid:     true,
		Setctty:    true,
		Ctty:       0,
		Pdeathsig:  syscall.SIGKILL,
	}
	if i.noDeathSignal {
		cmd.SysProcAttr.Pdeathsig = 0
	}
	if err := units.StartInCgroup(cmd, i.CgroupRoot); err != nil {
		ptmx.Close()
		pts.Close()
		logf.Close()
		return fmt.Errorf("privsd: start the private systemd: %w", err)
	}
	// We keep the peer open too: the master reads EIO whenever no peer is
	// open, and systemd closes its stdio before it opens /dev/console.
	i.cmd, i.PID, i.ptmx, i.pts = cmd, cmd.Process.Pid, ptmx, pts
	go func() {
		_ = cmd.Wait()
		close(i.exited)
	}()
	go func() {
		_, _ = io.Copy(logf, ptmx) // ends when Stop closes the master
		logf.Close()
		close(i.logDone)
	}()
	return nil
}

func openPTY() (ptmx, pts *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	// TIOCGPTPEER, not /dev/pts/<n>: /dev/ptmx and /dev/pts may belong to
	// different devpts instances (stacked mounts seen on these machines).
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		err = errno
		m.Close()
		return nil, nil, fmt.Errorf("open pty peer: %w", err)
	}
	s := os.NewFile(sfd, "pty-peer")
	return m, s, nil
}

// waitReady polls the bus proxy until the manager reports running (or degraded).
func (i *Instance) waitReady(ctx context.Context) error {
	var last error
	for {
		select {
		case <-i.exited:
			if i.cmd == nil {
				return errors.New("it exited")
			}
			return fmt.Errorf("it exited (%v)", i.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		default:
		}
		var state string
		if state, last = managerState(i.BusSocket); last == nil && (state == "running" || state == "degraded") {
			return nil
		} else if last == nil {
			last = fmt.Errorf("system state %s", state)
		}
		time.Sleep(time.Millisecond)
	}
}

func managerState(sock string) (string, error) {
	if _, err := os.Stat(sock); err != nil {
		return "", err
	}
	c, err := godbus.Dial("unix:path=" + sock)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
		return "", err
	}
	v, err := c.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1").
		GetProperty("org.freedesktop.systemd1.Manager.SystemState")
	if err != nil {
		return "", err
	}
	s, _ := v.Value().(string)
	return s, nil
}

// Stop powers the private systemd off (SIGRTMIN+4), SIGKILLs it after
// PoweroffTimeout, waits for it, and removes its cgroups. Safe to call twice.
func (i *Instance) Stop() error {
	i.stopOnce.Do(func() { i.stopErr = i.stop() })
	return i.stopErr
}

func (i *Instance) stop() error {
	var errs []error
	// Our child is not reaped before exited closes, so i.PID cannot be reused meanwhile.
	if !i.waitExit(0) {
		if err := syscall.Kill(i.PID, sigPoweroff); err != nil {
			errs = append(errs, fmt.Errorf("privsd: power off PID %d: %w", i.PID, err))
		}
		if !i.waitExit(PoweroffTimeout) {
			// SIGKILL of a PID namespace's PID 1 kills every process in it.
			_ = syscall.Kill(i.PID, syscall.SIGKILL)
			if !i.waitExit(KillTimeout) {
				return fmt.Errorf("privsd: private systemd PID %d survived SIGKILL for %v", i.PID, KillTimeout)
			}
		}
	}
	if i.watchDone != nil {
		<-i.watchDone // it closed exited and returns
	}
	if i.pts != nil {
		i.pts.Close()
		i.ptmx.Close()
		select {
		case <-i.logDone:
		case <-time.After(2 * time.Second):
		}
	}
	os.Remove(filepath.Join(i.Dir, pidFileName))
	os.Remove(filepath.Join(i.Dir, starterFileName))
	if err := unmountTree(i.NetNSDir); err != nil {
		errs = append(errs, err)
	}
	// The namespace is gone; its processes leave the cgroups asynchronously.
	var pids []int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var err error
		if pids, err = units.CgroupPIDs(i.CgroupRoot); err == nil && len(pids) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(pids) > 0 {
		errs = append(errs, fmt.Errorf("privsd: cgroup %s still holds host PIDs %v after the private systemd exited", i.CgroupRoot, pids))
	} else if err := units.RemoveCgroup(i.CgroupRoot); err != nil {
		errs = append(errs, fmt.Errorf("privsd: remove cgroup %s: %w", i.CgroupRoot, err))
	}
	return errors.Join(errs...)
}

func (i *Instance) waitExit(d time.Duration) bool {
	if d == 0 {
		select {
		case <-i.exited:
			return true
		default:
			return false
		}
	}
	select {
	case <-i.exited:
		return true
	case <-time.After(d):
		return false
	}
}

func (i *Instance) logTail() string {
	b, _ := os.ReadFile(i.LogPath)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(bytes.ToValidUTF8(b, nil)))
}

// shareNetNSDir makes <run>/netns a shared mount before the private
// systemd copies the host's mounts (its init makes them slaves, so host
// mounts below it reach the manager and nothing of the manager's comes
// back), the way iproute2 shares /run/netns.
func shareNetNSDir(runDir string) (string, error) {
	d := filepath.Join(runDir, "netns")
	if err := os.MkdirAll(d, 0o755); err != nil {
		return "", fmt.Errorf("privsd: %w", err)
	}
	if err := unix.Mount(d, d, "none", unix.MS_BIND, ""); err != nil {
		return "", fmt.Errorf("privsd: bind %s onto itself: %w", d, err)
	}
	if err := unix.Mount("", d, "none", unix.MS_SHARED, ""); err != nil {
		_ = unix.Unmount(d, unix.MNT_DETACH)
		return "", fmt.Errorf("privsd: make %s a shared mount: %w", d, err)
	}
	return d, nil
}

// unmountTree detaches every mount at or below dir (namespaces pinned in
// it, and its own bind); none is fine.
func unmountTree(dir string) error {
	if dir == "" {
		return nil
	}
	for {
		err := unix.Unmount(dir, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("privsd: unmount %s: %w", dir, err)
		}
	}
}

// staleAge: an instance's cgroup is populated milliseconds after it is made,
// so an empty one this old was left by a process that died without Stop.
const staleAge = time.Minute

// sweepStaleCgroups removes empty kibotos-privsd-* cgroups left behind when a
// test binary was killed (the parent-death signal kills the private systemd,
// but nobody removes its cgroups). It only removes empty cgroups, best effort.
func sweepStaleCgroups(cgMount string) {
	dirs, _ := filepath.Glob(filepath.Join(cgMount, "kibotos-privsd-*"))
	for _, d := range dirs {
		st, err := os.Stat(d)
		if err != nil || !st.IsDir() || time.Since(st.ModTime()) < staleAge {
			continue
		}
		if pids, err := units.CgroupPIDs(d); err == nil && len(pids) == 0 {
			_ = units.RemoveCgroup(d)
		}
	}
}
