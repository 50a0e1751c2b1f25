package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/kibotos/kibotos/internal/revert"
	"github.com/kibotos/kibotos/netpol"
	"github.com/kibotos/kibotos/vmm/units"
)

// The steps of a start, in the order they run; Config.Observe is told how
// long each took when it completed (beside StepBoot for the whole start).
// A step that has nothing to do for a spec (no disk, no network, no
// snapshot, an unconfined VMM) is not run, nor timed.
const (
	StepReadLayer       = "read-layer"       // the layer's backing chain, which the VMM must be able to open
	StepPrepareDirs     = "prepare-dirs"     // the Instance directory the VMM account creates its sockets in
	StepComposeLaunch   = "compose-launch"   // the VMM command line and the launch record (a snapshot's is read)
	StepReserveNetwork  = "reserve-network"  // the guest's addresses
	StepWriteRecord     = "write-record"     // the launch record, before anything runs
	StepCheckSnapshot   = "check-snapshot"   // a restore's snapshot against this launch
	StepCreateDisk      = "create-disk"      // the scratch disk
	StepEnsureLayer     = "ensure-layer"     // the Workspace's writable layer over its template image
	StepGrantFiles      = "grant-files"      // the files QEMU opens, to the VMM account
	StepCreateNetwork   = "create-network"   // namespace, links and rule table
	StepRouteEgress     = "route-egress"     // the egress process's routes and TPROXY
	StepLaunchUnit      = "launch-unit"      // the VMM's systemd unit
	StepIdentifyVMM     = "identify-vmm"     // the unit's main process, once it is the VMM
	StepRecordProcess   = "record-process"   // that process in the launch record, and the console attached
	StepRestoreSnapshot = "restore-snapshot" // the saved guest loaded into the VMM
	StepAwaitGuest      = "await-guest"      // the guest agent's answer
	StepTellGuest       = "tell-guest"       // the guest configured as the spec asks
	StepFinish          = "finish"           // the launch record says the start is done (not for a Staged spec)
)

// StartSteps are every step a start can run, in order.
func StartSteps() []string {
	return []string{StepReadLayer, StepPrepareDirs, StepComposeLaunch, StepReserveNetwork, StepWriteRecord,
		StepCheckSnapshot, StepCreateDisk, StepEnsureLayer, StepGrantFiles, StepCreateNetwork, StepRouteEgress,
		StepLaunchUnit, StepIdentifyVMM, StepRecordProcess, StepRestoreSnapshot, StepAwaitGuest, StepTellGuest, StepFinish}
}

// step is one named step of a start. It registers the undo of what it
// made on the launch's reverter as soon as it made it; on any later
// failure the undos run, last first.
type step struct {
	name string
	run  func(ctx context.Context) error
}

// launch is one start in progress: what its steps hand on to the next.
//
// A start runs once per Instance directory (Start refuses one that
// exists), so its steps never meet their own leftovers, except where a
// node died part way: createNetwork replaces a stale namespace and
// EnsureLayer keeps a layer that is there. A node that died after
// record-process finds the launch at takeover and re-enters it at
// await-guest alone (adopt); one that died before finds a record without
// a process, and the Instance FAILED.
type launch struct {
	rt   *Runtime
	in   *instance
	spec Spec
	rv   *revert.Reverter
	t0   time.Time

	p         Paths
	sh        string
	vmm       []string // the VMM's own argv (rec.Argv wraps it)
	rec       *LaunchRecord
	meta      SnapshotMeta
	metaErr   error
	netKept   bool // a restored guest's network is as it was saved
	stateOK   *stateCheck
	netnsPath string
	unit      units.Unit
	unitUpIn  time.Duration
	proc      *ProcessRecord
}

// start runs the steps of spec's launch of in; on a failure, the undos of
// the steps done, last first. The Instance directory and its launch
// record stay for Delete: they say what ran.
func (rt *Runtime) start(ctx context.Context, in *instance, spec Spec) error {
	l := &launch{rt: rt, in: in, spec: spec, rv: revert.New(rt.log.With("instance_id", in.id)), t0: time.Now(), p: in.paths}
	defer l.close()
	for _, s := range l.steps() {
		t := time.Now()
		if err := s.run(ctx); err != nil {
			if uerr := l.rv.Fail(ctx); uerr != nil {
				return errors.Join(err, uerr)
			}
			return err
		}
		rt.observe(s.name, t)
	}
	l.rv.Success()
	rt.log.Info("instance started", "instance_id", in.id, "unit", l.rec.Unit, "invocation_id", l.proc.InvocationID,
		"host_pid", l.proc.HostPID, "unit_started_in", l.unitUpIn.Round(time.Microsecond), "guest_answered_in", time.Since(l.t0).Round(time.Millisecond))
	return nil
}

// steps are the steps spec needs, in order.
func (l *launch) steps() []step {
	spec, confined := l.spec, l.rt.vmm != nil
	var s []step
	add := func(when bool, name string, run func(context.Context) error) {
		if when {
			s = append(s, step{name, run})
		}
	}
	add(spec.RootImage != "", StepReadLayer, l.readLayer)
	add(confined, StepPrepareDirs, l.prepareDirs)
	add(true, StepComposeLaunch, l.compose)
	add(spec.Network, StepReserveNetwork, l.reserveNetwork)
	add(true, StepWriteRecord, l.writeRecord)
	add(spec.Restore != nil, StepCheckSnapshot, l.checkSnapshot)
	add(l.p.Disk != "", StepCreateDisk, l.createDisk)
	add(spec.RootImage != "", StepEnsureLayer, l.ensureLayer)
	add(confined, StepGrantFiles, l.grantFiles)
	add(spec.Network, StepCreateNetwork, l.createNetwork)
	add(spec.Network && usesEgressProcess(spec.Policy), StepRouteEgress, l.routeEgress)
	add(true, StepLaunchUnit, l.launchUnit)
	add(true, StepIdentifyVMM, l.identify)
	add(true, StepRecordProcess, l.recordProcess)
	add(spec.Restore != nil, StepRestoreSnapshot, l.restore)
	add(true, StepAwaitGuest, l.awaitGuest)
	add(true, StepTellGuest, l.tellGuest)
	add(!spec.Staged, StepFinish, l.finish)
	return s
}

// close ends what the launch ran beside its steps, success or not.
func (l *launch) close() {
	if l.stateOK != nil {
		l.stateOK.stop()
	}
}

func (l *launch) readLayer(context.Context) error {
	if l.spec.LayerPath == "" {
		return fmt.Errorf("runtime: instance %s: a root image needs a layer path", l.in.id)
	}
	bases, err := LayerBases(l.spec.LayerPath)
	if err != nil {
		return fmt.Errorf("runtime: instance %s: %w", l.in.id, err)
	}
	l.p.Layer, l.p.LayerBases = l.spec.LayerPath, bases
	return nil
}

func (l *launch) prepareDirs(context.Context) error {
	if err := l.rt.prepareVMMDirs(l.p); err != nil {
		return fmt.Errorf("runtime: instance %s: %w", l.in.id, err)
	}
	return nil
}

func (l *launch) compose(context.Context) error {
	rt, spec := l.rt, l.spec
	if spec.Network {
		l.p.Tap = netpol.TapName
	}
	vmm, err := rt.backend.Argv(spec, l.p)
	if err != nil {
		return err
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		return fmt.Errorf("no sh to wrap the VMM's log: %w", err)
	}
	if sh, err = filepath.Abs(sh); err != nil {
		return fmt.Errorf("%s: the shell wrapping the VMM's log: %w", StepComposeLaunch, err)
	}
	var lid [16]byte
	rand.Read(lid[:])
	rec := &LaunchRecord{
		InstanceID:      l.in.id,
		NodeID:          rt.cfg.NodeID,
		LaunchID:        hex.EncodeToString(lid[:]),
		Unit:            UnitName(l.in.id),
		Backend:         rt.backend.Name(),
		Argv:            wrapLog(sh, vmm),
		VMMArgv:         vmm,
		InstallationID:  spec.Installation.ID,
		InstallationDir: spec.Installation.Dir,
		VCPUs:           spec.VCPUs,
		MemoryMiB:       spec.MemoryMiB,
		DiskMiB:         spec.DiskMiB,
		RootImage:       spec.RootImage,
		LayerPath:       spec.LayerPath,
		Volumes:         spec.Volumes,
		CreatedAt:       time.Now().UTC(),
		Unfinished:      true,
	}
	memMax, tasksMax := vmmLimits(spec.MemoryMiB, spec.VCPUs)
	if rt.vmm != nil {
		rec.Confinement = &Confinement{User: rt.vmm.name, UID: rt.vmm.uid, GID: rt.vmm.gid, Seccomp: true, Console: "socket",
			MemoryMax: memMax, TasksMax: tasksMax}
	}
	// A snapshot's record, read once: its network steers the addresses,
	// and it is checked against the launch (check-snapshot).
	if spec.Restore != nil {
		l.meta, l.metaErr = readSnapshotMeta(spec.Restore.Dir)
		// The restored guest booted with the saved one's configuration.
		rec.Configured = l.meta.Configured
	}
	l.sh, l.vmm, l.rec = sh, vmm, rec
	return nil
}

// reserveNetwork picks the guest's addresses. Its undo takes down the
// whole network (create-network's too: one undo, gone already is fine)
// and frees the addresses.
func (l *launch) reserveNetwork(context.Context) error {
	if err := l.rt.checkEgressPolicy(l.in.id, l.spec.Policy); err != nil {
		return err
	}
	// A restored guest keeps its addresses where they are free.
	nr, err := l.rt.net.reserve(l.in.id, l.spec.Policy, l.meta.Network)
	if err != nil {
		return err
	}
	l.rec.Network = nr
	l.rv.Add(StepReserveNetwork, func(ctx context.Context) error { return l.rt.deleteNetwork(ctx, l.in.id, nr) })
	return nil
}

func (l *launch) writeRecord(context.Context) error {
	if err := WriteLaunchRecord(l.p.Dir, l.rec); err != nil {
		return err
	}
	l.in.mu.Lock()
	l.in.rec = l.rec
	l.in.mu.Unlock()
	return nil
}

// checkSnapshot checks what QEMU will be started with before it starts,
// and hashes the state file while the VMM starts and loads it.
func (l *launch) checkSnapshot(ctx context.Context) error {
	err := l.metaErr
	if err == nil {
		err = l.rt.checkRestore(l.rec, l.meta)
	}
	l.netKept = err == nil && l.meta.Network.keeps(l.rec.Network)
	if err != nil {
		return fmt.Errorf("runtime: instance %s: %w", l.in.id, err)
	}
	if _, err := os.Stat(l.spec.LayerPath); l.spec.LayerPath != "" && err != nil {
		return fmt.Errorf("runtime: instance %s: the writable layer the snapshot needs: %w", l.in.id, err)
	}
	l.stateOK = checkStateAsync(ctx, l.spec.Restore.Dir, l.meta)
	return nil
}

// createDisk makes the scratch disk; it stays in the Instance directory
// for Delete, as the record names it.
func (l *launch) createDisk(ctx context.Context) error {
	return createDisk(ctx, l.p.Disk, l.spec.DiskMiB)
}

// ensureLayer makes the Workspace's layer when it is missing; it is the
// Workspace's, outliving any launch, so a failed one keeps it.
func (l *launch) ensureLayer(ctx context.Context) error {
	if err := EnsureLayer(ctx, l.rt.cfg.NodeID, l.spec.LayerPath, l.spec.RootImage); err != nil {
		return fmt.Errorf("runtime: instance %s: %w", l.in.id, err)
	}
	return nil
}

func (l *launch) grantFiles(context.Context) error {
	if err := l.rt.grantVMMFiles(l.spec, l.p); err != nil {
		return fmt.Errorf("runtime: instance %s: %w", l.in.id, err)
	}
	return nil
}

// createNetwork's undo is reserve-network's.
func (l *launch) createNetwork(ctx context.Context) error {
	rec := l.rec
	if err := l.rt.createNetwork(ctx, l.in.id, confinedOwner(l.rt.vmm, rec), rec.Network); err != nil {
		return err
	}
	l.netnsPath = l.rt.net.ns.ManagerPath(rec.Network.Namespace)
	return nil
}

// routeEgress puts routes and TPROXY in place before the guest can
// connect. Its undo is startFailed's sync once the Instance is FAILED: a
// sync before would route it again.
func (l *launch) routeEgress(ctx context.Context) error {
	return l.rt.syncEgress(ctx)
}

// launchUnit starts the VMM's unit; its undo stops it.
func (l *launch) launchUnit(ctx context.Context) error {
	rec, c := l.rec, l.rec.Confinement
	us := units.Spec{
		Name:        rec.Unit,
		Description: vmmUnitDescription(l.in.id, rec.LaunchID),
		Argv:        rec.Argv,
		Environment: []string{vmmLogEnv + "=" + l.p.VMMLog},
		// How the VMM ended goes into its log, which outlives the unit.
		ExecStopPost:         []string{l.sh, "-c", `echo "` + VMMExitedLine + ` result=$SERVICE_RESULT code=$EXIT_CODE status=$EXIT_STATUS" >>"$` + vmmLogEnv + `"`},
		Background:           l.spec.Background,
		NetworkNamespacePath: l.netnsPath,
	}
	if c != nil {
		us.User, us.Group, us.SupplementaryGroups = c.User, c.User, []string{KVMGroup}
		us.NoNewPrivileges = true
		// Sockets QEMU creates: its account's alone (root connects anyway).
		us.UMask = 0o077
		us.MemoryMax, us.TasksMax = c.MemoryMax, c.TasksMax
		us.LimitMEMLOCKInfinity = true
	}
	u, err := l.rt.units.StartVMM(ctx, us)
	if err != nil {
		return err
	}
	l.unit, l.unitUpIn = u, time.Since(l.t0)
	l.rv.Add(StepLaunchUnit, func(ctx context.Context) error { return l.rt.abortLaunch(ctx, rec.Unit, u.InvocationID) })
	return nil
}

func (l *launch) identify(ctx context.Context) error {
	proc, err := l.rt.identify(ctx, l.unit, l.vmm[0])
	if err != nil {
		return fmt.Errorf("%w; VMM log tail:\n%s", err, vmmLogTail(l.p.VMMLog))
	}
	proc.NetNS = l.netnsPath
	l.proc = proc
	return nil
}

// recordProcess completes the record with the VMM's identity: from here
// a takeover adopts the launch. The console is read from now on.
func (l *launch) recordProcess(context.Context) error {
	rec := *l.rec
	rec.Process = l.proc
	if err := WriteLaunchRecord(l.p.Dir, &rec); err != nil {
		return err
	}
	l.rec = &rec
	l.in.mu.Lock()
	l.in.rec = &rec
	l.in.mu.Unlock()
	if l.p.ConsoleSocket != "" {
		l.rt.startConsole(l.in)
	}
	return nil
}

func (l *launch) restore(ctx context.Context) error {
	t := time.Now()
	if err := l.rt.restore(ctx, l.p.Control, l.spec.Restore.Dir, l.stateOK); err != nil {
		return fmt.Errorf("runtime: instance %s: %w", l.in.id, err)
	}
	l.rt.log.Info("instance restored", "instance_id", l.in.id, "snapshot", l.spec.Restore.Dir, "took", time.Since(t).Round(time.Millisecond), "network_kept", l.netKept)
	return nil
}

func (l *launch) awaitGuest(ctx context.Context) error {
	return l.rt.awaitGuest(ctx, l.in)
}

func (l *launch) tellGuest(ctx context.Context) error {
	if err := l.rt.tellGuest(ctx, l.in, l.spec, l.rec, l.spec.Restore != nil, l.netKept); err != nil {
		return fmt.Errorf("runtime: instance %s: %w", l.in.id, err)
	}
	return nil
}

func (l *launch) finish(context.Context) error {
	return l.rt.finish(l.in)
}
