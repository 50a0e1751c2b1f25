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

// endLeftover ends the private systemd that cgroup cg holds when it is one
// this package started tied to a process that is gone: the parent-death
// signal is meant to end it with that process, and its VMs with it ("VMs
// end with it"), but a private systemd was seen to outlive a SIGKILL of
// its starter, after which every later start in the directory was
// refused. It returns the PID it ended, or 0 and why it may not.
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
	switch {
	case !slices.Contains(pids, sd) || !running(sd, sdStart):
		return 0, errors.New("its recorded PID is not the one running there")
	case running(starter, starterStart):
		return 0, fmt.Errorf("the process that started it (PID %d) still runs", starter)
	}
	// SIGKILL of a PID namespace's PID 1 kills every process in it.
	if err := syscall.Kill(sd, syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("kill PID %d: %w", sd, err)
	}
	deadline := time.Now().Add(KillTimeout)
	for {
		left, err := units.CgroupPIDs(cg)
		if err == nil && len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("its processes %v were still there %v after SIGKILL of PID %d", left, KillTimeout, sd)
		}
		time.Sleep(10 * time.Millisecond)
	}
	os.Remove(filepath.Join(dir, starterFileName))
	return sd, nil
}
