package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kibotos/kibotos/internal/ctxsleep"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/units"
)

// Spec describes an Instance to start.
type Spec struct {
	InstanceID   string
	Installation *platform.Installation
	VCPUs        int
	MemoryMiB    int
	// Background runs the VMM at the lowest CPU and I/O priority
	// (units.Spec.Background): a warm guest's boot, which no user waits
	// for, then never slows a Workspace that is starting or running.
	Background bool
	// DiskMiB is the size of the writable raw disk (virtio-blk); 0: none.
	DiskMiB int
	// Network gives the Instance its own network namespace with a tap for
	// a virtio-net device, configured in the guest at launch.
	Network bool
	// Policy is the Instance's network policy (with Network).
	Policy NetworkPolicy
	// RootImage is a template image (read-only base) and LayerPath the
	// Workspace's retained writable layer on top of it, a qcow2 file that
	// outlives the Instance (created here when missing). The layer is the
	// guest's first disk, /dev/vda, with the serial LayerSerial (mount it
	// as "serial:layer"); the scratch disk (DiskMiB) comes after.
	RootImage string
	LayerPath string
	// Volumes are raw disks attached after the layer and the scratch
	// disk, each found in the guest by its serial.
	Volumes []VolumeDisk
	// Restore, when set, restores a snapshot (Pause) instead of booting:
	// the same command line must be what the snapshot was saved from.
	Restore *RestoreSpec
	// Identity, with Restore, makes the restored guest a fork of the one
	// saved: its own random state, hostname and machine id, set before
	// anything else is asked of it (fork.go).
	Identity *Identity
	// Configure, when set, is what the guest is configured with once it
	// answered, beside its network (which must not depend on it): a
	// Workspace's filesystem mounts. Its failure fails the start.
	Configure func(guestproto.GuestInfo) guestproto.ConfigureRequest
	// Staged: the caller has steps of its own after Start (Volumes to
	// mount, a machine id to give) and calls Finish once they are done.
	// Until then the launch record says the start is unfinished, and a
	// node restart makes takeover fail the Instance rather than call a
	// half-made one started. Without it, Start finishes by itself.
	Staged bool
}

// vmmLogEnv passes the VMM log path to the wrapper shell.
const vmmLogEnv = "KIBOTOS_VMM_LOG"

// VMMExitedLine starts the line the unit appends to the VMM log when the
// VMM has ended: "kibotos: vmm exited result=success code=exited status=0".
const VMMExitedLine = "kibotos: vmm exited"

// wrapLog makes the unit's command append the VMM's stdout and stderr to a
// file: transient units have no file output otherwise. The shell execs the
// VMM, so the unit's main process becomes the VMM itself.
func wrapLog(sh string, vmm []string) []string {
	return append([]string{sh, "-c", `exec "$@" >>"$` + vmmLogEnv + `" 2>&1`, "kibotos-vmm"}, vmm...)
}

// Start creates the Instance directory, writes the launch record, creates
// the writable disk, starts the VMM unit, completes the record with the
// process identity and returns once the guest agent answered.
func (rt *Runtime) Start(ctx context.Context, spec Spec) (InstanceStatus, error) {
	id := spec.InstanceID
	if !idRE.MatchString(id) {
		return InstanceStatus{}, fmt.Errorf("runtime: start: instance id %q: want lowercase letters, digits and '-', at most 63", id)
	}
	if spec.Installation == nil {
		return InstanceStatus{}, fmt.Errorf("runtime: start instance %s: no Platform installation given", id)
	}
	if spec.DiskMiB < 0 {
		return InstanceStatus{}, fmt.Errorf("runtime: start instance %s: disk of %d MiB", id, spec.DiskMiB)
	}
	if err := checkVolumes(spec.Volumes); err != nil {
		return InstanceStatus{}, fmt.Errorf("runtime: start instance %s: %w", id, err)
	}
	dir := filepath.Join(rt.instancesDir, id)
	paths := instancePaths(dir)
	if rt.vmm != nil {
		paths = confinedPaths(dir)
	}
	in := &instance{id: id, paths: paths, state: StateStarting, changed: make(chan struct{})}
	if spec.DiskMiB == 0 {
		in.paths.Disk = ""
	}
	rt.mu.Lock()
	if rt.instances[id] != nil {
		rt.mu.Unlock()
		return InstanceStatus{}, fmt.Errorf("runtime: start instance %s: it exists on this node; delete it first", id)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		rt.mu.Unlock()
		return InstanceStatus{}, fmt.Errorf("runtime: start instance %s: %w", id, err)
	}
	in.rec = &LaunchRecord{InstanceID: id, Unit: UnitName(id)}
	rt.instances[id] = in
	rt.mu.Unlock()

	t0 := time.Now()
	err := rt.start(ctx, in, spec)
	if err != nil {
		rt.startFailed(ctx, in, spec, err)
		return in.status(), fmt.Errorf("runtime: start instance %s: %w", id, err)
	}
	rt.observe(StepBoot, t0)
	return in.status(), nil
}

// startFailed makes in, whose start (or adoption) of spec failed with err,
// FAILED, and takes its guest out of the egress routes; attrs are logged
// with it.
func (rt *Runtime) startFailed(ctx context.Context, in *instance, spec Spec, err error, attrs ...any) {
	in.mu.Lock()
	in.state, in.err, in.how = StateFailed, err.Error(), "start failed"
	in.notify()
	in.mu.Unlock()
	if spec.Network && usesEgressProcess(spec.Policy) {
		if serr := rt.syncEgress(context.WithoutCancel(ctx)); serr != nil {
			rt.log.Warn("egress routes not updated after a failed start", "instance_id", in.id, "err", serr)
		}
	}
	rt.log.Error("instance start failed", append([]any{"instance_id", in.id, "err", err}, attrs...)...)
}

// tellGuest makes a guest that answered what spec asks: a restored fork's
// new identity, a restored one's clock set (it stopped with the VM), its
// network, and the spec's own configure. The calls go out together: under
// TCG a guest, a restored one most, runs the code of each afresh, and
// none of them waits for another's round trip. Only the spec's configure
// waits for the identity: what it starts must not draw on the random
// state every restore of the same memory shares.
//
// A restored guest whose network is as it was saved (netKept: same
// addresses on a tap of the same hardware address) is not told it again.
// resumed: the guest ran before and its clock stood still (a restore, a
// resident warm guest's adoption); only such a guest takes spec.Identity.
func (rt *Runtime) tellGuest(ctx context.Context, in *instance, spec Spec, rec *LaunchRecord, resumed, netKept bool) error {
	if !resumed && !spec.Network && spec.Configure == nil {
		return nil
	}
	c, err := rt.Guest(in.id)
	if err != nil {
		return err
	}
	// A warm guest's may have nothing left to do: it mounted everything.
	req := configureOf(spec, c.Info())
	if err := guestTakes(c.Info(), req); err != nil {
		return err
	}
	var wg sync.WaitGroup
	var idErr, netErr, cfgErr error
	identified := make(chan struct{})
	if resumed && spec.Identity != nil {
		wg.Go(func() {
			defer close(identified)
			if err := newIdentity(ctx, c, spec.Identity); err != nil {
				idErr = fmt.Errorf("a fork's new identity: %w", err)
			}
		})
	} else {
		close(identified)
	}
	if resumed && c.Info().Has(guestproto.CapSetTime) {
		wg.Go(func() {
			if err := c.SetTime(ctx, time.Now()); err != nil {
				rt.log.Warn("restored guest's clock not set", "instance_id", in.id, "err", err)
			}
		})
	}
	if spec.Network && !netKept {
		req := guestNetwork(rec.Network)
		if resumed {
			// A restored guest still has the addresses of the VM it was
			// saved from.
			for i := range req.Interfaces {
				req.Interfaces[i].Flush = true
			}
		}
		wg.Go(func() {
			if err := c.Configure(ctx, req); err != nil {
				netErr = fmt.Errorf("configure the guest network: %w", err)
			}
		})
	}
	if !emptyConfigure(req) {
		wg.Go(func() {
			if <-identified; idErr != nil {
				return
			}
			if err := c.Configure(ctx, req); err != nil {
				cfgErr = fmt.Errorf("configure the guest: %w", err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(idErr, netErr, cfgErr); err != nil {
		return err
	}
	// What a restart of the guest is told again.
	if resumed && spec.Identity != nil && spec.Identity.Hostname != "" {
		req.Hostname = spec.Identity.Hostname
	}
	return rt.recordConfigured(in, guestproto.ConfigureRequest{Hostname: req.Hostname, Mounts: req.Mounts, Env: req.Env})
}

// configureOf is spec's own configure of a guest g, empty without one.
func configureOf(spec Spec, g guestproto.GuestInfo) guestproto.ConfigureRequest {
	if spec.Configure == nil {
		return guestproto.ConfigureRequest{}
	}
	return spec.Configure(g)
}

// emptyConfigure says whether a configure would change nothing.
func emptyConfigure(r guestproto.ConfigureRequest) bool {
	return r.Hostname == "" && len(r.Interfaces) == 0 && len(r.DNS) == 0 && len(r.Mounts) == 0 && r.Env == nil
}

// guestTakes refuses a configure the guest g would not apply whole: a
// Workspace's environment to an agent without CapWorkspaceEnv, which
// would ignore it and run the Workspace's processes without it.
func guestTakes(g guestproto.GuestInfo, req guestproto.ConfigureRequest) error {
	if len(req.Env) > 0 && !g.Has(guestproto.CapWorkspaceEnv) {
		return fmt.Errorf("its guest agent (version %q) cannot take the Workspace's environment variables, and would run its processes without them: start it on a Platform built by this release (kibotos platform build)", g.AgentVersion)
	}
	return nil
}

// awaitGuest is the readiness check of a launch: it waits for the guest
// agent, records the guest it claims and makes the Instance RUNNING. A
// guest that does not answer within GuestTimeout fails the launch; its
// caller stops the unit (Start through its undo, a takeover unless it is
// closing: Close must leave the VMM running).
func (rt *Runtime) awaitGuest(ctx context.Context, in *instance) error {
	in.mu.Lock()
	rec := in.rec
	in.mu.Unlock()
	proc := rec.Process
	gctx, cancel := context.WithTimeout(ctx, rt.cfg.GuestTimeout)
	c, err := rt.waitGuest(gctx, in, func() bool {
		st, err := procStartTime(proc.HostPID)
		return err == nil && st == proc.StartTime
	})
	cancel()
	if err != nil {
		// The VMM's words first: a report keeps the first 1,000 bytes.
		return fmt.Errorf("guest agent did not answer within %v: %w; VMM log tail:\n%s\nconsole tail:\n%s", rt.cfg.GuestTimeout, err, vmmLogTail(in.paths.VMMLog), consoleTail(in.paths.Console, 2048))
	}
	ready := *rec
	ready.Guest = guestRecord(c.Info())
	if err := WriteLaunchRecord(in.paths.Dir, &ready); err != nil {
		c.Close()
		return err
	}
	in.mu.Lock()
	in.rec, in.state = &ready, StateRunning
	in.guest, in.responding, in.configured = c, true, true
	in.notify()
	in.mu.Unlock()
	rt.startGuestLoop(in, c)
	return nil
}

// abortLaunch stops the unit of a failed launch, even when ctx is already
// cancelled.
func (rt *Runtime) abortLaunch(ctx context.Context, unit, invocation string) error {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return rt.forceStop(c, unit, invocation)
}

// identify reads what identifies the unit's main process, once the log
// wrapper has exec'd the VMM binary.
func (rt *Runtime) identify(ctx context.Context, u units.Unit, vmmBinary string) (*ProcessRecord, error) {
	hostPID, err := rt.units.MainHostPID(u)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		exe, dev, ino, err := procExe(hostPID)
		if err != nil {
			return nil, fmt.Errorf("unit %s main process (host PID %d) exited at once: %w; see %s", u.Name, hostPID, err, vmmBinary)
		}
		wantDev, wantIno, idErr := fileID(vmmBinary)
		if idErr == nil && dev == wantDev && ino == wantIno {
			st, err := procStartTime(hostPID)
			if err != nil {
				return nil, fmt.Errorf("unit %s main process (host PID %d): %w", u.Name, hostPID, err)
			}
			return &ProcessRecord{
				InvocationID: u.InvocationID,
				MainPID:      u.MainPID,
				HostPID:      hostPID,
				StartTime:    st,
				Exe:          exe,
				ExeDev:       dev,
				ExeIno:       ino,
				ControlGroup: u.ControlGroup,
				StartedAt:    time.Now().UTC(),
			}, nil
		}
		if time.Now().After(deadline) {
			if idErr != nil {
				return nil, fmt.Errorf("VMM binary %s: %w", vmmBinary, idErr)
			}
			return nil, fmt.Errorf("unit %s main process (host PID %d) still runs %s after 10s, not %s", u.Name, hostPID, exe, vmmBinary)
		}
		if err := ctxsleep.Sleep(ctx, time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// createDisk makes a sparse raw disk of size MiB, formatted ext4 when
// e2fsprogs is installed.
func createDisk(ctx context.Context, path string, mib int) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create disk: %w", err)
	}
	err = f.Truncate(int64(mib) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("create disk %s: %w", path, err)
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		return nil // raw and unformatted; the guest may format it
	}
	if out, err := exec.CommandContext(ctx, mkfs, "-q", "-F", path).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 %s: %w: %s", path, err, out)
	}
	return nil
}

// prepareVMMDirs lets the VMM account create its sockets in the Instance
// directory without listing it (group -wx) and, by the sticky bit, without
// renaming or removing the node's files there.
func (rt *Runtime) prepareVMMDirs(p Paths) error {
	if rt.vmm == nil {
		return nil
	}
	return rt.vmm.grantDir(p.Dir, 0o730|os.ModeSticky)
}

// grantVMMFiles gives the VMM account what QEMU opens by path and nothing
// else: the installation's kernel and initramfs and the template image to
// read, the disks (layer, scratch disk, Volumes) to write, vmm.log to append to (the log wrapper runs as
// the account); the directories above them searchable. The console log
// stays the node's.
func (rt *Runtime) grantVMMFiles(spec Spec, p Paths) error {
	if rt.vmm == nil {
		return nil
	}
	f, err := os.OpenFile(p.VMMLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	type grant struct {
		path string
		mode os.FileMode
	}
	grants := []grant{
		{spec.Installation.Kernel(), 0o640},
		{spec.Installation.Initrd(), 0o640},
		{p.VMMLog, 0o620},
	}
	if p.Disk != "" {
		grants = append(grants, grant{p.Disk, 0o660})
	}
	if p.Layer != "" {
		grants = append(grants, grant{p.Layer, 0o660}, grant{spec.RootImage, 0o640})
	}
	for _, b := range p.LayerBases {
		grants = append(grants, grant{b, 0o640})
	}
	for _, v := range spec.Volumes {
		grants = append(grants, grant{v.Path, 0o660})
	}
	for _, g := range grants {
		if err := rt.vmm.grantFile(g.path, g.mode); err != nil {
			return err
		}
	}
	return nil
}

// confinedOwner is the VMM account of a confined launch, else nil.
func confinedOwner(a *vmmAccount, rec *LaunchRecord) *vmmAccount {
	if rec.Confinement == nil {
		return nil
	}
	return a
}

// vmmLogTail is the end of the VMM's own output: why a VMM that exited at
// once did (memory it could not allocate, a file it could not open).
func vmmLogTail(path string) string {
	b, err := readTail(path, 1024)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return strings.TrimSpace(string(b))
}
