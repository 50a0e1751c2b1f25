package fsm

import (
	"bytes"
	"fmt"

	json "github.com/segmentio/encoding/json"

	"github.com/kibotos/kibotos/api"
)

// The operator's writes on a pool.

func applyPoolSetCapacity(ac *applyCtx) (any, error) {
	var a PoolCapacityArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := CheckPoolCapacity(a); err != nil {
		return nil, err
	}
	rec, err := mustPool(ac.tx, a.PoolID)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(ac.e, rec.Version, "storage pool "+rec.PoolID); err != nil {
		return nil, err
	}
	c := a.CapacityBytes
	rec.CapacityBytes = &c
	rec.Version++
	rec.UpdatedAt = *at(ac.e)
	if err := putJSON(ac.tx, bucketPools, []byte(rec.PoolID), rec); err != nil {
		return nil, err
	}
	return poolView(ac.tx, rec)
}

// CheckPoolCapacity validates set-capacity before it enters the log.
func CheckPoolCapacity(a PoolCapacityArgs) error {
	if err := api.ValidPoolID(a.PoolID); err != nil {
		return err
	}
	if a.CapacityBytes == 0 || a.CapacityBytes > api.MaxPoolCapacity {
		return api.Errorf(api.CodeInvalidArgument, "storage pool %s: capacity %d is out of range: give a size from 1B to 1EiB, such as 500GiB", a.PoolID, a.CapacityBytes)
	}
	return nil
}

// applyPoolDeclareLost ends every object of a pool that no node declares
// any more (the disk is gone): its layers are lost, their Workspaces can
// only be deleted, and the pool's record goes (a later declaration of the
// id is a new, empty pool).
func applyPoolDeclareLost(ac *applyCtx) (any, error) {
	var a PoolDeclareLostArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if !a.ConfirmDataLost {
		return nil, api.Errorf(api.CodeInvalidArgument, "storage pool %s: declare-lost ends its objects for good; add --confirm-data-lost when the disk is really gone", a.PoolID)
	}
	rec, err := mustPool(ac.tx, a.PoolID)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(ac.e, rec.Version, "storage pool "+rec.PoolID); err != nil {
		return nil, err
	}
	v, err := poolView(ac.tx, rec)
	if err != nil {
		return nil, err
	}
	if len(v.Nodes)+len(v.Conflicting) > 0 {
		holders := append(memberIDs(v.Nodes), v.Conflicting...)
		return nil, api.Errorf(api.CodeFailedPrecondition, "storage pool %s is still declared by node %s: declare-lost is for a pool no node has; retire or reconfigure those nodes first", rec.PoolID, holders[0])
	}
	// Every precondition before the first write.
	var lost []*api.Workspace
	err = ac.tx.Bucket(bucketWorkspaces).ForEach(func(k, raw []byte) error {
		var w api.Workspace
		if err := json.Unmarshal(raw, &w); err != nil {
			return fmt.Errorf("state record %s/%s is corrupt: %w", bucketWorkspaces, k, err)
		}
		if pool, _ := layerCharge(&w); pool != rec.PoolID {
			return nil
		}
		if w.InstanceID != "" {
			return api.Errorf(api.CodeFailedPrecondition, "workspace %s still has Instance %s on node %s with its layer in storage pool %s: stop it first (kibo workspace stop --force %s)", w.WorkspaceID, w.InstanceID, w.NodeID, rec.PoolID, w.WorkspaceID)
		}
		lost = append(lost, &w)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := volumeInUse(ac.tx, rec.PoolID); err != nil {
		return nil, err
	}
	res := api.PoolLostResult{PoolID: rec.PoolID, Workspaces: []string{}}
	for _, w := range lost {
		old := cloneWorkspace(w)
		w.Layer.Lost, w.Layer.Held = true, false
		res.RetainedLayers++
		res.Workspaces = append(res.Workspaces, w.WorkspaceID)
		if w.State == api.WorkspaceDeleting {
			// Its delete waited for a member to remove the files: there are none.
			if err := deleteWorkspace(ac, old); err != nil {
				return nil, err
			}
			continue
		}
		w.Pending = nil
		// A snapshot beside the layer is gone with it.
		w.Snapshot = nil
		if w.State == api.WorkspacePaused {
			w.State = api.WorkspaceStopped
		}
		if err := putWorkspace(ac, old, w); err != nil {
			return nil, err
		}
	}
	if err := loseVolumes(ac, rec.PoolID, &res); err != nil {
		return nil, err
	}
	for _, b := range [][]byte{bucketPools, bucketPoolUse} {
		if err := ac.tx.Bucket(b).Delete([]byte(rec.PoolID)); err != nil {
			return nil, err
		}
	}
	prefix := []byte(rec.PoolID + "\x00")
	c := ac.tx.Bucket(bucketPoolMembers).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
		if err := c.Delete(); err != nil {
			return nil, err
		}
	}
	return res, nil
}

func memberIDs(ms []api.PoolMember) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.NodeID
	}
	return out
}
