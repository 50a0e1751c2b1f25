package runtime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/kibotos/kibotos/vmm/units"
)

// verdict is what takeover found of one launch record.
type verdict struct {
	rec   *LaunchRecord
	state State
	err   string
	gone  bool // the machine ended while no node watched
	// completed: the record named no process, and takeover found its
	// launch's (interruptedLaunch); adopt writes it.
	completed bool
}

// takeover matches every launch record with the running units. Nothing is
// registered, connected or removed unless every record and every running
// kibotos-vmm unit is accounted for.
func (rt *Runtime) takeover(ctx context.Context) error {
	verdicts, noRecord, problems, err := rt.inspect(ctx)
	if err != nil {
		return err
	}
	if len(problems) > 0 {
		return fmt.Errorf("runtime: takeover refused, nothing was changed: %w", errors.Join(problems...))
	}
	return rt.adopt(ctx, verdicts, noRecord)
}

// inspect reads every launch record and the running units, changing
// nothing: a verdict per record, the Instance directories without a
// record, and what the node cannot vouch for (problems).
func (rt *Runtime) inspect(ctx context.Context) (verdicts []verdict, noRecord []string, problems []error, err error) {
	ents, err := os.ReadDir(rt.instancesDir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("runtime: open: %w", err)
	}
	var recs []*LaunchRecord
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		path := filepath.Join(rt.instancesDir, e.Name(), LaunchRecordFile)
		rec, err := ReadLaunchRecord(path)
		if errors.Is(err, fs.ErrNotExist) {
			// The record is written before the unit starts: nothing ran here.
			noRecord = append(noRecord, filepath.Join(rt.instancesDir, e.Name()))
			continue
		}
		if err != nil {
			problems = append(problems, err)
			continue
		}
		recs = append(recs, rec)
	}
	// Without a service manager (check-maintenance of a node whose
	// private systemd ended with it) no VMM unit runs.
	var running []units.Unit
	if rt.units != nil {
		if running, err = rt.units.List(ctx, UnitPrefix+"*"); err != nil {
			return nil, nil, nil, fmt.Errorf("runtime: open: %w", err)
		}
	}
	byName := map[string]units.Unit{}
	for _, u := range running {
		byName[u.Name] = u
	}
	claimed := map[string]bool{}
	for _, rec := range recs {
		path := filepath.Join(rt.instancesDir, rec.dirName(), LaunchRecordFile)
		u, present := byName[rec.Unit]
		active := present && u.Active()
		claimed[rec.Unit] = true
		completed := false
		if rec.Process == nil && rec.Stopped == nil && active {
			proc, err := rt.interruptedLaunch(ctx, rec, u)
			if err != nil {
				problems = append(problems, fmt.Errorf("launch record %s was never completed, but unit %s runs (invocation %s, MainPID %d): %w; inspect it with systemctl show %s and stop only that unit",
					path, rec.Unit, u.InvocationID, u.MainPID, err, rec.Unit))
				continue
			}
			rec.Process, completed = proc, true
		}
		switch {
		case rec.Stopped != nil && active:
			problems = append(problems, fmt.Errorf("launch record %s says instance %s was stopped, but unit %s runs (invocation %s, MainPID %d): inspect it with systemctl show %s",
				path, rec.InstanceID, rec.Unit, u.InvocationID, u.MainPID, rec.Unit))
		case rec.Stopped != nil:
			verdicts = append(verdicts, verdict{rec: rec, state: StateStopped})
		case rec.Process == nil:
			verdicts = append(verdicts, verdict{rec: rec, state: StateFailed, err: "start interrupted before the VMM was recorded as running"})
		case !active && ((present && u.Result == unitResultOOM) || oomKilled(rec.Process, pathsOf(filepath.Join(rt.instancesDir, rec.dirName()), rec).VMMLog)):
			verdicts = append(verdicts, verdict{rec: rec, state: StateFailed, err: ErrOOMKilled, gone: true})
		case !active:
			verdicts = append(verdicts, verdict{rec: rec, state: StateFailed, err: ErrNoLongerRunning, gone: true})
		default:
			if why := rt.mismatch(rec, u); why != "" {
				problems = append(problems, fmt.Errorf("launch record %s does not match unit %s: %s; keep the record, inspect the unit with systemctl show %s and stop only that unit once you know whose it is",
					path, rec.Unit, why, rec.Unit))
				continue
			}
			state := StateRunning
			if rec.Guest == nil {
				// The node ended before the guest ever answered: the launch
				// is still waiting for its readiness check.
				state = StateStarting
			}
			verdicts = append(verdicts, verdict{rec: rec, state: state, completed: completed})
		}
	}
	for _, u := range running {
		if !claimed[u.Name] && u.Active() {
			problems = append(problems, fmt.Errorf("unit %s (invocation %s, MainPID %d) has no launch record under %s: it is not an Instance this node can take over; inspect it with systemctl show %s and stop only that unit",
				u.Name, u.InvocationID, u.MainPID, rt.instancesDir, u.Name))
		}
	}
	return verdicts, noRecord, problems, nil
}

// adopt registers the inspected Instances and removes the directories
// without a record.
func (rt *Runtime) adopt(ctx context.Context, verdicts []verdict, noRecord []string) error {
	for _, dir := range noRecord {
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("runtime: open: remove instance directory %s without launch record: %w", dir, err)
		}
		rt.log.Info("instance directory without launch record removed", "dir", dir)
	}
	unopened := rt.openPools(ctx, verdicts)
	installations := rt.installationFailures(verdicts)
	for i := range verdicts {
		v := &verdicts[i]
		if v.completed {
			if err := WriteLaunchRecord(filepath.Join(rt.instancesDir, v.rec.dirName()), v.rec); err != nil {
				return fmt.Errorf("runtime: open: complete the launch record of instance %s: %w", v.rec.InstanceID, err)
			}
			rt.log.Warn("instance start cut short after its VMM started; its process recorded now", "instance_id", v.rec.InstanceID,
				"unit", v.rec.Unit, "invocation_id", v.rec.Process.InvocationID, "host_pid", v.rec.Process.HostPID)
		}
		// kept: FAILED, but its VMM runs on (nothing of the guest is
		// lost) until stop --force; how says why.
		kept, how := false, ""
		live := v.state == StateRunning || v.state == StateStarting
		if why := rt.poolFailure(v.rec, unopened); why != "" && live {
			// Its layer or a Volume cannot be vouched for: the node does
			// not take it over.
			v.state, v.err, kept, how = StateFailed, why, true, "storage pool unavailable"
			rt.log.Error("instance takeover failed", "instance_id", v.rec.InstanceID, "err", v.err)
		} else if v.rec.Unfinished && live {
			// Its start was cut short: the guest may never have been told
			// its filesystem, its Volumes or its identity. Nothing of it is
			// the user's yet; the start is done again over it.
			v.state, kept, how = StateFailed, true, "start interrupted"
			v.err = "start interrupted by a node restart before it was done: delete the Instance and start it again"
			rt.log.Warn("instance start cut short by a node restart; not taken over as started", "instance_id", v.rec.InstanceID)
		} else if why := installations[v.rec.InstallationDir]; why != "" && live {
			// This build cannot keep driving the Platform it started on.
			v.state, kept, how = StateFailed, true, "runtime installation unavailable"
			v.err = fmt.Sprintf("recover instance process: runtime installation %s: %s: %s", v.rec.InstallationID, why, ErrInstallationUnavailable)
			rt.log.Error("earlier runtime installation cannot be retained", "instance_id", v.rec.InstanceID,
				"installation", v.rec.InstallationID, "reason", why)
		}
		if v.rec.Network != nil {
			rt.net.hold(v.rec.InstanceID, v.rec.Network)
		}
		if nr := v.rec.Network; nr != nil && (v.state == StateRunning || v.state == StateStarting || kept) {
			rewritten, isolated := rt.checkNetwork(ctx, v.rec)
			switch {
			case isolated != "":
				// The VMM keeps running (nothing of the guest is lost), but
				// without a table the node can vouch for it reaches nothing.
				if kept {
					v.err += "; network isolated: " + isolated
				} else {
					v.state, v.err = StateFailed, "network isolated: "+isolated
				}
				rt.log.Error("instance network isolated", "instance_id", v.rec.InstanceID, "namespace", nr.Namespace, "reason", isolated)
			case len(rewritten) > 0:
				rt.log.Warn("slot table rewritten from the recorded network policy", "instance_id", v.rec.InstanceID,
					"namespace", nr.Namespace, "differences", strings.Join(rewritten, "; "))
			}
		}
		in := &instance{
			id:      v.rec.InstanceID,
			paths:   pathsOf(filepath.Join(rt.instancesDir, v.rec.dirName()), v.rec),
			rec:     v.rec,
			state:   v.state,
			err:     v.err,
			changed: make(chan struct{}),
		}
		switch v.state {
		case StateStopped:
			in.how = "stopped"
		case StateFailed:
			switch {
			case v.rec.Process == nil:
				in.how = "never started"
			case v.gone:
				in.how = "machine exited"
			case kept:
				in.how = how // its VMM still runs
			default:
				in.how = "network isolated" // its VMM still runs
			}
		}
		rt.instances[in.id] = in
		if v.gone {
			// Noticed now: the machine ended while no node was watching.
			if _, err := os.Stat(filepath.Join(rt.logsDir, in.id)); errors.Is(err, fs.ErrNotExist) {
				if err := rt.copyMachineLogs(in); err != nil {
					rt.log.Warn("instance machine logs not kept", "instance_id", in.id, "err", err)
				}
				rt.machineExited(ctx, in, slog.LevelError, "unit "+v.rec.Unit+" gone while the node was down")
			} else {
				in.logsCopied = true
			}
		}
		if (v.state == StateStarting || v.state == StateRunning) && in.paths.ConsoleSocket != "" {
			// Reconnect to the console: QEMU dropped what the guest wrote
			// while no node read it.
			rt.startConsole(in)
		}
		if v.state == StateStarting {
			rt.log.Info("instance taken over before its guest answered", "instance_id", in.id, "unit", v.rec.Unit,
				"invocation_id", v.rec.Process.InvocationID, "host_pid", v.rec.Process.HostPID)
			rt.wg.Add(1)
			go func() {
				defer rt.wg.Done()
				if err := rt.awaitGuest(rt.ctx, in); err != nil && rt.ctx.Err() == nil {
					err = errors.Join(err, rt.abortLaunch(rt.ctx, v.rec.Unit, v.rec.Process.InvocationID))
					in.mu.Lock()
					in.state, in.err, in.how = StateFailed, err.Error(), "start failed"
					in.notify()
					in.mu.Unlock()
					rt.log.Error("instance takeover failed", "instance_id", in.id, "err", err)
				}
			}()
		}
		if v.state == StateRunning {
			rt.log.Info("instance taken over", "instance_id", in.id, "unit", v.rec.Unit,
				"invocation_id", v.rec.Process.InvocationID, "host_pid", v.rec.Process.HostPID)
			rt.startGuestLoop(in, nil)
		}
	}
	return nil
}

// vmmUnitDescription names the Instance and the launch in its VMM unit's
// description: the one property of a unit that says which launch started
// it, before the record names its process.
func vmmUnitDescription(instance, launch string) string {
	return "kibotos VMM of instance " + instance + ", launch " + launch
}

// interruptedLaunch identifies the process of a launch whose record was
// never completed while its unit runs: the node ended after the unit
// started and before it recorded the process. The record is written
// before the unit starts, and the unit's description names the launch,
// unique to it, so a unit that names it is this launch's; one that does
// not (started by a build from before the launch was named) is not
// vouched for. The process is read as the launch reads it, and checked
// against the record as any other (mismatch).
func (rt *Runtime) interruptedLaunch(ctx context.Context, rec *LaunchRecord, u units.Unit) (*ProcessRecord, error) {
	if want := vmmUnitDescription(rec.InstanceID, rec.LaunchID); u.Description != want {
		return nil, fmt.Errorf("the node cannot tell it is this launch (its description %q is not %q)", u.Description, want)
	}
	if len(rec.VMMArgv) == 0 {
		return nil, errors.New("the record names no VMM command")
	}
	proc, err := rt.identify(ctx, u, rec.VMMArgv[0])
	if err != nil {
		return nil, err
	}
	if rec.Network != nil && rt.net != nil { // nil: a check of a stopped node
		proc.NetNS = rt.net.ns.ManagerPath(rec.Network.Namespace)
	}
	return proc, nil
}

// mismatch says how the running unit differs from the record, or "".
func (rt *Runtime) mismatch(rec *LaunchRecord, u units.Unit) string {
	p := rec.Process
	var why []string
	if u.InvocationID != p.InvocationID {
		why = append(why, fmt.Sprintf("InvocationID %s, recorded %s", u.InvocationID, p.InvocationID))
	}
	if u.MainPID != p.MainPID {
		why = append(why, fmt.Sprintf("MainPID %d, recorded %d", u.MainPID, p.MainPID))
	}
	if u.ControlGroup != p.ControlGroup {
		why = append(why, fmt.Sprintf("cgroup %s, recorded %s", u.ControlGroup, p.ControlGroup))
	}
	hostPID, err := rt.units.MainHostPID(u)
	if err != nil {
		return strings.Join(append(why, err.Error()), "; ")
	}
	if hostPID != p.HostPID {
		why = append(why, fmt.Sprintf("host PID %d, recorded %d", hostPID, p.HostPID))
	}
	if st, err := procStartTime(hostPID); err != nil {
		why = append(why, fmt.Sprintf("process start time of host PID %d unreadable (%v), recorded %d", hostPID, err, p.StartTime))
	} else if st != p.StartTime {
		why = append(why, fmt.Sprintf("process start time %d, recorded %d", st, p.StartTime))
	}
	// An executable unlinked since the launch (a package upgrade renamed
	// a new binary over it) is still the one launched: dev:ino say so.
	if exe, dev, ino, err := procExe(hostPID); err != nil {
		why = append(why, fmt.Sprintf("executable of host PID %d unreadable (%v), recorded %s %d:%d", hostPID, err, p.Exe, p.ExeDev, p.ExeIno))
	} else if dev != p.ExeDev || ino != p.ExeIno || strings.TrimSuffix(exe, deletedSuffix) != p.Exe {
		why = append(why, fmt.Sprintf("executable %s dev:ino %d:%d, recorded %s %d:%d", exe, dev, ino, p.Exe, p.ExeDev, p.ExeIno))
	}
	// A launch from before VMM confinement runs as root; a confined one
	// as the account it recorded.
	wantUID := 0
	if rec.Confinement != nil {
		wantUID = rec.Confinement.UID
	}
	if uid, err := procUID(hostPID); err != nil {
		why = append(why, fmt.Sprintf("uid of host PID %d unreadable: %v", hostPID, err))
	} else if uid != wantUID {
		why = append(why, fmt.Sprintf("process uid %d, recorded %d", uid, wantUID))
	}
	if m := rt.netnsMismatch(hostPID, p.NetNS); m != "" {
		why = append(why, m)
	}
	return strings.Join(why, "; ")
}
