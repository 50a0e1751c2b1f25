package fsm

import (
	"bytes"
	"fmt"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// attachedVolumes are the Volumes w occupies: all of its list, except
// while it is deleted with nothing running any more (its files wait for
// a node, its Volumes are free).
func attachedVolumes(w *api.Workspace) []api.VolumeMount {
	if w == nil || (w.State == api.WorkspaceDeleting && w.InstanceID == "") {
		return nil
	}
	return w.Volumes
}

// syncVolumes brings the records of the Volumes old and w occupy in step
// with w: attached ones get w's mount and the layer's use right, ones w no
// longer occupies are detached (and released).
func syncVolumes(ac *applyCtx, old, w *api.Workspace) error {
	keep := map[string]bool{}
	for _, m := range attachedVolumes(w) {
		keep[m.VolumeID] = true
		err := changeVolume(ac, m.VolumeID, func(v *api.Volume) {
			v.WorkspaceID, v.MountPath, v.Held = w.WorkspaceID, m.Path, false
			if w.Layer != nil {
				v.NodeID, v.Held = w.Layer.NodeID, w.Layer.Held
			}
		})
		if err != nil {
			return err
		}
	}
	for _, m := range attachedVolumes(old) {
		if keep[m.VolumeID] {
			continue
		}
		if err := changeVolume(ac, m.VolumeID, func(v *api.Volume) {
			if v.WorkspaceID == old.WorkspaceID {
				v.WorkspaceID, v.MountPath, v.Held = "", "", false
			}
		}); err != nil {
			return err
		}
	}
	return nil
}

// changeVolume applies change to Volume id and stores it if it changed.
func changeVolume(ac *applyCtx, id string, change func(v *api.Volume)) error {
	v, err := getVolume(ac.tx, id)
	if err != nil || v == nil {
		return err
	}
	old := cloneVolume(v)
	change(v)
	if volumeEqual(old, v) {
		return nil
	}
	return putVolume(ac, old, v)
}

func volumeEqual(a, b *api.Volume) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// loadVolumes reads the records of w's Volumes, in w's order.
func loadVolumes(tx *bolt.Tx, w *api.Workspace) ([]*api.Volume, error) {
	out := make([]*api.Volume, 0, len(w.Volumes))
	for _, m := range w.Volumes {
		v, err := getVolume(tx, m.VolumeID)
		if err != nil {
			return nil, err
		}
		if v == nil {
			return nil, fmt.Errorf("state: workspace %s lists volume %s, which has no record", w.WorkspaceID, m.VolumeID)
		}
		out = append(out, v)
	}
	return out, nil
}

// workspaceVolumes resolves create's --volume and --new-volume into mounts
// and the new Volumes' records (not stored yet, without a pool: they go to
// the default pool of the node the first start is placed on).
func workspaceVolumes(ac *applyCtx, ws string, a *WorkspaceCreateArgs) ([]api.VolumeMount, []*api.Volume, error) {
	var mounts []api.VolumeMount
	var vols []*api.Volume
	for _, att := range a.Volumes {
		v, err := resolveVolume(ac.tx, a.Namespace, att.Volume)
		if err != nil {
			return nil, nil, err
		}
		if v.Namespace != a.Namespace {
			return nil, nil, api.Errorf(api.CodeNotFound, "volume %s does not exist in namespace %s: a Workspace attaches Volumes of its own namespace", att.Volume, api.ShownNamespace(a.Namespace))
		}
		switch {
		case v.WorkspaceID != "":
			return nil, nil, api.Errorf(api.CodeFailedPrecondition, "volume %s is attached to workspace %s already: a Volume is attached to one Workspace at a time", v.Name, v.WorkspaceID)
		case v.Pending != nil:
			return nil, nil, volumeBusy(v)
		case v.State != api.VolumeAvailable:
			return nil, nil, api.Errorf(api.CodeFailedPrecondition, "volume %s is %s: a Workspace can attach only an AVAILABLE Volume", v.Name, v.State)
		}
		for _, m := range mounts {
			if m.VolumeID == v.VolumeID {
				return nil, nil, api.Errorf(api.CodeInvalidArgument, "volume %s is given twice: attach it once", v.Name)
			}
		}
		mounts = append(mounts, api.VolumeMount{VolumeID: v.VolumeID, Name: v.Name, Path: att.Path})
		vols = append(vols, v)
	}
	for i, nv := range a.NewVolumes {
		id, name := newVolumeID(ws, i), newVolumeName(ws, i)
		if err := checkNewVolumeName(ac.tx, a.Namespace, name, id); err != nil {
			return nil, nil, err
		}
		v := &api.Volume{VolumeID: id, Name: name, Namespace: a.Namespace, State: api.VolumeCreating, SizeBytes: nv.SizeBytes, CreatedAt: *at(ac.e)}
		mounts = append(mounts, api.VolumeMount{VolumeID: id, Name: name, Path: nv.Path})
		vols = append(vols, v)
	}
	return mounts, vols, nil
}

// validateVolumeMounts checks create's Volume arguments.
func validateVolumeMounts(a *WorkspaceCreateArgs) error {
	if n := len(a.Volumes) + len(a.NewVolumes); n > api.MaxWorkspaceVolumes {
		return api.Errorf(api.CodeInvalidArgument, "%d Volumes given: a Workspace has at most %d", n, api.MaxWorkspaceVolumes)
	}
	var paths []string
	for _, att := range a.Volumes {
		if err := api.ValidVolumeRef(att.Volume); err != nil {
			return err
		}
		paths = append(paths, att.Path)
	}
	for _, nv := range a.NewVolumes {
		if err := api.ValidVolumeSize("--new-volume", nv.SizeBytes); err != nil {
			return err
		}
		paths = append(paths, nv.Path)
	}
	for i, p := range paths {
		if err := api.ValidMountPath(p); err != nil {
			return err
		}
		for _, q := range paths[:i] {
			if api.MountsOverlap(p, q) {
				return api.Errorf(api.CodeInvalidArgument, "mount paths %s and %s overlap: give each Volume its own directory, neither inside the other", q, p)
			}
		}
	}
	return nil
}

// newVolumes are the Volumes that go to the default pool of the node an
// execution is placed on: not made yet, and the Workspace has no layer
// (its first start; an earlier placement was refused).
func newVolumes(w *api.Workspace, vols []*api.Volume) []*api.Volume {
	if w.Layer != nil {
		return nil
	}
	var out []*api.Volume
	for _, v := range vols {
		if !v.Made {
			out = append(out, v)
		}
	}
	return out
}

// newBytes is what the new objects of a first start take of pool: the
// layer and the new Volumes not already charged there.
func newBytes(vols []*api.Volume, pool string, layer uint64) uint64 {
	n := layer
	for _, v := range vols {
		if v.PoolID != pool {
			n += v.SizeBytes
		}
	}
	return n
}

// homeNewVolumes puts the new Volumes of an execution on node in pool
// (its default pool, whose room the caller checked) and stores them.
func homeNewVolumes(ac *applyCtx, vols []*api.Volume, node, pool string, shared bool) error {
	for _, v := range vols {
		old, err := getVolume(ac.tx, v.VolumeID)
		if err != nil {
			return err
		}
		v.PoolID, v.Shared, v.NodeID = pool, shared, node
		if err := putVolume(ac, old, v); err != nil {
			return err
		}
	}
	return nil
}

// volumesMade marks w's Volumes made by its start (the node made the new
// ones and grew every filesystem to its file at the mount).
func volumesMade(ac *applyCtx, w *api.Workspace) error {
	for _, m := range w.Volumes {
		err := changeVolume(ac, m.VolumeID, func(v *api.Volume) {
			if !v.Made {
				v.Made, v.State = true, api.VolumeAvailable
			}
			if v.Expansion != nil && v.Expansion.FilesystemPending {
				v.Expansion = nil
			}
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// releaseVolumeCommands ends the Volume commands waiting for a node that
// will never answer them (isolated or retired): creates fail (the file may
// be there: deleting the Volume removes it), resizes are dropped, deletes
// go to another member of the pool or wait for one. It returns how many
// it ended.
func releaseVolumeCommands(ac *applyCtx, node, why string) (int, error) {
	var ids []string
	prefix := []byte(node + "\x00")
	c := ac.tx.Bucket(bucketVolumeCommands).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		ids = append(ids, string(k[len(prefix):]))
	}
	for _, id := range ids {
		v, err := getVolume(ac.tx, id)
		if err != nil {
			return 0, err
		}
		if v == nil || v.Pending == nil {
			continue
		}
		old := cloneVolume(v)
		p := v.Pending
		v.Pending = nil
		switch p.Kind {
		case api.VolCmdCreate:
			v.State, v.Made = api.VolumeFailed, true
			v.Error = "create: node " + node + " " + why + " before it answered; delete the Volume"
		case api.VolCmdResize:
			v.Expansion = nil
			v.Error = fmt.Sprintf("resize to %s: node %s %s before it answered; resize again", api.FormatBytes(p.SizeBytes), node, why)
		case api.VolCmdDelete:
			files, err := deleteVolumeFiles(ac, v, node)
			if err != nil {
				return 0, err
			}
			if !files {
				if err := deleteVolume(ac, old); err != nil {
					return 0, err
				}
				continue
			}
		}
		if err := putVolume(ac, old, v); err != nil {
			return 0, err
		}
	}
	return len(ids), nil
}

// resumeVolumeDelete hands a Volume delete waiting for its pool to node,
// a member of it now.
func resumeVolumeDelete(ac *applyCtx, id, node string) error {
	v, err := getVolume(ac.tx, id)
	if err != nil || v == nil {
		return err
	}
	old := cloneVolume(v)
	v.DeleteWaitsForPool = ""
	v.NodeID = node
	setVolumePending(ac.e, v, api.VolCmdDelete, node, 0, "")
	return putVolume(ac, old, v)
}

// loseVolumes ends the Volumes of a lost pool; a delete waiting for the
// pool completes. The caller checked no Instance uses one.
func loseVolumes(ac *applyCtx, pool string, res *api.PoolLostResult) error {
	var lost []*api.Volume
	err := ac.tx.Bucket(bucketVolumes).ForEach(func(k, raw []byte) error {
		var v api.Volume
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("state record %s/%s is corrupt: %w", bucketVolumes, k, err)
		}
		if v.PoolID == pool && v.State != api.VolumeLost {
			lost = append(lost, &v)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, v := range lost {
		old := cloneVolume(v)
		res.Volumes++
		if v.WorkspaceID != "" && !containsString(res.Workspaces, v.WorkspaceID) {
			res.Workspaces = append(res.Workspaces, v.WorkspaceID)
		}
		if v.State == api.VolumeDeleting {
			if err := deleteVolume(ac, old); err != nil {
				return err
			}
			continue
		}
		v.State, v.Held, v.Pending, v.Expansion = api.VolumeLost, false, nil, nil
		v.Error = "lost with storage pool " + pool + " (declare-lost)"
		if err := putVolume(ac, old, v); err != nil {
			return err
		}
	}
	return nil
}

// volumeInUse is the precondition declare-lost checks of a pool's
// Volumes: none may be attached to a running Instance, and none may wait
// for a node's answer it could still give.
func volumeInUse(tx *bolt.Tx, pool string) error {
	return tx.Bucket(bucketVolumes).ForEach(func(k, raw []byte) error {
		var v api.Volume
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("state record %s/%s is corrupt: %w", bucketVolumes, k, err)
		}
		if v.PoolID != pool || v.State == api.VolumeLost {
			return nil
		}
		if v.Held {
			return api.Errorf(api.CodeFailedPrecondition, "volume %s in storage pool %s is held by node %s for workspace %s: stop it first (kibo workspace stop --force %s)", v.Name, pool, v.NodeID, v.WorkspaceID, v.WorkspaceID)
		}
		return nil
	})
}
