package units

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/internal/ctxsleep"
)

var errNoDevice = syscall.ENODEV // reading cgroup.procs of a cgroup being removed

// RemainError is a stop whose job ended while processes of the unit
// remain (stuck in the kernel: SIGKILL takes effect only once they leave
// it).
type RemainError struct {
	Unit    string
	Settle  time.Duration
	PIDs    []int
	Cgroup  string
	MainPID int
}

func (e *RemainError) Error() string {
	return fmt.Sprintf("units: stop unit %s: stop job done but after %v host PIDs %v remain (cgroup %s, main PID %d): inspect and kill them by PID",
		e.Unit, e.Settle.Round(time.Millisecond), e.PIDs, e.Cgroup, e.MainPID)
}

// Stop stops a unit and returns once the stop job is done, the unit's cgroup
// holds no process and its main process is gone. A unit that is not loaded
// is already stopped. If processes remain after StopSettle (or the ctx
// deadline) the error names them by host PID; Stop never kills them itself.
func (m *Manager) Stop(ctx context.Context, name string) error {
	u, err := m.Get(ctx, name)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("units: stop unit %s: %w", name, err)
	}
	// Remember the main process by host PID and start time before systemd forgets it.
	mainPID, mainStart := 0, uint64(0)
	if u.MainPID != 0 {
		if pid, err := m.MainHostPID(u); err == nil {
			mainPID, mainStart = pid, procStart(pid)
		}
	}
	ch := make(chan string, 1)
	if _, err := m.conn.StopUnitContext(ctx, name, "replace", ch); err != nil {
		if !isDBusError(err, "org.freedesktop.systemd1.NoSuchUnit") {
			return fmt.Errorf("units: stop unit %s: %w", name, err)
		}
		close(ch) // collected meanwhile: still wait for its processes below
	}
	var jobErr error
	select {
	case result, ok := <-ch:
		if ok && result != "done" {
			// A job that timed out (processes stuck after the final
			// SIGKILL) still ended the unit: what is left decides below.
			jobErr = fmt.Errorf("units: stop unit %s: stop job %s: check the unit with systemctl status %s", name, result, name)
		}
	case <-ctx.Done():
		return fmt.Errorf("units: stop unit %s: waiting for the stop job: %w", name, ctx.Err())
	}

	settle := StopSettle
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < settle {
		settle = time.Until(dl)
	}
	deadline := time.Now().Add(settle)
	for {
		var left []int
		// A unit whose processes are all gone (ExecStopPost done, not yet
		// collected) reports no ControlGroup: CgroupPath would then be the
		// manager's root, whose processes are not the unit's.
		if u.ControlGroup != "" {
			if left, err = CgroupPIDs(m.CgroupPath(u)); err != nil {
				return fmt.Errorf("units: stop unit %s: read cgroup %s: %w", name, m.CgroupPath(u), err)
			}
		}
		mainAlive := mainPID != 0 && procStart(mainPID) == mainStart
		if len(left) == 0 && !mainAlive {
			return jobErr
		}
		if time.Now().After(deadline) {
			if mainAlive {
				left = append(left, mainPID)
			}
			return &RemainError{Unit: name, Settle: settle, PIDs: left, Cgroup: m.CgroupPath(u), MainPID: mainPID}
		}
		if err := ctxsleep.Sleep(ctx, 2*time.Millisecond); err != nil {
			return fmt.Errorf("units: stop unit %s: waiting for its processes to exit: %w", name, err)
		}
	}
}
