package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/kibotos/kibotos/internal/ctxsleep"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/units"
)

// DefaultGrace is the guest's grace for its processes when Delete has to
// stop a running Instance.
const DefaultGrace = 10 * time.Second

// Stop stops a running Instance gracefully: the guest ends its processes
// (grace, then SIGKILL), syncs and freezes the writable layer and Volumes
// and powers off; the VMM exits and Stop returns once the unit's cgroup is
// empty. When the guest cannot prepare the stop (it does not answer, its
// processes do not end, a filesystem cannot be synced or frozen) nothing
// confirms that the data reached disk: Stop returns a *PrepareError and
// leaves the VMM running (the Instance RUNNING); ForceStop ends it.
func (rt *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	in, done, err := rt.beginStop(ctx, id)
	if done || err != nil {
		return err
	}
	in.mu.Lock()
	rec := in.rec
	in.mu.Unlock()
	t0 := time.Now()
	how := "stopped"
	perr := rt.prepareStop(ctx, in, grace)
	if perr != nil && perr.Code == codeConnectionLost && rt.waitProcessGone(ctx, rec.Process, guestConnectWait) {
		// The guest's connection ended without the stop's answer and the
		// VMM exited: the guest powered off (its answer lost) or died.
		// Nothing is left to keep running, but nothing confirmed the data
		// either.
		rt.log.Warn("instance guest connection ended without the stop's answer and the VMM exited; the stop is not confirmed", "instance_id", id, "err", perr.Error())
		perr, how = nil, "forced"
	} else if perr == nil && !rt.waitProcessGone(ctx, rec.Process, 30*time.Second) {
		// The data is on disk; only the VMM did not exit after the
		// poweroff.
		rt.log.Warn("instance VMM still running after the guest powered off, stopping the unit", "instance_id", id)
		how = "forced"
	}
	if perr != nil {
		in.mu.Lock()
		in.state = StateRunning
		in.notify()
		in.mu.Unlock()
		rt.log.Error("instance stop not prepared by the guest; the VMM keeps running", "instance_id", id, "unit", rec.Unit, "err", perr.Error())
		return perr
	}
	return rt.endUnit(ctx, in, how, t0)
}

// ForceStop ends a running Instance without a prepared guest stop: the
// guest is asked for one short sync (when it answers), then the unit is
// stopped. What the guest wrote is not confirmed to be on disk.
func (rt *Runtime) ForceStop(ctx context.Context, id string) error {
	in, done, err := rt.beginStop(ctx, id)
	if done || err != nil {
		return err
	}
	t0 := time.Now()
	in.mu.Lock()
	c := in.guest
	in.mu.Unlock()
	if c != nil {
		sctx, cancel := context.WithTimeout(ctx, ForceSyncTimeout)
		err := c.Sync(sctx)
		cancel()
		rt.log.Info("instance force stop: guest sync", "instance_id", id, "err", err)
	}
	return rt.endUnit(ctx, in, "forced", t0)
}

// ForceSyncTimeout bounds ForceStop's one guest sync.
const ForceSyncTimeout = 3 * time.Second

// guestConnectWait is how long a stop waits for a guest agent that is
// reconnecting (after a node restart, a broken session).
const guestConnectWait = 10 * time.Second

// beginStop moves a RUNNING Instance to STOPPING. done: nothing is left to
// do (STOPPED, or FAILED and its VMM ended now).
func (rt *Runtime) beginStop(ctx context.Context, id string) (in *instance, done bool, err error) {
	in, err = rt.get(id)
	if err != nil {
		return nil, false, err
	}
	in.mu.Lock()
	switch in.state {
	case StateStopped:
		in.mu.Unlock()
		return in, true, nil
	case StateStopping:
		in.mu.Unlock()
		return nil, false, fmt.Errorf("runtime: stop instance %s: already stopping", id)
	case StateStarting:
		in.mu.Unlock()
		return nil, false, fmt.Errorf("runtime: stop instance %s: it is starting; retry once Start returned", id)
	case StateFailed:
		in.mu.Unlock()
		// The VMM may still run (guest refused, start failed): end it.
		return in, true, rt.ensureEnded(ctx, in)
	}
	in.state = StateStopping
	in.notify()
	in.mu.Unlock()
	return in, false, nil
}

// PrepareError is a stop the guest did not prepare; its text begins with
// "prepare guest stop:" as the seed's troubleshooting table quotes it.
type PrepareError struct {
	Code    string // guestproto.CodeDeadlineExceeded, or "" for a filesystem failure
	Message string
}

func (e *PrepareError) Error() string {
	if e.Code != "" {
		return "prepare guest stop: " + e.Code + ": " + e.Message
	}
	return "prepare guest stop: " + e.Message
}

// codeConnectionLost is a stop whose guest connection ended (or the
// caller gave up) before an answer.
const codeConnectionLost = "unavailable"

// prepareStop asks the guest to prepare the stop and power off.
func (rt *Runtime) prepareStop(ctx context.Context, in *instance, grace time.Duration) *PrepareError {
	c := rt.connectedGuest(ctx, in)
	if c == nil {
		return &PrepareError{Code: guestproto.CodeDeadlineExceeded, Message: fmt.Sprintf("the guest agent of instance %s did not answer within %s", in.id, guestConnectWait)}
	}
	// The guest's own bound (grace, then its SIGKILL wait) and a margin.
	wait := grace + 15*time.Second
	sctx, cancel := context.WithTimeout(ctx, wait)
	res, err := c.Stop(sctx, grace)
	timedOut := errors.Is(sctx.Err(), context.DeadlineExceeded)
	cancel()
	var ge *guestproto.Error
	switch {
	case err == nil:
		rt.log.Info("instance guest stop prepared", "instance_id", in.id, "terminated", res.Terminated, "killed", res.Killed, "frozen", res.Frozen)
		if !c.Info().Has(guestproto.CapStopPrepare) {
			// A guest agent of an earlier Platform syncs but freezes
			// nothing: what it wrote may still be in the host's page
			// cache when the VMM ends (the upgrade seed's line).
			rt.log.Warn("stop did not confirm the host flush", "instance_id", in.id, "reason", "the VMM's runtime release does not flush on stop")
		}
		return nil
	case errors.As(err, &ge) && ge.Code == guestproto.CodeDeadlineExceeded:
		return &PrepareError{Code: ge.Code, Message: ge.Message}
	case errors.As(err, &ge) && ge.Code == guestproto.CodeFailed:
		return &PrepareError{Message: ge.Message}
	case errors.As(err, &ge):
		return &PrepareError{Code: ge.Code, Message: ge.Message}
	case timedOut:
		return &PrepareError{Code: guestproto.CodeDeadlineExceeded, Message: fmt.Sprintf("the guest agent of instance %s did not answer the stop within %s", in.id, wait)}
	default:
		return &PrepareError{Code: codeConnectionLost, Message: fmt.Sprintf("instance %s: %v", in.id, err)}
	}
}

// connectedGuest is the Instance's guest client, waiting a little for one
// that is reconnecting; nil if none.
func (rt *Runtime) connectedGuest(ctx context.Context, in *instance) *guestproto.Client {
	deadline := time.NewTimer(guestConnectWait)
	defer deadline.Stop()
	for {
		in.mu.Lock()
		c, changed := in.guest, in.changed
		in.mu.Unlock()
		if c != nil {
			return c
		}
		select {
		case <-changed:
		case <-deadline.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// endUnit stops the Instance's unit (after the guest powered off, or to
// force it), confirms its cgroup is empty and records the Instance
// STOPPED.
func (rt *Runtime) endUnit(ctx context.Context, in *instance, how string, t0 time.Time) error {
	id := in.id
	in.stopGuestLoop()
	in.mu.Lock()
	rec := in.rec
	in.mu.Unlock()
	if err := rt.forceStop(ctx, rec.Unit, rec.Process.InvocationID); err != nil {
		in.mu.Lock()
		in.state, in.err = StateFailed, "stop: "+err.Error()
		in.notify()
		in.mu.Unlock()
		return fmt.Errorf("runtime: stop instance %s: %w", id, err)
	}
	if err := rt.confirmEmpty(ctx, rec); err != nil {
		in.mu.Lock()
		in.state, in.err = StateFailed, "stop: "+err.Error()
		in.notify()
		in.mu.Unlock()
		return fmt.Errorf("runtime: stop instance %s: %w", id, err)
	}
	now := time.Now().UTC()
	stopped := *rec
	stopped.Stopped = &now
	if err := WriteLaunchRecord(in.paths.Dir, &stopped); err != nil {
		return fmt.Errorf("runtime: stop instance %s: %w", id, err)
	}
	in.mu.Lock()
	in.rec, in.state, in.err, in.how = &stopped, StateStopped, "", how
	in.notify()
	in.mu.Unlock()
	rt.log.Info("instance stopped", "instance_id", id, "unit", rec.Unit, "how", how, "took", time.Since(t0).Round(time.Millisecond))
	if rec.Network != nil && usesEgressProcess(rec.Network.Policy) {
		if err := rt.syncEgress(ctx); err != nil {
			rt.log.Warn("egress routes not updated after a stop", "instance_id", id, "err", err)
		}
	}
	return nil
}

// waitProcessGone polls until the recorded VMM process is gone.
func (rt *Runtime) waitProcessGone(ctx context.Context, p *ProcessRecord, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if st, err := procStartTime(p.HostPID); err != nil || st != p.StartTime {
			return true
		}
		if time.Now().After(deadline) || ctxsleep.Sleep(ctx, 5*time.Millisecond) != nil {
			return false
		}
	}
}

// forceStop stops the unit if it still runs the given invocation. A unit
// of the same name running another invocation is not ours to stop.
func (rt *Runtime) forceStop(ctx context.Context, unit, invocation string) error {
	u, err := rt.units.Get(ctx, unit)
	if errors.Is(err, units.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if invocation != "" && u.InvocationID != invocation && u.Active() {
		return fmt.Errorf("stop instance process this node did not take over: unit %s runs invocation %s, the launch record has %s; inspect it with systemctl show %s",
			unit, u.InvocationID, invocation, unit)
	}
	err = rt.units.Stop(ctx, unit)
	var remain *units.RemainError
	if errors.As(err, &remain) {
		return nil // the unit ended; confirmEmpty waits for what is left
	}
	return err
}

// CleanupPendingError is a VMM unit that ended while its cgroup still
// holds processes (stuck in the kernel, most often on storage): the node
// waits for them as long as it takes.
type CleanupPendingError struct {
	Cgroup    string
	PIDs      []int
	MainAlive bool
}

func (e *CleanupPendingError) Error() string {
	return fmt.Sprintf("instance cleanup pending: cgroup %s still holds host PIDs %v (main process alive: %v)", e.Cgroup, e.PIDs, e.MainAlive)
}

// checkEmpty is one look at the recorded cgroup and main process.
func (rt *Runtime) checkEmpty(rec *LaunchRecord) error {
	if rec.Process == nil {
		return nil
	}
	cg := rt.units.CgroupPath(units.Unit{ControlGroup: rec.Process.ControlGroup})
	pids, err := units.CgroupPIDs(cg)
	if err != nil {
		return fmt.Errorf("read cgroup %s: %w", cg, err)
	}
	st, serr := procStartTime(rec.Process.HostPID)
	mainAlive := serr == nil && st == rec.Process.StartTime
	if len(pids) == 0 && !mainAlive {
		return nil
	}
	return &CleanupPendingError{Cgroup: cg, PIDs: pids, MainAlive: mainAlive}
}

// confirmEmpty waits until the recorded cgroup holds no process and the
// recorded main process is gone (systemd may report a stop before
// reaping), for units.StopSettle; then for as long as it takes while the
// node logs "instance cleanup pending" (the seed's troubleshooting row):
// processes stuck in the kernel end once their storage answers, and only
// then is the Instance's VMM really gone. It gives up only when the
// runtime closes.
func (rt *Runtime) confirmEmpty(ctx context.Context, rec *LaunchRecord) error {
	deadline := time.Now().Add(units.StopSettle)
	for {
		err := rt.checkEmpty(rec)
		var pending *CleanupPendingError
		if err == nil || !errors.As(err, &pending) {
			return err
		}
		if time.Now().After(deadline) {
			return rt.awaitCleanup(rec, pending)
		}
		if err := ctxsleep.Sleep(ctx, 5*time.Millisecond); err != nil {
			return fmt.Errorf("waiting for cgroup %s to empty: %w", pending.Cgroup, err)
		}
	}
}

// Backoff of the checks of a pending cleanup.
const (
	cleanupRetryMin = time.Second
	cleanupRetryMax = 30 * time.Second
)

// awaitCleanup retries a pending cleanup with backoff until the cgroup is
// empty; the runtime's context (not a command's) bounds it.
func (rt *Runtime) awaitCleanup(rec *LaunchRecord, pending *CleanupPendingError) error {
	since, delay := time.Now(), cleanupRetryMin
	for {
		rt.log.Warn("instance cleanup pending", "instance_id", rec.InstanceID, "unit", rec.Unit, "since", since.UTC().Format(time.RFC3339),
			"cgroup", pending.Cgroup, "host_pids", pending.PIDs, "main_alive", pending.MainAlive, "retry_in", delay)
		if err := ctxsleep.Sleep(rt.ctx, delay); err != nil {
			return fmt.Errorf("%w; the node is closing: the next start of the node checks again", pending)
		}
		delay = min(delay*2, cleanupRetryMax)
		err := rt.checkEmpty(rec)
		if err == nil {
			rt.log.Info("instance cleanup done", "instance_id", rec.InstanceID, "unit", rec.Unit, "pending_for", time.Since(since).Round(time.Millisecond))
			return nil
		}
		if !errors.As(err, &pending) {
			return err
		}
	}
}

// ensureEnded makes sure the VMM of a FAILED Instance is gone: a unit still
// running the recorded invocation is stopped; another one is refused.
func (rt *Runtime) ensureEnded(ctx context.Context, in *instance) error {
	in.stopGuestLoop()
	in.mu.Lock()
	rec := in.rec
	in.mu.Unlock()
	inv := ""
	if rec.Process != nil {
		inv = rec.Process.InvocationID
		// The VMM may never have been taken over (its pool or installation
		// was missing): before stopping a service that still runs, the
		// launch record, its unit binding, the node's own record and the
		// actual service must all name the same process; any doubt leaves
		// it running.
		if u, err := rt.units.Get(ctx, rec.Unit); err == nil && u.Active() {
			if why := rt.ownershipDoubt(in, rec, u); why != "" && !rt.endedByItself(ctx, rec) {
				return fmt.Errorf("runtime: instance %s: stop instance process this node did not take over: %s; the service keeps running: inspect it with systemctl show %s",
					in.id, why, rec.Unit)
			}
		}
	} else if u, err := rt.units.Get(ctx, rec.Unit); err == nil && u.Active() {
		return fmt.Errorf("runtime: instance %s: stop instance process this node did not take over: unit %s runs (invocation %s) but the launch record was never completed",
			in.id, rec.Unit, u.InvocationID)
	}
	if err := rt.forceStop(ctx, rec.Unit, inv); err != nil {
		return fmt.Errorf("runtime: instance %s: %w", in.id, err)
	}
	if err := rt.confirmEmpty(ctx, rec); err != nil {
		return fmt.Errorf("runtime: instance %s: %w", in.id, err)
	}
	return nil
}

// endedUnitWait bounds the wait for the unit of a VMM that ended by
// itself to go inactive (systemd notices the exit at once).
const endedUnitWait = 10 * time.Second

// endedByItself reports whether the recorded VMM process has ended on its
// own and its unit followed within endedUnitWait: then the doubts about a
// process that is no longer there (a zombie has no executable to compare)
// are moot and there is nothing to stop. The fault harness saw a VMM exit
// as its node paused it; the node refused to stop it and never deleted
// the paused Instance.
func (rt *Runtime) endedByItself(ctx context.Context, rec *LaunchRecord) bool {
	p := rec.Process
	if p == nil || !procEnded(p.HostPID, p.StartTime) {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, endedUnitWait)
	defer cancel()
	for {
		u, err := rt.units.Get(ctx, rec.Unit)
		if errors.Is(err, units.ErrNotFound) || err == nil && !u.Active() {
			rt.log.Info("instance process ended by itself before the node stopped it", "unit", rec.Unit, "host_pid", p.HostPID, "instance_id", rec.InstanceID)
			return true
		}
		if ctxsleep.Sleep(ctx, 100*time.Millisecond) != nil {
			return false
		}
	}
}

// ownershipDoubt says how the launch record on disk, the node's record
// of the Instance (rec) and the running unit u disagree about the VMM
// process, or "" when they name the same one.
func (rt *Runtime) ownershipDoubt(in *instance, rec *LaunchRecord, u units.Unit) string {
	path := filepath.Join(in.paths.Dir, LaunchRecordFile)
	disk, err := ReadLaunchRecord(path)
	switch {
	case err != nil:
		return fmt.Sprintf("launch record unreadable: %v", err)
	case disk.Unit != rec.Unit:
		return fmt.Sprintf("launch record %s binds unit %s, the node's record %s", path, disk.Unit, rec.Unit)
	case !sameProcess(disk.Process, rec.Process):
		return fmt.Sprintf("launch record %s names process %s, the node's record %s", path, describeProcess(disk.Process), describeProcess(rec.Process))
	}
	if why := rt.mismatch(rec, u); why != "" {
		return fmt.Sprintf("unit %s does not match the records: %s", rec.Unit, why)
	}
	return ""
}

// sameProcess compares what identifies the process (StartedAt is this
// node's clock reading, not the process's identity).
func sameProcess(a, b *ProcessRecord) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, y := *a, *b
	x.StartedAt, y.StartedAt = time.Time{}, time.Time{}
	return x == y
}

func describeProcess(p *ProcessRecord) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprintf("(invocation %s, MainPID %d, host PID %d, start time %d, %s %d:%d, cgroup %s)",
		p.InvocationID, p.MainPID, p.HostPID, p.StartTime, p.Exe, p.ExeDev, p.ExeIno, p.ControlGroup)
}

// Fence ends an Instance's VMM at once, without asking the guest: an
// object it writes was handed to another node, and every further write
// could corrupt it. The Instance is FAILED with reason (its record stays
// until Delete, as when a VMM ends on its own); nothing is flushed.
func (rt *Runtime) Fence(ctx context.Context, id, reason string) error {
	in, err := rt.get(id)
	if err != nil {
		return err
	}
	in.mu.Lock()
	if in.state == StateStopped {
		in.mu.Unlock()
		return nil
	}
	// FAILED first: the watch loop sees the VMM go and leaves it so.
	in.state, in.err, in.how = StateFailed, reason, "fenced"
	in.notify()
	in.mu.Unlock()
	t0 := time.Now()
	if err := rt.ensureEnded(ctx, in); err != nil {
		return err
	}
	rt.log.Warn("instance fenced", "instance_id", id, "reason", reason, "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// Delete stops the Instance if needed, confirms its cgroup is empty, keeps
// the console and VMM log tails, moves its record to the registry and
// removes the Instance directory.
func (rt *Runtime) Delete(ctx context.Context, id string) error {
	in, err := rt.get(id)
	if err != nil {
		return err
	}
	in.mu.Lock()
	state := in.state
	in.mu.Unlock()
	switch state {
	case StateRunning:
		// What is deleted needs no confirmed flush: a guest that cannot
		// prepare the stop is ended anyway. A warm guest has nothing to
		// flush, and one kept ready cannot answer.
		var err error
		if !IsWarm(id) {
			err = rt.Stop(ctx, id, DefaultGrace)
		} else {
			err = rt.ForceStop(ctx, id)
		}
		var perr *PrepareError
		if errors.As(err, &perr) {
			rt.log.Warn("instance deleted without a prepared guest stop", "instance_id", id, "err", perr.Error())
			err = rt.ForceStop(ctx, id)
		}
		if err != nil {
			return err
		}
	case StateStarting, StateStopping:
		return fmt.Errorf("runtime: delete instance %s: it is %s; retry once that finished", id, state)
	case StateFailed, StateStopped:
		if err := rt.ensureEnded(ctx, in); err != nil {
			return err
		}
	}
	in.mu.Lock()
	rec, how, errText, copied := in.rec, in.how, in.err, in.logsCopied
	in.mu.Unlock()
	if !copied {
		if err := rt.copyMachineLogs(in); err != nil {
			rt.log.Warn("instance machine logs not kept", "instance_id", id, "err", err)
		}
		// Every end has its one entry, with where the tails are: one
		// that ended on its own had it (an error) when it did; one the
		// node ended (a stop, a pause, a fence) has it now.
		rt.machineExited(ctx, in, slog.LevelInfo, how)
	}
	ended := &EndedRecord{
		FormatVersion: RecordVersion,
		InstanceID:    id,
		EndedAt:       time.Now().UTC(),
		How:           how,
		Error:         errText,
		Launch:        *rec,
	}
	if err := writeJSON(filepath.Join(rt.registryDir, id+".json"), ended); err != nil {
		return fmt.Errorf("runtime: delete instance %s: %w", id, err)
	}
	if err := rt.deleteNetwork(ctx, id, rec.Network); err != nil {
		return err
	}
	if rec.Network != nil && usesEgressProcess(rec.Network.Policy) {
		defer func() {
			if err := rt.syncEgress(ctx); err != nil {
				rt.log.Warn("egress routes not updated after a delete", "instance_id", id, "err", err)
			}
		}()
	}
	if err := os.RemoveAll(in.paths.Dir); err != nil {
		return fmt.Errorf("runtime: delete instance %s: remove %s: %w", id, in.paths.Dir, err)
	}
	rt.mu.Lock()
	delete(rt.instances, id)
	rt.mu.Unlock()
	rt.log.Info("instance deleted", "instance_id", id, "how", how)
	return nil
}
