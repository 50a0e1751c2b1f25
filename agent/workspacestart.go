package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/revert"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/template"
)

// The steps of a Workspace start on the node, in the order they run;
// Config.Observe is told how long each took when it completed. The
// Instance's own start (runtime.StartSteps) is inside start-instance.
const (
	StepFetchCredentials = "fetch-credentials" // the network policy and its Egress's credentials
	StepFetchTemplate    = "fetch-template"    // the template image
	StepFetchPlatform    = "fetch-platform"    // the Platform installation
	StepPrepareSnapshot  = "prepare-snapshot"  // a paused Workspace's snapshot: discarded or to restore
	StepLayerDir         = "layer-dir"         // the directory of the Workspace's layer in its pool
	StepPrepareFork      = "prepare-fork"      // a fork's layer and snapshot from its source
	StepImportTransfer   = "import-transfer"   // a moved Workspace's layer and Volumes
	StepClaimLayer       = "claim-layer"       // the layer's holder record
	StepPrepareVolumes   = "prepare-volumes"   // the Volumes' disks and holder records
	StepRecordOwner      = "record-owner"      // which Workspace the Instance is
	StepAdoptWarm        = "adopt-warm"        // a warm guest made this Workspace's Instance
	StepCreateLayer      = "create-layer"      // a first start's layer over the template
	StepStartInstance    = "start-instance"    // the Instance booted or restored
	StepSpendSnapshot    = "spend-snapshot"    // a restored snapshot removed
	StepMountVolumes     = "mount-volumes"     // the Volumes mounted in the guest
	StepNewMachineID     = "new-machine-id"    // a first start's machine id of its own
	StepFinishStart      = "finish-start"      // the Instance's launch record says its start is done
)

// WorkspaceStartSteps are every step a Workspace start can run, in order.
func WorkspaceStartSteps() []string {
	return []string{StepFetchCredentials, StepFetchTemplate, StepFetchPlatform, StepPrepareSnapshot, StepLayerDir, StepPrepareFork,
		StepImportTransfer, StepClaimLayer, StepPrepareVolumes, StepRecordOwner, StepAdoptWarm, StepCreateLayer,
		StepStartInstance, StepMountVolumes, StepNewMachineID, StepFinishStart, StepSpendSnapshot}
}

// refused is a step's refusal: the node does not take new Workspaces now
// and ctrl should place elsewhere.
type refused string

func (r refused) Error() string { return string(r) }

// refusal makes the (refusal, error) of a lookup that found nothing one
// error.
func refusal(what string, why string, err error) error {
	switch {
	case why != "":
		return refused(why)
	case err == nil:
		return fmt.Errorf("%s: not found, and no reason given", what)
	}
	return err
}

// wsStep is one named step of a Workspace start; when, if set, says at
// the step's turn whether it has anything to do.
type wsStep struct {
	name string
	when func() bool
	run  func(ctx context.Context) error
}

// wsStart is one Workspace start in progress: what its steps hand on.
// A start after a node restart finds its Instance taken over and ends
// before any step (clearEarlier); every step after record-owner is
// undone through forget.
type wsStart struct {
	a  *Agent
	rt *runtime.Runtime
	t  api.WorkspaceTask
	r  *api.WorkspaceTaskResult
	id string
	rv *revert.Reverter

	policy       runtime.NetworkPolicy
	tpl          *template.Template
	installation *platform.Installation
	restore      *runtime.RestoreSpec
	identity     *runtime.Identity
	layer        string
	im           *imported
	freshLayer   bool
	layerMade    bool // by an earlier try of this start, cut short by a node restart
	volumes      []runtime.VolumeDisk
	spec         runtime.Spec
	warm         bool // started from a warm guest
	warmID       bool // whose identity call wrote the machine id
}

// startWorkspace starts the Workspace's Instance and names its Platform in
// r; a non-empty refusal means the node does not take new Workspaces now
// and ctrl should place elsewhere.
func (a *Agent) startWorkspace(ctx context.Context, t api.WorkspaceTask, r *api.WorkspaceTaskResult) (refusal string, err error) {
	rt := a.cfg.Runtime
	if rt == nil {
		return "", fmt.Errorf("node %s runs no VMs: it has no service manager for VMM units (run it with systemd, or --systemd private)", a.cfg.NodeID)
	}
	if done, err := a.clearEarlier(ctx, t.Command.InstanceID); done || err != nil {
		return "", err
	}
	if why := a.admission(); why != "" {
		return why, nil
	}
	s := &wsStart{a: a, rt: rt, t: t, r: r, id: t.Command.InstanceID, rv: revert.New(a.log.With("instance_id", t.Command.InstanceID))}
	defer s.close()
	for _, st := range s.steps() {
		if st.when != nil && !st.when() {
			continue
		}
		t0 := time.Now()
		if err := st.run(ctx); err != nil {
			s.rv.Fail(ctx) // its undos log their own failures
			var ref refused
			if errors.As(err, &ref) {
				return string(ref), nil
			}
			return "", err
		}
		if a.cfg.Observe != nil {
			a.cfg.Observe(st.name, time.Since(t0))
		}
	}
	s.rv.Success()
	return "", nil
}

// clearEarlier looks at an Instance of this id the node has already: one
// started before a node restart and taken over is the start done; any
// other is deleted first.
func (a *Agent) clearEarlier(ctx context.Context, id string) (done bool, err error) {
	rt := a.cfg.Runtime
	st, err := rt.Status(id)
	if err != nil {
		return false, nil
	}
	if st.State == runtime.StateStarting {
		// A start in flight when the node restarted: takeover waits for
		// its guest; so does the answer to ctrl.
		st = a.awaitStarted(ctx, id)
	}
	if st.State == runtime.StateRunning {
		return true, nil // started before a node restart: taken over
	}
	if derr := rt.Delete(ctx, id); derr != nil && !isUnknownInstance(derr) {
		return false, fmt.Errorf("instance %s is %s and could not be cleared: %w", id, st.State, derr)
	}
	return false, nil
}

// admission is why the node takes no new Workspace now, or "".
func (a *Agent) admission() string {
	if u := a.sampler.Latest(); u.MemoryTight {
		return "host memory is tight"
	}
	a.mu.Lock()
	draining := a.draining
	a.mu.Unlock()
	if draining {
		return "node " + a.cfg.NodeID + " is draining"
	}
	return ""
}

// steps are the steps of t, in order; some decide at their turn.
func (s *wsStart) steps() []wsStep {
	snap := s.t.Snapshot
	booted := func() bool { return s.restore == nil }
	// A first boot with nothing to import or attach, over no layer yet.
	warmable := func() bool {
		return booted() && s.im == nil && len(s.volumes) == 0 && s.freshLayer && !s.layerMade
	}
	return []wsStep{
		{StepFetchCredentials, nil, s.fetchCredentials},
		{StepFetchTemplate, nil, s.fetchTemplate},
		{StepFetchPlatform, nil, s.fetchPlatform},
		{StepPrepareSnapshot, func() bool { return snap != nil }, s.prepareSnapshot},
		{StepLayerDir, nil, s.layerDir},
		{StepPrepareFork, func() bool { return s.restore != nil && snap.From != "" }, s.prepareFork},
		{StepImportTransfer, func() bool { return s.t.Import != nil && s.restore == nil }, s.importTransfer},
		{StepClaimLayer, nil, s.claimLayer},
		{StepPrepareVolumes, nil, s.prepareVolumes},
		{StepRecordOwner, nil, s.recordOwner},
		{StepAdoptWarm, warmable, s.adoptWarm},
		// A restore needs the layer its snapshot was taken over: Start
		// refuses one that is missing, and none is made here.
		{StepCreateLayer, func() bool { return !s.warm && s.freshLayer && s.restore == nil }, s.createLayer},
		{StepStartInstance, func() bool { return !s.warm }, s.startInstance},
		{StepMountVolumes, booted, s.mountVolumes},
		{StepNewMachineID, func() bool { return booted() && s.freshLayer && !s.warmID }, s.newMachineID},
		// Done: a node restart from here takes the Instance over as
		// started. The snapshot is spent after: a restart before would
		// restore it again.
		{StepFinishStart, nil, s.finishStart},
		{StepSpendSnapshot, func() bool { return s.restore != nil }, s.spendSnapshot},
	}
}

func (s *wsStart) close() {
	if s.im != nil {
		s.im.cleanup()
	}
}

func (s *wsStart) fetchCredentials(ctx context.Context) error {
	t := s.t
	// A start without a policy comes from a ctrl older than policies:
	// egress none, as ctrl reads such records.
	policy, err := runtimePolicy(t.Network.Effective(), t.Egress, t.Resolver)
	if err != nil {
		return fmt.Errorf("instance %s: %w", s.id, err)
	}
	if err := s.a.fetchEgressCredentials(ctx, policy); err != nil {
		return fmt.Errorf("instance %s: %w", s.id, err)
	}
	s.policy = policy
	return nil
}

func (s *wsStart) fetchTemplate(ctx context.Context) error {
	tpl, why, err := s.a.templateFor(ctx, s.t)
	if tpl == nil {
		return refusal("template "+s.t.Template, why, err)
	}
	s.tpl = tpl
	return nil
}

func (s *wsStart) fetchPlatform(ctx context.Context) error {
	installation, why, err := s.a.platformFor(ctx, s.t)
	if installation == nil {
		return refusal("the Platform of instance "+s.id, why, err)
	}
	s.installation = installation
	return nil
}

func (s *wsStart) prepareSnapshot(context.Context) error {
	a, t, snap := s.a, s.t, s.t.Snapshot
	if snap.Discard {
		// Stopped while paused: boots afresh; the old snapshot goes first.
		return a.removeSnapshot(t)
	}
	installation, err := a.restoreInstallation(snap)
	if err != nil {
		return err
	}
	dir, err := a.snapshotDir(snap.PoolID, t.WorkspaceID)
	if err != nil {
		return err
	}
	s.installation, s.restore = installation, &runtime.RestoreSpec{Dir: dir}
	return nil
}

// layerDir is where the layer goes.
func (s *wsStart) layerDir(context.Context) error {
	layer, err := s.a.layerPath(s.t.LayerPool, s.t.WorkspaceID)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(layer), 0o700); err != nil {
		return err
	}
	s.layer = layer
	return nil
}

func (s *wsStart) prepareFork(ctx context.Context) error {
	if err := s.a.prepareFork(ctx, s.t, s.layer, s.restore.Dir); err != nil {
		return err
	}
	s.identity = &runtime.Identity{Hostname: s.t.WorkspaceID, Roots: []string{WorkspaceRoot}}
	return nil
}

// importTransfer's staging is removed by close, success or not.
func (s *wsStart) importTransfer(ctx context.Context) error {
	im, err := s.a.importTransfer(ctx, s.t, s.tpl, s.layer)
	if err != nil {
		return err
	}
	s.im = im
	return nil
}

// claimLayer writes the layer's holder record; its undo removes it
// unless the Instance is still on the node (forget could not delete it:
// it may still write).
func (s *wsStart) claimLayer(ctx context.Context) error {
	_, statErr := os.Stat(s.layer)
	// A layer an earlier try of this start made (one a node restart cut
	// short) is still a first start's: it gets its machine id.
	_, s.layerMade = s.a.commands.find(layerStep(s.t, cmdLayerCreate, s.layer).CommandID, cmdLayerCreate)
	s.freshLayer = errors.Is(statErr, os.ErrNotExist) || s.layerMade
	if err := s.a.claimObject(ctx, s.layer, s.id); err != nil {
		return fmt.Errorf("instance %s: %w", s.id, err)
	}
	s.rv.Add(StepClaimLayer, s.release([]string{s.layer}))
	return nil
}

// prepareVolumes releases what it claimed itself when it fails.
func (s *wsStart) prepareVolumes(ctx context.Context) error {
	volumes, err := s.a.prepareVolumes(ctx, s.t, s.im)
	if err != nil {
		return err
	}
	s.volumes = volumes
	var objects []string
	for _, v := range volumes {
		objects = append(objects, v.Path)
	}
	s.rv.Add(StepPrepareVolumes, s.release(objects))
	return nil
}

// release is the undo of a claim of objects.
func (s *wsStart) release(objects []string) revert.Undo {
	return func(context.Context) error {
		if _, err := s.rt.Status(s.id); err == nil {
			return nil // still the Instance's: forget kept it on purpose
		}
		s.a.releaseObjects(s.id, objects)
		return nil
	}
}

// recordOwner notes whose Instance this is; its undo forgets the Instance
// (deleting what of it runs), bounded since it outlives the start's own
// deadline.
func (s *wsStart) recordOwner(context.Context) error {
	a, t := s.a, s.t
	a.tasks.mu.Lock()
	a.tasks.owners[s.id] = t.WorkspaceID
	a.saveOwners()
	a.tasks.mu.Unlock()
	s.rv.Add(StepRecordOwner, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		a.forget(ctx, s.id)
		return nil
	})
	s.spec = runtime.Spec{InstanceID: s.id, Installation: s.installation, VCPUs: max(1, int(t.CPU/1000)), MemoryMiB: int(t.MemoryBytes >> 20),
		Network: true, Policy: s.policy, RootImage: s.tpl.Image(), LayerPath: s.layer, Volumes: s.volumes, Restore: s.restore, Identity: s.identity,
		Staged: true}
	if s.restore == nil {
		// Booted or adopting a warm guest: its filesystem is mounted
		// beside its network, and it is told the Workspace's environment.
		// (A paused guest has both already: its agent holds the
		// environment in the memory restored, and its launch record's
		// configuration, from the snapshot, tells a restart of it again.)
		s.spec.Configure = func(g guestproto.GuestInfo) guestproto.ConfigureRequest {
			req := WorkspaceConfigure(t.WorkspaceID, g)
			req.Env = t.Env
			return req
		}
	}
	return nil
}

// adoptWarm tries the template's warm guests; none adopted, the start
// boots instead.
func (s *wsStart) adoptWarm(ctx context.Context) error {
	a, t, rt, id := s.a, s.t, s.rt, s.id
	for _, r := range a.warmGuestsFor(s.spec, s.tpl) {
		_, err := rt.Adopt(ctx, r, s.spec, t.WorkspaceID, []string{WorkspaceRoot})
		if errors.Is(err, runtime.ErrNotAdoptable) {
			// Another start took it, or it cannot be this one.
			a.log.Info("warm guest not adopted", "workspace_id", t.WorkspaceID, "instance_id", id, "warm_guest", r.ID, "why", err)
			continue
		}
		a.warmTaken(t.Template, err == nil)
		if err == nil {
			s.warm, s.warmID = true, r.Mounted(WorkspaceRoot)
			s.r.Platform = s.installation.ID
			a.log.Info("instance started from a warm guest", "workspace_id", t.WorkspaceID, "instance_id", id, "template", t.Template, "warm_guest", r.ID)
			return nil
		}
		// The warm guest was only a shortcut: boot instead.
		a.log.Warn("warm guest not adopted; booting", "workspace_id", t.WorkspaceID, "instance_id", id, "warm_guest", r.ID, "err", err)
		if derr := rt.Delete(ctx, id); derr != nil && !isUnknownInstance(derr) {
			return fmt.Errorf("node %s: %w", a.cfg.NodeID, errors.Join(err, derr))
		}
		rt.ForgetEnded([]string{id})
		// The boot starts over a new layer, as it would have.
		if rerr := os.Remove(s.layer); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return fmt.Errorf("node %s: %w", a.cfg.NodeID, errors.Join(err, rerr))
		}
		return nil
	}
	return nil
}

func (s *wsStart) createLayer(ctx context.Context) error {
	if err := s.a.createLayer(ctx, s.t, s.layer, s.tpl.Image()); err != nil {
		return fmt.Errorf("instance %s: %w", s.id, err)
	}
	return nil
}

func (s *wsStart) startInstance(ctx context.Context) error {
	if _, err := s.rt.Start(ctx, s.spec); err != nil {
		return fmt.Errorf("node %s: %w", s.a.cfg.NodeID, err)
	}
	s.r.Platform = s.installation.ID
	return nil
}

// spendSnapshot removes a restored snapshot: the restored guest has its
// filesystems mounted already; its snapshot is spent. A failure only
// leaves a file behind.
func (s *wsStart) spendSnapshot(context.Context) error {
	if err := s.a.removeSnapshot(s.t); err != nil {
		s.a.log.Warn("restored snapshot not removed", "workspace_id", s.t.WorkspaceID, "err", err)
	}
	return nil
}

func (s *wsStart) finishStart(context.Context) error {
	if err := s.rt.Finish(s.id); err != nil {
		return fmt.Errorf("node %s: %w", s.a.cfg.NodeID, err)
	}
	return nil
}

func (s *wsStart) mountVolumes(ctx context.Context) error {
	return s.a.mountVolumes(ctx, s.id, s.t)
}

// newMachineID gives a first start a machine id of its own in its
// filesystem, now mounted, whether it booted or adopted a warm guest (one
// that had it mounted was given it with its identity). Every Workspace of
// a template would otherwise share the template's (or have none). A
// booted guest of a Platform older than forks cannot take one and goes
// without.
func (s *wsStart) newMachineID(ctx context.Context) error {
	c, err := s.rt.Guest(s.id)
	if err == nil && (s.warm || c.Info().Has(guestproto.CapIdentity)) {
		err = s.rt.NewIdentity(ctx, s.id, runtime.Identity{Roots: []string{WorkspaceRoot}})
	}
	if err != nil {
		return fmt.Errorf("instance %s: %w", s.id, err)
	}
	return nil
}
