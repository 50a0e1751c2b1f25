package privsd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/units"
)

const pidFileName = "systemd.pid"

func consoleFileFor(o Options, dir string) string {
	if !o.Detached {
		return ""
	}
	return filepath.Join(dir, "systemd.log")
}

// spawnDetached starts the private systemd without tying it to this
// process: it is reparented when we exit, and its console is the log file.
func (i *Instance) spawnDetached(cfg []byte) error {
	if !hooked.Load() {
		return errNotHooked
	}
	logf, err := os.OpenFile(i.LogPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("privsd: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"kibotos-privsd-init"}
	cmd.Env = []string{initEnv + "=" + string(cfg)}
	cmd.Stdout, cmd.Stderr = logf, logf // stdin: /dev/null
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWCGROUP,
		Setsid:     true,
	}
	if err := units.StartInCgroup(cmd, i.CgroupRoot); err != nil {
		return fmt.Errorf("privsd: start the private systemd: %w", err)
	}
	// Not stopped by Release: the parent must reap its child, or the child
	// stays a zombie that another process's Stop waits for in vain. It
	// ends with the private systemd; Stop waits for it.
	i.cmd, i.PID = cmd, cmd.Process.Pid
	go func() {
		_ = cmd.Wait()
		close(i.exited)
	}()
	return nil
}

// watchEvery is how often an attached instance's watch looks for its end.
const watchEvery = 50 * time.Millisecond

// watch closes i.exited once gone reports that the private systemd, which
// is not this process's child, ended; it polls, so that Release can end it.
func (i *Instance) watch(gone func() bool) {
	i.watchStop, i.watchDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(i.watchDone)
		t := time.NewTicker(watchEvery)
		defer t.Stop()
		for {
			if gone() {
				close(i.exited)
				return
			}
			select {
			case <-i.watchStop:
				return
			case <-t.C:
			}
		}
	}()
}

// Release lets an attached private systemd go without stopping it (kibotos
// dev's VMs outlive the processes that use it): it ends this process's
// watch of it and returns once the watch ended. Release after Stop, or
// twice, is a no-op, and so is Release of an instance this process started
// (its wait reaps it and ends with it); Stop after Release would wait for
// an end nobody watches.
func (i *Instance) Release() {
	if i.watchStop == nil {
		return
	}
	i.releaseOnce.Do(func() { close(i.watchStop) })
	<-i.watchDone
}

// procStart is field 22 of /proc/<pid>/stat: with the PID it names one
// process, not a later one that reused the number.
func procStart(pid int) (uint64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, errors.New("malformed stat")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

func writePIDFile(dir string, pid int) error {
	st, err := procStart(pid)
	if err != nil {
		return fmt.Errorf("privsd: private systemd PID %d: %w", pid, err)
	}
	return storagepool.WriteFile(filepath.Join(dir, pidFileName), []byte(fmt.Sprintf("%d %d\n", pid, st)), 0o600, storagepool.Temp{Purpose: "pid"})
}

// ErrNotRunning is returned by Attach when no detached instance runs for dir.
var ErrNotRunning = errors.New("privsd: no detached private systemd runs for this directory")

// Attach finds the detached private systemd started for dir by an earlier
// process and returns it, after checking that the recorded PID is still
// that process (start time) and PID 1 of its own namespace.
func Attach(ctx context.Context, dir string) (*Instance, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(filepath.Join(dir, pidFileName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotRunning
	}
	if err != nil {
		return nil, err
	}
	var pid int
	var start uint64
	if _, err := fmt.Sscanf(string(raw), "%d %d", &pid, &start); err != nil {
		return nil, fmt.Errorf("privsd: %s is corrupt: %w", filepath.Join(dir, pidFileName), err)
	}
	if st, err := procStart(pid); err != nil || st != start {
		return nil, ErrNotRunning // it ended (and the number may be someone else's now)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil || !strings.Contains(string(status), "\nNSpid:\t"+strconv.Itoa(pid)+"\t1\n") {
		return nil, fmt.Errorf("privsd: PID %d recorded in %s is not PID 1 of a private namespace: stop it by hand", pid, dir)
	}
	cgMount, err := units.Cgroup2Mount()
	if err != nil {
		return nil, fmt.Errorf("privsd: %w", err)
	}
	inst := &Instance{
		PID: pid, Dir: dir, LogPath: filepath.Join(dir, "systemd.log"),
		BusSocket:  filepath.Join(dir, "run", busSocketName),
		CgroupRoot: filepath.Join(cgMount, cgroupName(dir)),
		NetNSDir:   filepath.Join(dir, "run", "netns"),
		exited:     make(chan struct{}),
	}
	inst.watch(func() bool { // not our child: watch it by PID and start time
		st, err := procStart(pid)
		return err != nil || st != start
	})
	if err := inst.waitReady(ctx); err != nil {
		inst.Release()
		return nil, fmt.Errorf("privsd: attach to PID %d: %w", pid, err)
	}
	return inst, nil
}
