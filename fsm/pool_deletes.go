package fsm

import (
	"bytes"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Deletes that need a pool member. A Workspace's files (its layer) are
// removed by a node that reaches their pool: the node that made them
// while it can answer, else another member (a shared pool, or a pool
// whose disk was moved), else nobody yet: the delete waits, DELETING
// with no command, until a member reports the pool. Never is a record
// dropped while its files may still be on a disk.

func poolWaitKey(pool, ws string) []byte { return []byte(pool + "\x00" + ws) }

// movePoolWait keeps the pool_waits index in step with w (either may be nil).
func movePoolWait(tx *bolt.Tx, old, w *api.Workspace) error {
	return moveIndex(tx.Bucket(bucketPoolWaits), old, w, func(x *api.Workspace) []byte {
		if x.DeleteWaitsForPool == "" {
			return nil
		}
		return poolWaitKey(x.DeleteWaitsForPool, x.WorkspaceID)
	})
}

// canAnswer: the node may still execute a command (it may be offline now).
func canAnswer(n *api.Node) bool {
	return n != nil && n.Admission == api.Admitted && !n.Isolated && !n.Retired
}

// deleteFiles sets up the delete of w, which runs nowhere: the command to
// the node that will remove its layer, or the wait for one; gone is a node
// this entry isolates or retires (its stored record does not say so yet).
// It reports false when nothing is left on any disk (no layer, or lost):
// the caller drops the record.
func deleteFiles(ac *applyCtx, w *api.Workspace, gone string) (bool, error) {
	w.State = api.WorkspaceDeleting
	w.Pending, w.DeleteWaitsForPool = nil, ""
	if w.Layer == nil || w.Layer.Lost {
		return false, nil
	}
	pool := api.LayerPoolID(w.Layer)
	node, err := deleteNode(ac.tx, pool, w.Layer.NodeID, gone)
	if err != nil {
		return false, err
	}
	if node == "" {
		w.DeleteWaitsForPool = pool
		return true, nil
	}
	w.Layer.NodeID = node
	setPending(ac.e, w, api.WSCmdDelete, nil)
	return true, nil
}

// deleteNode is the node to remove a layer of pool that maker made: the
// maker while it can answer, else the first member (by id) that can, "" for none.
func deleteNode(tx *bolt.Tx, pool, maker, gone string) (string, error) {
	n, err := getRecord[api.Node](tx, bucketNodes, []byte(maker))
	if err != nil {
		return "", err
	}
	if maker != gone && canAnswer(n) {
		return maker, nil
	}
	rec, err := getRecord[poolRecord](tx, bucketPools, []byte(pool))
	if err != nil || rec == nil {
		return "", err
	}
	v, err := poolView(tx, rec)
	if err != nil {
		return "", err
	}
	for _, m := range v.Nodes {
		n, err := getRecord[api.Node](tx, bucketNodes, []byte(m.NodeID))
		if err != nil {
			return "", err
		}
		if m.NodeID != gone && canAnswer(n) {
			return m.NodeID, nil
		}
	}
	return "", nil
}

// resumeDeletes hands the deletes waiting for the pools of n's new report
// to n, a member of them now (the report is not stored yet).
func resumeDeletes(ac *applyCtx, n *api.Node) error {
	if !canAnswer(n) || n.Report == nil {
		return nil
	}
	for _, p := range n.Report.Pools {
		if rec, err := getRecord[poolRecord](ac.tx, bucketPools, []byte(p.PoolID)); err != nil {
			return err
		} else if rec == nil || rec.Shared != p.Shared {
			continue // declared the other way: not a member
		}
		prefix := []byte(p.PoolID + "\x00")
		var ids []string
		c := ac.tx.Bucket(bucketPoolWaits).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			ids = append(ids, string(k[len(prefix):]))
		}
		for _, id := range ids {
			if api.IsVolumeID(id) {
				if err := resumeVolumeDelete(ac, id, n.NodeID); err != nil {
					return err
				}
				continue
			}
			w, err := getWorkspace(ac.tx, id)
			if err != nil {
				return err
			}
			if w == nil {
				continue
			}
			old := cloneWorkspace(w)
			w.DeleteWaitsForPool = ""
			w.Layer.NodeID = n.NodeID
			setPending(ac.e, w, api.WSCmdDelete, nil)
			if err := putWorkspace(ac, old, w); err != nil {
				return err
			}
		}
	}
	return nil
}
