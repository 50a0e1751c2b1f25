package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/kibotos/kibotos/vmm/units"
)

// MachineLogTail is how much of the console and VMM logs is kept.
const MachineLogTail = 64 << 10

// watch notices VMMs that end without the node stopping them.
func (rt *Runtime) watch() { rt.everyInstance(rt.cfg.WatchInterval, rt.check) }

// everyInstance calls f on every Instance each interval until the runtime
// closes (a goroutine counted in rt.wg).
func (rt *Runtime) everyInstance(interval time.Duration, f func(*instance)) {
	defer rt.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-rt.ctx.Done():
			return
		case <-t.C:
		}
		for _, in := range rt.all() {
			f(in)
		}
	}
}

// check looks at one running Instance's VMM: its recorded process first
// (cheap), then the unit.
func (rt *Runtime) check(in *instance) {
	in.mu.Lock()
	state, rec := in.state, in.rec
	in.mu.Unlock()
	if state != StateRunning || rec.Process == nil {
		return
	}
	p := rec.Process
	if st, err := procStartTime(p.HostPID); err == nil && st == p.StartTime {
		return
	}
	ctx, cancel := context.WithTimeout(rt.ctx, 5*time.Second)
	defer cancel()
	u, err := rt.units.Get(ctx, rec.Unit)
	var exit string
	switch {
	case errors.Is(err, units.ErrNotFound):
		exit = "unit " + rec.Unit + " gone (collected); main process ended"
	case err != nil:
		if rt.ctx.Err() == nil {
			rt.log.Warn("instance unit not readable", "instance_id", in.id, "unit", rec.Unit, "err", err)
		}
		return
	case u.Active() && u.InvocationID == p.InvocationID:
		return // the main process is ending; the unit follows
	default:
		exit = fmt.Sprintf("unit %s/%s, result %s, exit status %d, invocation %s", u.ActiveState, u.SubState, u.Result, u.ExecMainStatus, u.InvocationID)
	}
	in.mu.Lock()
	running := in.state == StateRunning
	in.mu.Unlock()
	if !running {
		return // being stopped by the node
	}
	// The log tails are kept before the Instance shows FAILED, so whoever
	// sees FAILED finds them.
	if err := rt.copyMachineLogs(in); err != nil {
		rt.log.Warn("instance machine logs not kept", "instance_id", in.id, "err", err)
	}
	why, how := ErrNoLongerRunning, "machine exited"
	if (err == nil && u.Result == unitResultOOM) || oomKilled(p, in.paths.VMMLog) {
		why, how = ErrOOMKilled, "oom-killed"
		exit += " (OOM killer)"
	}
	in.mu.Lock()
	if in.state != StateRunning {
		in.mu.Unlock()
		return
	}
	in.state, in.err, in.how = StateFailed, why, how
	in.notify()
	in.mu.Unlock()
	in.stopGuestLoop()
	rt.machineExited(rt.ctx, in, slog.LevelError, exit)
}

// machineExited writes the one log entry of an Instance's end (its log
// tails are already kept): an error when the machine ended on its own.
func (rt *Runtime) machineExited(ctx context.Context, in *instance, level slog.Level, exit string) {
	rt.log.Log(ctx, level, "instance machine exited", "instance_id", in.id, "unit", in.rec.Unit, "exit", exit,
		"machine_logs", filepath.Join(rt.logsDir, in.id))
}

// copyMachineLogs copies the tails of the console and VMM logs to
// machine-logs/<id>/.
func (rt *Runtime) copyMachineLogs(in *instance) error {
	dst := filepath.Join(rt.logsDir, in.id)
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	var errs []error
	in.awaitConsole(2 * time.Second)
	for _, src := range []string{in.paths.Console, in.paths.VMMLog} {
		read := readTail
		if src == in.paths.Console {
			read = readConsoleTail // with the older half of the ring
		}
		b, err := read(src, MachineLogTail)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := writeFileAtomic(filepath.Join(dst, filepath.Base(src)), b); err != nil {
			errs = append(errs, err)
		}
	}
	in.mu.Lock()
	in.logsCopied = true
	in.mu.Unlock()
	rt.keepMachineLogsWithinQuota(in.id)
	return errors.Join(errs...)
}

func readTail(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > n {
		if _, err := f.Seek(st.Size()-n, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, n))
}

func consoleTail(path string, n int64) string {
	b, err := readConsoleTail(path, n)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return string(b)
}
