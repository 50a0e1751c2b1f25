package fsm

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/ctrl/placement"
)

// CheckVolumeCreate validates a create before it enters the log.
func CheckVolumeCreate(a VolumeCreateArgs) error {
	if err := api.ValidVolumeName(a.Name); err != nil {
		return err
	}
	if err := api.ValidVolumeSize("volume "+a.Name, a.SizeBytes); err != nil {
		return err
	}
	if a.PoolID != "" {
		if err := api.ValidPoolID(a.PoolID); err != nil {
			return err
		}
	}
	if a.NodeID != "" {
		return ValidNodeID(a.NodeID)
	}
	return nil
}

// checkNewVolumeName refuses a name (in namespace ns) or id that is, or
// was, in use.
func checkNewVolumeName(tx *bolt.Tx, ns, name, id string) error {
	if other := tx.Bucket(bucketVolumeNames).Get(volNameKey(ns, name)); other != nil {
		return api.Errorf(api.CodeAlreadyExists, "volume name %s is taken by %s in namespace %s: choose another name", name, other, api.ShownNamespace(api.StoredNamespace(ns)))
	}
	if v, err := getVolume(tx, id); err != nil {
		return err
	} else if v != nil {
		return api.Errorf(api.CodeAlreadyExists, "volume %s already exists (as %s): use a new --command-id", id, v.Name)
	}
	if at := tx.Bucket(bucketVolumeTombstones).Get(volKey(id)); at != nil {
		return api.Errorf(api.CodeAlreadyExists, "volume %s existed and was deleted at %s: use a new --command-id", id, at)
	}
	return nil
}

func applyVolumeCreate(ac *applyCtx) (any, error) {
	var a VolumeCreateArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if ac.e.CommandID == "" {
		return nil, api.Errorf(api.CodeInvalidArgument, "volume create needs a command id (the Volume id is derived from it)")
	}
	if err := CheckVolumeCreate(a); err != nil {
		return nil, err
	}
	id := VolumeIDFor(ac.e.CommandID)
	ns, err := ac.scope.namespaceFor(a.Namespace)
	if err != nil {
		return nil, err
	}
	if err := namespaceExists(ac.tx, ns); err != nil {
		return nil, err
	}
	if err := checkQuota(ac.tx, ns, api.NamespaceResources{VolumeBytes: a.SizeBytes}); err != nil {
		return nil, err
	}
	if err := checkNewVolumeName(ac.tx, ns, a.Name, id); err != nil {
		return nil, err
	}
	node, pool, err := volumeHome(ac, &a)
	if err != nil {
		return nil, err
	}
	rec, err := poolRoom(ac.tx, pool, "volume "+a.Name, a.SizeBytes)
	if err != nil {
		return nil, err
	}
	v := &api.Volume{VolumeID: id, Name: a.Name, Namespace: ns, State: api.VolumeCreating, PoolID: pool, Shared: rec.Shared,
		SizeBytes: a.SizeBytes, NodeID: node, CreatedAt: *at(ac.e)}
	setVolumePending(ac.e, v, api.VolCmdCreate, node, a.SizeBytes, "")
	if err := putVolume(ac, nil, v); err != nil {
		return nil, err
	}
	return v, nil
}

// volumeHome is where a new Volume goes and the node that makes its file:
// --pool on --node or on its first available member; --node alone in
// that node's default pool; neither, the default pool of the node
// placement would choose for a Workspace (the one with most room).
func volumeHome(ac *applyCtx, a *VolumeCreateArgs) (node, pool string, err error) {
	if a.NodeID != "" {
		n, err := mustNode(ac.tx, a.NodeID)
		if err != nil {
			return "", "", err
		}
		switch {
		case !n.HasRole(api.RoleNode):
			return "", "", api.Errorf(api.CodeFailedPrecondition, "node %s has no node role and keeps no Volumes; give a node with the node role", n.NodeID)
		case !canAnswer(n):
			return "", "", api.Errorf(api.CodeFailedPrecondition, "node %s is %s and makes no new Volumes; choose another --node", n.NodeID, deriveStatus(n, Holds{}))
		case n.DrainRequested:
			return "", "", api.Errorf(api.CodeFailedPrecondition, "node %s is draining and makes no new Volumes; cancel the drain or choose another --node", n.NodeID)
		case n.Report == nil:
			return "", "", api.Errorf(api.CodeFailedPrecondition, "node %s has not reported its storage pools yet; retry in a few seconds", n.NodeID)
		}
		pool = a.PoolID
		if pool == "" {
			pool = api.DefaultPoolOf(n.NodeID, n.Report)
		}
		if !reportsPoolAvailable(n.Report, pool) {
			return "", "", api.Errorf(api.CodeFailedPrecondition, "node %s does not report storage pool %s available; check it with kibo storage-pool get %s", n.NodeID, pool, pool)
		}
		return n.NodeID, pool, nil
	}
	if a.PoolID != "" {
		p, err := mustPool(ac.tx, a.PoolID)
		if err != nil {
			return "", "", err
		}
		v, err := poolView(ac.tx, p)
		if err != nil {
			return "", "", err
		}
		// A member with a live session first: it makes the file now.
		var fallback string
		for _, m := range v.Nodes {
			n, err := getRecord[api.Node](ac.tx, bucketNodes, []byte(m.NodeID))
			if err != nil {
				return "", "", err
			}
			if !m.Available || !canAnswer(n) || n.DrainRequested || !n.HasRole(api.RoleNode) {
				continue
			}
			if n.Session != nil && n.Session.Alive {
				return n.NodeID, p.PoolID, nil
			}
			if fallback == "" {
				fallback = n.NodeID
			}
		}
		if fallback != "" {
			return fallback, p.PoolID, nil
		}
		return "", "", api.Errorf(api.CodeFailedPrecondition, "storage pool %s has no member node that reports it available and takes new Volumes; check it with kibo storage-pool get %s", p.PoolID, p.PoolID)
	}
	_, cands, err := ac.cache.candidates(ac.tx)
	if err != nil {
		return "", "", err
	}
	size := a.SizeBytes
	d := placement.DecideAmong(cands, placement.Request{OwnDefaultPool: true, What: "room for volume " + a.Name + " of " + api.FormatBytes(size) + " in its default storage pool",
		Room: func(n *api.Node) string { return defaultPoolRoom(ac.tx, n, size) }})
	if node, err = d.Node, d.Err; err != nil {
		return "", "", err
	}
	n, err := mustNode(ac.tx, node)
	if err != nil {
		return "", "", err
	}
	return node, api.DefaultPoolOf(node, n.Report), nil
}

func reportsPoolAvailable(r *api.Report, id string) bool {
	for _, p := range r.Pools {
		if p.PoolID == id {
			return p.Available
		}
	}
	return false
}

func applyVolumeResize(ac *applyCtx) (any, error) {
	var a VolumeResizeArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	v, err := volumeWrite(ac, a.Namespace, a.Volume)
	if err != nil {
		return nil, err
	}
	if err := api.ValidVolumeSize("volume "+v.Name, a.SizeBytes); err != nil {
		return nil, err
	}
	switch {
	case a.SizeBytes == v.SizeBytes && v.Pending == nil:
		return v, nil
	case a.SizeBytes < v.SizeBytes:
		return nil, api.Errorf(api.CodeInvalidArgument, "volume %s is %s: a Volume only grows; give a size above it", v.Name, api.FormatBytes(v.SizeBytes))
	case v.Pending != nil:
		return nil, volumeBusy(v)
	case v.State != api.VolumeAvailable && !(v.State == api.VolumeCreating && !v.Made):
		return nil, api.Errorf(api.CodeFailedPrecondition, "volume %s is %s: resize needs AVAILABLE", v.Name, v.State)
	}
	if err := checkQuota(ac.tx, v.Namespace, api.NamespaceResources{VolumeBytes: a.SizeBytes - v.SizeBytes}); err != nil {
		return nil, err
	}
	rec, err := getRecord[poolRecord](ac.tx, bucketPools, []byte(v.PoolID))
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, api.Errorf(api.CodeFailedPrecondition, "volume %s: its storage pool %s is not declared by any node", v.Name, v.PoolID)
	}
	if err := recordRoom(ac.tx, rec, "the growth of volume "+v.Name, a.SizeBytes-v.SizeBytes); err != nil {
		return nil, err
	}
	node, instance := "", ""
	if v.WorkspaceID != "" {
		w, err := getWorkspace(ac.tx, v.WorkspaceID)
		if err != nil {
			return nil, err
		}
		if w != nil && w.InstanceID != "" {
			// A start in flight may be making or opening the file.
			if w.State != api.WorkspaceAvailable {
				return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s of volume %s is %s: resize the Volume when the Workspace is AVAILABLE (grown online) or STOPPED", w.WorkspaceID, v.Name, w.State)
			}
			node, instance = w.NodeID, w.InstanceID
		}
	}
	old := cloneVolume(v)
	v.Error = ""
	if !v.Made {
		// No file yet: it is made at the new size.
		v.SizeBytes = a.SizeBytes
		return v, putVolume(ac, old, v)
	}
	if node == "" {
		if node, err = deleteNode(ac.tx, v.PoolID, v.NodeID, ""); err != nil {
			return nil, err
		}
		if node == "" {
			return nil, api.Errorf(api.CodeFailedPrecondition, "volume %s: no node that can still answer is a member of its storage pool %s; resize it once one is back", v.Name, v.PoolID)
		}
	}
	v.Expansion = &api.VolumeExpansion{TargetBytes: a.SizeBytes, Since: *at(ac.e)}
	setVolumePending(ac.e, v, api.VolCmdResize, node, a.SizeBytes, instance)
	return v, putVolume(ac, old, v)
}

func volumeBusy(v *api.Volume) *api.Error {
	return api.Errorf(api.CodeFailedPrecondition, "volume %s has a %s in progress on node %s since %s: wait for it (kibo volume get %s)",
		v.Name, v.Pending.Kind, v.Pending.NodeID, v.Pending.IssuedAt.Format(time.RFC3339), v.Name)
}

func applyVolumeDelete(ac *applyCtx) (any, error) {
	var a VolumeArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	v, err := volumeWrite(ac, a.Namespace, a.Volume)
	if err != nil {
		return nil, err
	}
	switch {
	case v.State == api.VolumeDeleting:
		return v, nil
	case v.WorkspaceID != "":
		return nil, api.Errorf(api.CodeFailedPrecondition, "volume %s is attached to workspace %s at %s: delete the Workspace first (kibo workspace delete %s), which detaches it",
			v.Name, v.WorkspaceID, v.MountPath, v.WorkspaceID)
	case v.Pending != nil:
		return nil, volumeBusy(v)
	}
	old := cloneVolume(v)
	files, err := deleteVolumeFiles(ac, v, "")
	if err != nil {
		return nil, err
	}
	if !files {
		if err := deleteVolume(ac, old); err != nil {
			return nil, err
		}
		v.DeletedAt = at(ac.e)
		return v, nil
	}
	return v, putVolume(ac, old, v)
}

// deleteVolumeFiles sets up the delete of v's file: the command to a node
// that reaches its pool, or the wait for one (gone: a node this entry
// isolates or retires). It reports false when no file can exist (lost
// with its pool, or a create the node answered as failed): the caller
// drops the record.
func deleteVolumeFiles(ac *applyCtx, v *api.Volume, gone string) (bool, error) {
	if v.State == api.VolumeLost || (v.State == api.VolumeFailed && !v.Made) {
		return false, nil
	}
	v.State, v.Pending, v.DeleteWaitsForPool, v.Expansion = api.VolumeDeleting, nil, "", nil
	node, err := deleteNode(ac.tx, v.PoolID, v.NodeID, gone)
	if err != nil {
		return false, err
	}
	if node == "" {
		v.DeleteWaitsForPool = v.PoolID
		return true, nil
	}
	v.NodeID = node
	setVolumePending(ac.e, v, api.VolCmdDelete, node, 0, "")
	return true, nil
}

func applyVolumeResult(ac *applyCtx) (any, error) {
	var a VolumeResultArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := checkSession(ac.tx, a.NodeID, a.SessionID); err != nil {
		return nil, err
	}
	if !api.IsVolumeID(a.VolumeID) {
		return nil, api.Errorf(api.CodeInvalidArgument, "volume result: %q is not a volume id", a.VolumeID)
	}
	if len(a.Error) > maxNodeError {
		// A node's words are kept, not its whole output.
		a.Error = a.Error[:maxNodeError] + "..."
	}
	v, err := getVolume(ac.tx, a.VolumeID)
	if err != nil {
		return nil, err
	}
	if v == nil || v.Pending == nil || v.Pending.CommandID != a.CommandID || v.Pending.NodeID != a.NodeID {
		return map[string]bool{"applied": false}, nil // a late answer to a command ctrl no longer waits for
	}
	old := cloneVolume(v)
	p := v.Pending
	v.Pending = nil
	ok := a.Outcome == OutcomeOK
	v.Error = ""
	switch p.Kind {
	case api.VolCmdCreate:
		if ok {
			v.State, v.Made = api.VolumeAvailable, true
		} else {
			v.State, v.Error = api.VolumeFailed, "create: "+a.Error
		}
	case api.VolCmdResize:
		v.Expansion = nil
		switch {
		case !ok:
			v.Error = fmt.Sprintf("resize to %s: %s", api.FormatBytes(p.SizeBytes), a.Error)
		case a.FilesystemPending:
			v.SizeBytes = p.SizeBytes
			v.Expansion = &api.VolumeExpansion{TargetBytes: p.SizeBytes, Since: old.Expansion.Since, FilesystemPending: true, Reason: a.Error}
		default:
			v.SizeBytes = p.SizeBytes
		}
	case api.VolCmdDelete:
		if ok {
			if err := deleteVolume(ac, old); err != nil {
				return nil, err
			}
			return map[string]bool{"applied": true}, nil
		}
		// The file may still be there: deleting again retries.
		v.State, v.Error = api.VolumeFailed, "delete: "+a.Error
	}
	if err := putVolume(ac, old, v); err != nil {
		return nil, err
	}
	return map[string]bool{"applied": true}, nil
}

// Volumes of Workspaces.
