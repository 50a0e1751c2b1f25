package agent

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// handleVolumeTask starts the Volume command unless it runs or ran already.
func (a *Agent) handleVolumeTask(ctx context.Context, t api.VolumeTask) {
	log := a.log.With("volume_id", t.VolumeID, "command_id", t.Command.CommandID, "kind", t.Command.Kind, "pool", t.PoolID)
	a.runTask(ctx, t.VolumeID, t.Command.CommandID, "volume", log, func(ctx context.Context) taskResult {
		r := a.executeVolume(ctx, t)
		return taskResult{vol: &r}
	})
}

func (a *Agent) executeVolume(ctx context.Context, t api.VolumeTask) api.VolumeTaskResult {
	c := t.Command
	r := api.VolumeTaskResult{VolumeID: t.VolumeID, CommandID: c.CommandID, Outcome: api.OutcomeOK}
	if rec, ok := a.commands.find(c.CommandID, c.Kind); ok && rec.State != cmdRunning {
		// Ran before the node restarted: the same answer again.
		if rec.State == cmdFailed {
			r.Outcome = api.OutcomeFailed
		}
		r.Error, r.FilesystemPending = rec.Error, rec.FilesystemPending
		return r
	}
	fail := func(err error) api.VolumeTaskResult {
		r.Outcome, r.Error = api.OutcomeFailed, err.Error()
		return r
	}
	path, err := a.volumePath(t.PoolID, t.VolumeID)
	if err != nil {
		return fail(err)
	}
	rec := commandRecord{CommandID: c.CommandID, Kind: c.Kind, VolumeID: t.VolumeID, PoolID: t.PoolID, Path: path,
		SizeBytes: c.SizeBytes, InstanceID: c.InstanceID, State: cmdRunning, StartedAt: a.commands.clock()}
	if err := a.commands.put(rec); err != nil {
		return fail(fmt.Errorf("record the command in %s: %w", runtime.VolumeCommandsFile, err))
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	switch c.Kind {
	case api.VolCmdCreate:
		if err = api.ValidVolumeSize("volume "+t.VolumeID, c.SizeBytes); err == nil {
			err = storagepool.CreateVolume(ctx, a.cfg.NodeID, path, c.SizeBytes)
		}
	case api.VolCmdResize:
		if err = api.ValidVolumeSize("volume "+t.VolumeID, c.SizeBytes); err == nil {
			err = storagepool.GrowVolume(path, c.SizeBytes)
		}
		if err == nil && c.InstanceID != "" {
			if why := a.growOnline(ctx, t, path); why != "" {
				r.FilesystemPending, r.Error = true, why
			}
		}
	case api.VolCmdDelete:
		if id := a.instanceWriting(path); id != "" {
			err = fmt.Errorf("volume %s is attached to Instance %s on node %s, which still runs", t.VolumeID, id, a.cfg.NodeID)
		} else {
			err = storagepool.RemoveVolume(path)
		}
	default:
		err = fmt.Errorf("volume command kind %q is unknown to node %s; upgrade it", c.Kind, a.cfg.NodeID)
	}
	if err != nil {
		r.Outcome, r.Error = api.OutcomeFailed, err.Error()
	}
	now := a.commands.clock()
	rec.State, rec.Error, rec.FilesystemPending, rec.EndedAt = cmdOK, r.Error, r.FilesystemPending, &now
	if err != nil {
		rec.State = cmdFailed
	}
	if perr := a.commands.put(rec); perr != nil {
		a.log.Warn("volume command result not recorded", "volume_id", t.VolumeID, "command_id", c.CommandID, "err", perr)
	}
	return r
}

// volumePath is where the Volume's file is in one of this node's pools;
// an error names a pool the node does not have or cannot use now.
func (a *Agent) volumePath(pool, id string) (string, error) {
	if !api.IsVolumeID(id) {
		return "", fmt.Errorf("%q is not a volume id", id)
	}
	dir := a.poolPath(pool)
	if dir == "" {
		return "", fmt.Errorf("storage pool %s is not configured on node %s", pool, a.cfg.NodeID)
	}
	if st := poolStatus(pool, dir); !st.Available {
		return "", fmt.Errorf("storage pool is unavailable: pool %s at %s on node %s: %s", pool, dir, a.cfg.NodeID, st.Reason)
	}
	return api.VolumeFilePath(dir, id), nil
}

// instanceWriting is the Instance of this node that has the file at path
// attached (a Volume, or its retained layer) and still runs, "" for none.
func (a *Agent) instanceWriting(path string) string {
	rt := a.cfg.Runtime
	if rt == nil {
		return ""
	}
	for _, st := range rt.List() {
		if st.State != runtime.StateRunning && st.State != runtime.StateStarting {
			continue
		}
		if st.LayerPath == path {
			return st.ID
		}
		for _, v := range st.Volumes {
			if v.Path == path {
				return st.ID
			}
		}
	}
	return ""
}

// growOnline shows a grown Volume's new size to the running guest that
// has it attached: QEMU resizes the block device, the guest agent grows
// the filesystem. It returns why that did not complete ("" when it did);
// the file has the new size either way, and the filesystem grows at the
// guest's next mount of it.
func (a *Agent) growOnline(ctx context.Context, t api.VolumeTask, path string) string {
	rt := a.cfg.Runtime
	id, size := t.Command.InstanceID, t.Command.SizeBytes
	if rt == nil {
		return "node " + a.cfg.NodeID + " runs no VMs"
	}
	if err := api.ValidMountPath(t.MountPath); err != nil {
		return err.Error()
	}
	st, err := rt.Status(id)
	if err != nil || st.State != runtime.StateRunning {
		return fmt.Sprintf("instance %s does not run on node %s any more", id, a.cfg.NodeID)
	}
	serial := ""
	for _, v := range st.Volumes {
		if v.Path == path {
			serial = v.Serial
		}
	}
	if serial == "" {
		return fmt.Sprintf("instance %s does not have volume %s attached", id, t.VolumeID)
	}
	if err := rt.BlockResize(ctx, id, serial, size); err != nil {
		return err.Error()
	}
	c, err := rt.Guest(id)
	if err != nil {
		return err.Error()
	}
	if !c.Info().Has(guestproto.CapGrowFS) {
		return "the guest agent of instance " + id + " cannot grow a filesystem online (an older Platform)"
	}
	gctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := c.GrowFS(gctx, guestproto.GrowFSRequest{Path: WorkspaceRoot + t.MountPath, MinBytes: size}); err != nil {
		return err.Error()
	}
	return ""
}

// volumeSerial is the virtio-blk serial a Volume's disk carries, by which
// the guest finds it: 20 characters of its id (the most a serial holds).
func volumeSerial(id string) string {
	s := id[len(api.VolumeIDPrefix):]
	return s[:min(len(s), 20)]
}

// prepareVolumes readies a start's Volumes on this node: each file is in
// its pool (made now when the start is the one to create it, grown to
// ctrl's size when shorter) and this node's holder record is written
// before the VMM opens it. Errors begin with the ATTACHING_VOLUME stage.
func (a *Agent) prepareVolumes(ctx context.Context, t api.WorkspaceTask, im *imported) ([]runtime.VolumeDisk, error) {
	id := t.Command.InstanceID
	var disks []runtime.VolumeDisk
	var claimed []string
	for _, v := range t.Volumes {
		stage := func(err error) error {
			a.releaseObjects(id, claimed)
			return fmt.Errorf("%s: volume %s: %w", api.StageAttachingVolume, v.VolumeID, err)
		}
		if err := api.ValidMountPath(v.Path); err != nil {
			return nil, stage(err)
		}
		path, err := a.volumePath(v.PoolID, v.VolumeID)
		if err != nil {
			return nil, stage(err)
		}
		if v.Create {
			var staged string
			if im != nil {
				staged = im.volumes[v.Path]
			}
			if err := a.createForStart(ctx, t, v, path, staged); err != nil {
				return nil, stage(err)
			}
		} else if _, err := os.Lstat(path); err != nil {
			return nil, stage(fmt.Errorf("its file is not in pool %s: %w", v.PoolID, err))
		}
		if err := storagepool.GrowVolume(path, v.SizeBytes); err != nil {
			return nil, stage(err)
		}
		if err := a.claimObject(ctx, path, id); err != nil {
			return nil, stage(err)
		}
		claimed = append(claimed, path)
		disks = append(disks, runtime.VolumeDisk{Serial: volumeSerial(v.VolumeID), Path: path})
	}
	return disks, nil
}

// createForStart makes a Volume created along with its Workspace, as a
// command of its own in volume-commands.json (the start's command id with
// the Volume's); from the staged image of an imported Transfer, if any.
func (a *Agent) createForStart(ctx context.Context, t api.WorkspaceTask, v api.TaskVolume, path, staged string) error {
	rec := commandRecord{CommandID: t.Command.CommandID + "/" + v.VolumeID, Kind: api.VolCmdCreate, VolumeID: v.VolumeID, PoolID: v.PoolID,
		Path: path, SizeBytes: v.SizeBytes, WorkspaceID: t.WorkspaceID, State: cmdRunning, StartedAt: a.commands.clock()}
	if err := a.commands.put(rec); err != nil {
		return err
	}
	err := api.ValidVolumeSize("volume "+v.VolumeID, v.SizeBytes)
	switch {
	case err == nil && staged != "":
		err = storagepool.ImportVolume(ctx, a.cfg.NodeID, path, v.SizeBytes, staged)
	case err == nil:
		err = storagepool.CreateVolume(ctx, a.cfg.NodeID, path, v.SizeBytes)
	}
	now := a.commands.clock()
	rec.State, rec.EndedAt = cmdOK, &now
	if err != nil {
		rec.State, rec.Error = cmdFailed, err.Error()
	}
	if perr := a.commands.put(rec); perr != nil {
		a.log.Warn("volume command result not recorded", "volume_id", v.VolumeID, "command_id", rec.CommandID, "err", perr)
	}
	return err
}
