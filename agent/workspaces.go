package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// WorkspaceRoot is where the node mounts a Workspace's filesystem (the
// retained layer over its template) in the guest.
const WorkspaceRoot = guestproto.WorkspaceRoot

// Grace of a normal stop: the guest's processes get this long to end.
const stopGrace = 10 * time.Second

// DataTarget is one Instance the data-plane process serves.
type DataTarget struct {
	WorkspaceID string
	InstanceID  string
	DataSocket  string
	// GuestBoot is the guest boot the runtime claimed and configured: a
	// guest that restarted is served once the node reconfigured it.
	GuestBoot string
}

// DataPlane is the node's data-plane process as the agent sees it: it
// takes the current targets and verification key before the node answers
// ctrl, so a credential ctrl issues next is accepted at once.
type DataPlane interface {
	Address() string
	// keys verify credentials, the signing key first.
	Update(ctx context.Context, targets []DataTarget, keys [][]byte) error
	// Alive reports whether the process answers; when it does not, the
	// next Update starts a new one.
	Alive(ctx context.Context) bool
}

// tasks runs the commands ctrl sends (Workspace and Volume commands): one
// at a time per object, each command id once. Results are kept so a
// command ctrl sends again (after a new session) is answered without
// running it twice.
type tasks struct {
	mu      sync.Mutex
	running map[string]string        // object id → command id being executed
	done    map[string]taskResult    // command id → result
	order   []string                 // command ids in completion order, to bound done
	owners  map[string]string        // instance id → workspace id
	waiting map[string]chan struct{} // object id → closed when its task ends
}

// taskResult is the answer to one command: of a Workspace or of a Volume.
type taskResult struct {
	ws  *api.WorkspaceTaskResult
	vol *api.VolumeTaskResult
}

func (r taskResult) outcome() (string, string) {
	if r.vol != nil {
		return r.vol.Outcome, r.vol.Error
	}
	return r.ws.Outcome, r.ws.Error
}

const keepResults = 1024

func (a *Agent) initTasks() {
	a.tasks = &tasks{running: map[string]string{}, done: map[string]taskResult{}, owners: map[string]string{}, waiting: map[string]chan struct{}{}}
	if b, err := os.ReadFile(a.ownersFile()); err == nil {
		json.Unmarshal(b, &a.tasks.owners)
	}
}

// ownersFile maps Instance ids to Workspace ids across node restarts (the
// data plane serves taken-over Instances by Workspace).
func (a *Agent) ownersFile() string {
	return filepath.Join(a.cfg.DataDir.NodeDir(), "instance-owners.json")
}

func (a *Agent) saveOwners() {
	b, _ := json.Marshal(a.tasks.owners)
	if err := datadir.WriteFileAtomic(a.ownersFile(), b, 0o600); err != nil {
		a.log.Warn("instance owners not saved", "err", err)
	}
}

// handleTask starts the Workspace command unless it runs or ran already.
func (a *Agent) handleTask(ctx context.Context, t api.WorkspaceTask) {
	log := a.log.With("workspace_id", t.WorkspaceID, "command_id", t.Command.CommandID, "kind", t.Command.Kind, "instance_id", t.Command.InstanceID)
	a.runTask(ctx, t.WorkspaceID, t.Command.CommandID, "workspace", log, func(ctx context.Context) taskResult {
		r := a.execute(ctx, t)
		return taskResult{ws: &r}
	})
}

// runTask runs exec for command id of object key (a noun: workspace,
// volume) in the background, after the object's earlier command, unless
// it runs or ran already (then its result is sent again).
func (a *Agent) runTask(ctx context.Context, key, id, noun string, log *slog.Logger, exec func(context.Context) taskResult) {
	ts := a.tasks
	ts.mu.Lock()
	if r, ok := ts.done[id]; ok {
		ts.mu.Unlock()
		a.sendResult(r)
		return
	}
	if ts.running[key] == id {
		ts.mu.Unlock()
		return
	}
	prev := ts.waiting[key]
	ch := make(chan struct{})
	ts.waiting[key] = ch
	ts.mu.Unlock()
	a.bg.spawn(ctx, func(ctx context.Context) {
		defer close(ch)
		if prev != nil {
			<-prev // an older command of this object finishes first
		}
		ts.mu.Lock()
		ts.running[key] = id
		ts.mu.Unlock()
		log.Info(noun + " command started")
		start := time.Now()
		r := exec(ctx)
		outcome, err := r.outcome()
		ts.mu.Lock()
		delete(ts.running, key)
		if ts.waiting[key] == ch {
			delete(ts.waiting, key)
		}
		if ctx.Err() != nil {
			// The node stops: no answer. ctrl sends the command again on
			// the node's next session, which finds what this one left.
			ts.mu.Unlock()
			log.Info(noun+" command interrupted: the node stops", "outcome", outcome, "err", err, "duration", time.Since(start).Round(time.Millisecond))
			return
		}
		log.Info(noun+" command done", "outcome", outcome, "err", err, "duration", time.Since(start).Round(time.Millisecond))
		ts.done[id] = r
		ts.order = append(ts.order, id)
		if len(ts.order) > keepResults {
			delete(ts.done, ts.order[0])
			ts.order = ts.order[1:]
		}
		ts.mu.Unlock()
		// The data plane learns of the change before ctrl does.
		a.updateDataPlane(ctx)
		if !a.sendResult(r) {
			a.PushReport()
		}
	})
}

// sendResult sends a task's result. It reports whether the report the
// node owes after the task went with it, in one message: a Workspace
// result to a leader that takes them so (one Raft entry instead of two).
func (a *Agent) sendResult(r taskResult) (reported bool) {
	a.mu.Lock()
	send, withReport := a.send, a.resultReports
	a.mu.Unlock()
	if send == nil {
		// The result waits: ctrl sends the command again on the next
		// session and gets it from done.
		return false
	}
	if r.vol != nil {
		send(api.SessionMsg{Type: api.MsgVolumeResult, VolumeResult: r.vol})
		return false
	}
	if withReport {
		// ctrl stores the result, then the report: the report lists
		// this command's ended records, if any, after its result.
		return a.sendReport(send, func(m *api.SessionMsg) {
			m.Type, m.TaskResult = api.MsgTaskResult, r.ws
		}) == nil
	}
	// After a report that listed the records, or before one that lists
	// this command's (see endedRecords.order).
	a.ended.order.Lock()
	defer a.ended.order.Unlock()
	send(api.SessionMsg{Type: api.MsgTaskResult, TaskResult: r.ws})
	return false
}

func (a *Agent) execute(ctx context.Context, t api.WorkspaceTask) api.WorkspaceTaskResult {
	r := api.WorkspaceTaskResult{WorkspaceID: t.WorkspaceID, CommandID: t.Command.CommandID, Outcome: api.OutcomeOK}
	var err error
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	switch t.Command.Kind {
	case api.WSCmdStart:
		var refusal string
		refusal, err = a.startWorkspace(ctx, t, &r)
		if refusal != "" {
			r.Outcome, r.Error = api.OutcomeRefused, refusal
			return r
		}
		if err != nil && t.Snapshot != nil && !t.Snapshot.Discard {
			a.failedResume(t, &r, err)
			return r
		}
	case api.WSCmdPause:
		err = a.pauseWorkspace(ctx, t, &r)
	case api.WSCmdStop:
		err = a.endInstance(ctx, t.Command.InstanceID, endPrepared)
	case api.WSCmdStopForce:
		if rt := a.cfg.Runtime; rt != nil && t.Command.InstanceID != "" && isUnknownInstance(statusErr(rt, t.Command.InstanceID)) {
			// Not taken over (or never started here): ctrl releases what
			// it held, and the Workspace stays FAILED, startable.
			r.NotOnNode = true
		}
		err = a.endInstance(ctx, t.Command.InstanceID, endForced)
	case api.WSCmdDelete:
		if err = a.endInstance(ctx, t.Command.InstanceID, endForDelete); err == nil {
			err = errors.Join(a.removeLayer(t), a.removeSnapshots(t))
		}
	case api.WSCmdNetwork:
		err = a.updateNetwork(ctx, t)
	default:
		err = fmt.Errorf("command kind %q is unknown to this node; upgrade it", t.Command.Kind)
	}
	if err != nil {
		r.Outcome, r.Error = api.OutcomeFailed, err.Error()
	}
	return r
}

// layerPath is the retained writable layer of a Workspace in the pool.
func (a *Agent) layerPath(pool, ws string) (string, error) {
	dir := a.poolPath(pool)
	if dir == "" {
		return "", fmt.Errorf("storage pool %s is not configured on node %s", pool, a.cfg.NodeID)
	}
	return filepath.Join(dir, "layers", ws+".qcow2"), nil
}

// awaitStarted waits until an Instance is no longer STARTING.
func (a *Agent) awaitStarted(ctx context.Context, id string) runtime.InstanceStatus {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := a.cfg.Runtime.Status(id)
		if err != nil || st.State != runtime.StateStarting {
			return st
		}
		select {
		case <-ctx.Done():
			return st
		case <-tick.C:
		}
	}
}

// mountVolumes mounts the Workspace's Volumes in the guest, under its
// filesystem the start mounted.
func (a *Agent) mountVolumes(ctx context.Context, id string, t api.WorkspaceTask) error {
	if len(t.Volumes) == 0 {
		return nil
	}
	c, err := a.cfg.Runtime.Guest(id)
	if err != nil {
		return err
	}
	if !c.Info().Has(guestproto.CapMountSerial) {
		return fmt.Errorf("%s: the guest agent of instance %s cannot mount Volumes (its Platform is older than Volumes): build a new Platform with kibotos platform build", api.StageAttachingVolume, id)
	}
	var req guestproto.ConfigureRequest
	for _, v := range t.Volumes {
		m := guestproto.Mount{Source: guestproto.MountSerialPrefix + volumeSerial(v.VolumeID), Target: WorkspaceRoot + v.Path, FSType: "ext4"}
		if c.Info().Has(guestproto.CapGrowFS) {
			// A Volume grown while the Workspace was stopped shows its size.
			m.Options = []string{guestproto.MountOptGrow}
		}
		req.Mounts = append(req.Mounts, m)
	}
	// Recorded: a restart of the guest mounts them again.
	if err := a.cfg.Runtime.Configure(ctx, id, req); err != nil {
		return fmt.Errorf("%s: instance %s: mount the Volumes: %w", api.StageAttachingVolume, id, err)
	}
	return nil
}

// TemplateMounts are the mounts of WorkspaceConfigure, which every
// Workspace of a template has the same (a warm guest makes them ahead):
// its filesystem at WorkspaceRoot, with the pseudo filesystems under it,
// and, when the guest agent can bind-mount, the agent's resolv.conf over
// the root's: the Workspace's commands run chrooted there, and the DNS
// servers configure writes (now or later, in place) must be the ones
// they use, whatever the template's /etc/resolv.conf held.
func TemplateMounts(guest guestproto.GuestInfo) []guestproto.Mount {
	root := "/dev/vda"
	if guest.Has(guestproto.CapMountSerial) {
		// By serial: whatever order the guest enumerates its disks in.
		root = guestproto.MountSerialPrefix + runtime.LayerSerial
	}
	mounts := []guestproto.Mount{
		{Source: root, Target: WorkspaceRoot, FSType: "ext4"},
		// What programs in the Workspace expect: /dev/null, /proc, ptys
		// of their own.
		{Source: "proc", Target: WorkspaceRoot + "/proc", FSType: "proc"},
		{Source: "sysfs", Target: WorkspaceRoot + "/sys", FSType: "sysfs"},
		{Source: "devtmpfs", Target: WorkspaceRoot + "/dev", FSType: "devtmpfs", Options: []string{"mode=0755"}},
		{Source: "devpts", Target: WorkspaceRoot + "/dev/pts", FSType: "devpts", Options: []string{"gid=5", "mode=620", "ptmxmode=666"}},
	}
	// An older agent would mkdir the target and fail the start; its
	// Workspaces keep the template's resolv.conf.
	if guest.Has(guestproto.CapBindMount) {
		mounts = append(mounts, guestproto.Mount{Source: guestproto.ResolvConf, Target: WorkspaceRoot + guestproto.ResolvConf, Options: []string{"bind"}})
	}
	return mounts
}

// WorkspaceConfigure is the configure request of a Workspace's start: its
// hostname and TemplateMounts.
func WorkspaceConfigure(hostname string, guest guestproto.GuestInfo) guestproto.ConfigureRequest {
	return guestproto.ConfigureRequest{Hostname: hostname, Mounts: TemplateMounts(guest)}
}

// forget deletes a failed start's Instance; the layer stays.
func (a *Agent) forget(ctx context.Context, id string) {
	st, serr := a.cfg.Runtime.Status(id)
	if err := a.cfg.Runtime.Delete(ctx, id); err != nil && !isUnknownInstance(err) {
		a.log.Warn("failed instance not deleted", "instance_id", id, "err", err)
	} else if serr == nil {
		a.releaseObjects(id, objectsOf(st))
	}
	a.tasks.mu.Lock()
	delete(a.tasks.owners, id)
	a.saveOwners()
	a.tasks.mu.Unlock()
}

// endMode says how endInstance ends a running Instance.
type endMode int

const (
	// endPrepared: a stop. The guest must prepare it (its processes end,
	// the writable layer and Volumes are synced and frozen); when it
	// cannot, the VMM keeps running and the error (prepare guest stop:
	// ...) leaves the Workspace FAILED until stop --force.
	endPrepared endMode = iota
	// endForced: stop --force. One short guest sync, then the VMM ends.
	endForced
	// endForDelete: a delete. Prepared when the guest can, forced when
	// not: the writable layer goes anyway.
	endForDelete
)

// endInstance stops and deletes an Instance; one that is already gone is
// fine.
func (a *Agent) endInstance(ctx context.Context, id string, mode endMode) error {
	rt := a.cfg.Runtime
	if rt == nil || id == "" {
		return nil
	}
	st, err := rt.Status(id)
	if err != nil {
		return nil // not on this node (any more)
	}
	if st.State == runtime.StateRunning {
		switch mode {
		case endPrepared:
			err = rt.Stop(ctx, id, stopGrace)
		case endForced:
			err = rt.ForceStop(ctx, id)
		}
		if err != nil {
			return err
		}
	}
	if err := rt.Delete(ctx, id); err != nil {
		return err
	}
	a.releaseObjects(id, objectsOf(st))
	a.tasks.mu.Lock()
	delete(a.tasks.owners, id)
	a.saveOwners()
	a.tasks.mu.Unlock()
	return nil
}

// layerStep is the record of a step of command t on its Workspace's layer
// at path: the command's id with "/layer".
func layerStep(t api.WorkspaceTask, kind, path string) commandRecord {
	return commandRecord{CommandID: t.Command.CommandID + "/layer", Kind: kind, WorkspaceID: t.WorkspaceID, PoolID: t.LayerPool, Path: path}
}

// createLayer makes the new layer a start boots over (from the template
// image), as a step recorded in volume-commands.json. A warm guest's layer
// is not made by a command: the warm guest brought it. Start makes a
// missing layer too, so an answer from the record leaves nothing undone.
func (a *Agent) createLayer(ctx context.Context, t api.WorkspaceTask, layer, image string) error {
	_, err := a.recorded(layerStep(t, cmdLayerCreate, layer), func() (string, error) {
		return "", runtime.EnsureLayer(ctx, a.cfg.NodeID, layer, image)
	})
	return err
}

// removeLayer removes the Workspace's layer (a delete), as a step
// recorded in volume-commands.json.
func (a *Agent) removeLayer(t api.WorkspaceTask) error {
	p, err := a.layerPath(t.LayerPool, t.WorkspaceID)
	if err != nil {
		return err
	}
	_, err = a.recorded(layerStep(t, cmdLayerDelete, p), func() (string, error) {
		// A base under it (a fork's or a forked source's) goes with the
		// last layer over it.
		if err := runtime.RemoveLayer(p, t.WorkspaceID); err != nil {
			return "", err
		}
		if err := storagepool.RemoveHolder(p); err != nil {
			return "", fmt.Errorf("remove the holder record of %s: %w", p, err)
		}
		return "", nil
	})
	return err
}

func statusErr(rt *runtime.Runtime, id string) error {
	_, err := rt.Status(id)
	return err
}

func isUnknownInstance(err error) bool {
	return errors.Is(err, runtime.ErrUnknownInstance)
}

// dataTargets lists the running Instances with their Workspaces.
func (a *Agent) dataTargets() []DataTarget {
	rt := a.cfg.Runtime
	if rt == nil {
		return nil
	}
	a.tasks.mu.Lock()
	owners := make(map[string]string, len(a.tasks.owners))
	for k, v := range a.tasks.owners {
		owners[k] = v
	}
	a.tasks.mu.Unlock()
	var out []DataTarget
	for _, st := range rt.List() {
		ws := owners[st.ID]
		if ws == "" || st.State != runtime.StateRunning || st.DataSocket == "" {
			continue
		}
		t := DataTarget{WorkspaceID: ws, InstanceID: st.ID, DataSocket: st.DataSocket}
		if st.Guest != nil {
			t.GuestBoot = st.Guest.BootID
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].InstanceID < out[j].InstanceID })
	return out
}

// dataPlaneAlive checks the data-plane process every few seconds: one that
// exited is replaced at the next update instead of at the 15 s resend.
func (a *Agent) dataPlaneAlive(ctx context.Context) bool {
	dp := a.cfg.DataPlane
	if dp == nil {
		return true
	}
	a.mu.Lock()
	due := time.Since(a.lastAliveCheck) >= 3*time.Second
	if due {
		a.lastAliveCheck = time.Now()
	}
	a.mu.Unlock()
	if !due {
		return true
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if dp.Alive(cctx) {
		return true
	}
	a.log.Warn("data-plane process does not answer: starting a new one")
	return false
}

// updateDataPlane hands the data-plane process the current targets and
// keys; it never blocks the caller for more than the push timeout.
func (a *Agent) updateDataPlane(ctx context.Context) {
	dp := a.cfg.DataPlane
	if dp == nil {
		return
	}
	a.mu.Lock()
	keys := a.credentialKeys
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 6*time.Second)
	defer cancel()
	targets := a.dataTargets()
	if err := dp.Update(ctx, targets, keys); err != nil {
		a.log.Warn("data-plane state not delivered", "err", err)
		return
	}
	a.mu.Lock()
	a.dataPushed = targets
	a.mu.Unlock()
}

// dataTargetsChanged says whether the targets differ from those the data
// plane last took (a guest that restarted and was reconfigured is served
// once it has the new boot).
func (a *Agent) dataTargetsChanged() bool {
	now := a.dataTargets()
	a.mu.Lock()
	defer a.mu.Unlock()
	return !slices.Equal(now, a.dataPushed)
}
