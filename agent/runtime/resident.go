package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/qemu"
)

// Resident warm guests: a warm guest kept as its running VMM with its
// vCPUs stopped (earlier builds saved it and ended the VMM, and a start
// restored it in a new one). A Workspace's first start
// adopts one (Adopt): the VMM, its unit, network namespace and session
// become the Workspace's Instance, whose layer the guest's becomes, and
// the vCPUs run again. Nothing is loaded and no QEMU starts; under
// TCG, what matters most is that the guest's translated code stays (a
// restored guest translates every path it runs afresh). A waiting
// resident costs its memory and a stopped VMM process, no CPU, and does
// not outlive its node process: the agent ends the residents it did not
// make (a node restart makes new ones).
//
// A resident boots as a Background service with egress none, mounts
// what every Workspace of its template mounts (WarmSpec.Mounts), and is
// stopped after its session's keepalive is held: a stopped guest cannot
// answer pings, and the session goes over to the Workspace unbroken (a
// reconnect would wait for the guest agent to reopen its port). Adopt
// gives the Workspace's Instance its policy before the vCPUs run, the
// priorities of any VMM, and a new identity (random state, hostname,
// machine id): no two Workspaces share a resident, and each resident
// booted on its own.

// Resident is a warm guest kept ready by BootResident.
type Resident struct {
	ID string
	WarmKey
	// Layer is the guest's writable layer, in its Instance directory: the
	// Workspace's layer becomes another name of it. QEMU reopens an image
	// by the name it opened it under (a save does, as it hands its disks
	// over), so that name stays until the VMM ends.
	Layer string
	// Mounts are what the guest mounted: the Workspace's start leaves
	// them out of its configure.
	Mounts   []guestproto.Mount
	BootedAt time.Time
}

// residentLayerFile is a resident's layer in its Instance directory.
const residentLayerFile = "layer.qcow2"

// ErrNotAdoptable: a resident cannot become the Instance asked for
// (another size or build, or its layer cannot move to the Instance's);
// the resident is left as it was.
var ErrNotAdoptable = errors.New("the resident warm guest cannot become this Instance")

// newWarmID is a new warm guest's Instance id.
func newWarmID() string {
	var b [8]byte
	rand.Read(b[:])
	return warmPrefix + hex.EncodeToString(b[:])
}

// BootResident boots a warm guest of s and keeps it with its vCPUs
// stopped. Nothing of a failed one is left but its machine logs.
func (rt *Runtime) BootResident(ctx context.Context, s WarmSpec) (Resident, error) {
	if s.Installation == nil || s.Installation.ID != s.InstallationID {
		return Resident{}, fmt.Errorf("runtime: warm guest of template %s: installation %s not given", s.Template, s.InstallationID)
	}
	id := newWarmID()
	r := Resident{ID: id, WarmKey: s.WarmKey, Layer: filepath.Join(rt.instancesDir, id, residentLayerFile)}
	spec := Spec{InstanceID: id, Installation: s.Installation, VCPUs: s.VCPUs, MemoryMiB: s.MemoryMiB, Background: true,
		Network: true, Policy: NetworkPolicy{Egress: api.EgressNone}, RootImage: s.Image, LayerPath: r.Layer}
	if s.Mounts != nil {
		spec.Configure = func(g guestproto.GuestInfo) guestproto.ConfigureRequest {
			r.Mounts = s.Mounts(g)
			return guestproto.ConfigureRequest{Mounts: r.Mounts}
		}
	}
	_, err := rt.Start(ctx, spec)
	if err == nil {
		r.BootedAt = time.Now().UTC()
		err = rt.reside(ctx, id, r)
	}
	if err != nil {
		rt.EndResident(context.WithoutCancel(ctx), r)
		return Resident{}, fmt.Errorf("runtime: warm guest of template %s: %w", s.Template, err)
	}
	return r, nil
}

// reside stops the vCPUs of the running warm guest id, its session held
// open for the Instance that adopts it.
func (rt *Runtime) reside(ctx context.Context, id string, r Resident) error {
	in, err := rt.get(id)
	if err != nil {
		return err
	}
	c := in.detachGuest()
	if c == nil {
		return errors.New("its guest session ended before its vCPUs were stopped")
	}
	c.Hold()
	q, err := qemu.DialQMP(ctx, in.paths.Control)
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.Execute(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("stop its vCPUs: %w", err)
	}
	in.mu.Lock()
	in.resident = &r
	in.mu.Unlock()
	return nil
}

// EndResident ends a resident warm guest (or what is left of one that did
// not boot), its layer with it: it has nothing to flush.
func (rt *Runtime) EndResident(ctx context.Context, r Resident) error {
	var err error
	if derr := rt.Delete(ctx, r.ID); derr != nil && !errors.Is(derr, ErrUnknownInstance) {
		err = derr
	}
	// No Workspace's: nobody asks for its record or its logs.
	err = errors.Join(err, rt.ForgetEnded([]string{r.ID}))
	os.RemoveAll(filepath.Join(rt.logsDir, r.ID))
	return err
}

// Residents lists the resident warm guests kept ready here (not one
// whose VMM ended).
func (rt *Runtime) Residents() []Resident {
	var out []Resident
	for _, in := range rt.all() {
		in.mu.Lock()
		if in.resident != nil && in.state == StateRunning {
			out = append(out, *in.resident)
		}
		in.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b Resident) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Adopt makes resident warm guest r the first start of spec, a Workspace's
// Instance over a new layer at spec.LayerPath, as a start of it would
// (Start): the guest's layer is linked there, the Instance's policy replaces
// egress none, and the guest runs on with a new identity (hostname, and a
// machine id in roots where the guest has them mounted) and what of
// spec's configure it did not do already. ErrNotAdoptable leaves r as it
// was; after any other error the Instance is FAILED, its VMM ended, and
// is deleted as a failed start is.
func (rt *Runtime) Adopt(ctx context.Context, r Resident, spec Spec, hostname string, roots []string) (InstanceStatus, error) {
	id := spec.InstanceID
	refuse := func(why string, args ...any) (InstanceStatus, error) {
		return InstanceStatus{}, fmt.Errorf("runtime: start instance %s from warm guest %s: %w: %s", id, r.ID, ErrNotAdoptable, fmt.Sprintf(why, args...))
	}
	switch {
	case !idRE.MatchString(id) || IsWarm(id):
		return refuse("instance id %q is not a Workspace's", id)
	case spec.Installation == nil || spec.Installation.ID != r.InstallationID || spec.VCPUs != r.VCPUs || spec.MemoryMiB != r.MemoryMiB:
		return refuse("it was made for another Platform or size")
	case spec.Restore != nil || len(spec.Volumes) > 0 || spec.DiskMiB != 0 || !spec.Network || spec.LayerPath == "":
		return refuse("a first start with a network, a new layer and nothing else attached is made from a warm guest")
	}
	if _, err := os.Lstat(spec.LayerPath); !errors.Is(err, os.ErrNotExist) {
		return refuse("layer %s exists already", spec.LayerPath)
	}
	if !sameDevice(filepath.Dir(r.Layer), filepath.Dir(spec.LayerPath)) {
		return refuse("its layer %s is on another file system than %s", r.Layer, spec.LayerPath)
	}
	if err := rt.checkEgressPolicy(id, spec.Policy); err != nil {
		return InstanceStatus{}, err
	}
	t0 := time.Now()
	rt.mu.Lock()
	w := rt.instances[r.ID]
	var rec *LaunchRecord
	var c *guestproto.Client
	if w != nil {
		w.mu.Lock()
		if w.resident != nil && w.state == StateRunning && w.held != nil && w.rec.Network != nil && w.rec.RootImage == spec.RootImage {
			rec, c = w.rec, w.held
		}
		w.mu.Unlock()
	}
	switch {
	case rt.instances[id] != nil:
		rt.mu.Unlock()
		return InstanceStatus{}, fmt.Errorf("runtime: start instance %s: it exists on this node; delete it first", id)
	case rec == nil:
		rt.mu.Unlock()
		return refuse("it is not a resident warm guest of template image %s here", spec.RootImage)
	}
	// From here the VMM is the Instance's: the resident is gone.
	in := &instance{id: id, paths: w.paths, rec: rec, state: StateStarting, changed: make(chan struct{}), consoleDone: w.consoleDone}
	delete(rt.instances, r.ID)
	rt.instances[id] = in
	rt.mu.Unlock()
	rt.net.rekey(r.ID, id)

	err := rt.becomeInstance(ctx, in, r, c, spec, hostname, roots)
	if err != nil {
		err = errors.Join(err, rt.abortLaunch(ctx, rec.Unit, rec.Process.InvocationID))
		rt.startFailed(ctx, in, spec, err, "warm_guest", r.ID)
		return in.status(), fmt.Errorf("runtime: start instance %s from warm guest %s: %w", id, r.ID, err)
	}
	rt.log.Info("instance started from a resident warm guest", "instance_id", id, "warm_guest", r.ID, "unit", rec.Unit,
		"host_pid", rec.Process.HostPID, "took", time.Since(t0).Round(time.Millisecond))
	rt.observe(StepBoot, t0)
	return in.status(), nil
}

// becomeInstance is Adopt once in holds the resident's VMM: c is its held session.
func (rt *Runtime) becomeInstance(ctx context.Context, in *instance, r Resident, c *guestproto.Client, spec Spec, hostname string, roots []string) error {
	old := in.rec
	var lid [16]byte
	rand.Read(lid[:])
	rec := *old
	rec.InstanceID, rec.Host, rec.LaunchID, rec.LayerPath = in.id, r.ID, hex.EncodeToString(lid[:]), spec.LayerPath
	rec.Unfinished = true // until it is told it is the Workspace's, and its starter's steps are done
	nr := *old.Network
	nr.Policy = spec.Policy
	rec.Network = &nr
	// The layer first: a record never names a layer that is not there.
	// The VMM's own name of it goes with its directory.
	if err := os.Link(r.Layer, spec.LayerPath); err != nil {
		return fmt.Errorf("its layer: %w", err)
	}
	// Record before table, as a policy change does: a node that dies
	// between the two isolates the guest at takeover.
	if err := WriteLaunchRecord(in.paths.Dir, &rec); err != nil {
		return err
	}
	in.mu.Lock()
	in.rec = &rec
	in.mu.Unlock()
	if err := rt.replaceTable(ctx, &nr); err != nil {
		return fmt.Errorf("its network policy: %w", err)
	}
	rt.net.registerNames(ctx, in.id, &nr)
	if usesEgressProcess(spec.Policy) {
		if err := rt.syncEgress(ctx); err != nil {
			return err
		}
	}
	if u, err := rt.units.Get(ctx, rec.Unit); err != nil {
		return err
	} else if err := rt.units.Foreground(ctx, u); err != nil {
		return err
	}
	q, err := qemu.DialQMP(ctx, in.paths.Control)
	if err != nil {
		return err
	}
	err = q.Cont(ctx)
	q.Close()
	if err != nil {
		return fmt.Errorf("start its vCPUs: %w", err)
	}
	c.Release()
	in.mu.Lock()
	in.state, in.guest, in.responding, in.configured = StateRunning, c, true, true
	in.notify()
	in.mu.Unlock()
	rt.startGuestLoop(in, c)
	warmIdentity(&spec, r, hostname, roots)
	if err := rt.tellGuest(ctx, in, spec, &rec, true, true); err != nil {
		return err
	}
	if spec.Staged {
		return nil
	}
	return rt.finish(in)
}

// sameDevice says whether directories a and b are on one file system (a
// file in one can have a hard link in the other).
func sameDevice(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	if err1 != nil || err2 != nil {
		return false
	}
	da, ok1 := sa.Sys().(*syscall.Stat_t)
	db, ok2 := sb.Sys().(*syscall.Stat_t)
	return ok1 && ok2 && da.Dev == db.Dev
}

// Mounted says whether the resident mounted something at target.
func (r Resident) Mounted(target string) bool {
	return slices.ContainsFunc(r.Mounts, func(m guestproto.Mount) bool { return m.Target == target })
}
