package privsd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/units"
)

// starterFileName records, for a private systemd tied to the process
// that started it, both processes (PID and start time each): a later
// start in the same directory can tell one whose starter died from one
// still in use.
const starterFileName = "systemd.starter"

// writeStarterFile records the private systemd pid and this process as
// its starter.
func writeStarterFile(dir string, pid int) error {
	sdStart, err := procStart(pid)
	if err != nil {
		return fmt.Errorf("privsd: private systemd PID %d: %w", pid, err)
	}
	me := os.Getpid()
	myStart, err := procStart(me)
	if err != nil {
		return fmt.Errorf("privsd: this process: %w", err)
	}
	body := fmt.Sprintf("%d %d %d %d\n", pid, sdStart, me, myStart)
	return storagepool.WriteFile(filepath.Join(dir, starterFileName), []byte(body), 0o600, storagepool.Temp{Purpose: "starter"})
}

// running reports whether pid is still the process that started at start.
func running(pid int, start uint64) bool {
	st, err := procStart(pid)
	return err == nil && st == start
}

// EndLeftover ends the private systemd started for dir, tied to a
// process that is gone, if it still runs: what the next start in dir
// would end first (StartWith). It returns its PID, 0 when none runs, or
// why the one running may not be ended.
func EndLeftover(dir string) (int, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return 0, err
	}
	cgMount, err := units.Cgroup2Mount()
	if err != nil {
		return 0, fmt.Errorf("privsd: %w", err)
	}
	cg := filepath.Join(cgMount, cgroupName(dir))
	pids, err := units.CgroupPIDs(cg)
	if errors.Is(err, os.ErrNotExist) || err == nil && len(pids) == 0 {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("privsd: cgroup %s: %w", cg, err)
	}
	ended, why := endLeftover(dir, cg, pids)
	if ended == 0 {
		return 0, fmt.Errorf("privsd: the private systemd for %s (cgroup %s, PIDs %v) is not a leftover: %w", dir, cg, pids, why)
	}
	_ = units.RemoveCgroup(cg)
	// What Stop would have unmounted: the manager's /run/netns, shared
	// with the host.
	return ended, unmountTree(filepath.Join(dir, "run", "netns"))
}

// endLeftover ends the private systemd that cgroup cg holds when it is one
// this package started tied to a process that is gone: the parent-death
// signal is meant to end it with that process, and its VMs with it ("VMs
// end with it"), but a private systemd was seen to outlive a SIGKILL of
// its starter, after which every later start in the directory was
// refused. One that ends by itself meanwhile (the signal came, the kernel
// reaps its namespace) is waited for. It returns the recorded PID once
// the cgroup is empty, or 0 and why it may not end what runs there.
func endLeftover(dir, cg string, pids []int) (int, error) {
	raw, err := os.ReadFile(filepath.Join(dir, starterFileName))
	if err != nil {
		return 0, fmt.Errorf("no record of who started it (%v)", err)
	}
	var sd, starter int
	var sdStart, starterStart uint64
	if _, err := fmt.Sscanf(string(raw), "%d %d %d %d\n", &sd, &sdStart, &starter, &starterStart); err != nil || sd <= 1 || starter <= 1 {
		return 0, fmt.Errorf("malformed %s", starterFileName)
	}
	if running(starter, starterStart) {
		return 0, fmt.Errorf("the process that started it (PID %d) still runs", starter)
	}
	switch {
	case !running(sd, sdStart):
		// Gone already: what is left in its cgroup is its namespace
		// being reaped, or something this package did not record, which
		// is not signalled; the wait below tells them apart.
	case !slices.Contains(pids, sd):
		return 0, fmt.Errorf("its recorded PID %d runs outside cgroup %s", sd, cg)
	default:
		// SIGKILL of a PID namespace's PID 1 kills every process in it.
		if err := syscall.Kill(sd, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return 0, fmt.Errorf("kill PID %d: %w", sd, err)
		}
	}
	deadline := time.Now().Add(KillTimeout)
	for {
		left, err := units.CgroupPIDs(cg)
		if err == nil && len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("its processes %v were still there %v after its recorded PID %d ended", left, KillTimeout, sd)
		}
		time.Sleep(10 * time.Millisecond)
	}
	os.Remove(filepath.Join(dir, starterFileName))
	return sd, nil
}
