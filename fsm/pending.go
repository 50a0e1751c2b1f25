package fsm

import (
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// The commands waiting for each node. A node's control session reads
// them at every wake of its dispatcher on the leader (every task, every
// result, every ping), so they are indexed by node (bucketWorkspaceCommands)
// rather than found among all the Workspaces the node runs: a pass costs
// what is pending, not what the node holds.
//
// The index is this build's, like the command log's time index
// (commands.go): an older build neither reads nor writes it, yet may carry
// it in its snapshots while it changes Workspaces. So it is marked with
// the FSM clock as of which it matched the records (keyWorkspaceCommandsAt,
// written with every advance of the clock by this build only), and Restore
// builds it anew unless that is the state's clock.

// pendingNode is the node w's pending command waits for, "" for none.
func pendingNode(w *api.Workspace) string {
	if w == nil || w.Pending == nil {
		return ""
	}
	return w.Pending.NodeID
}

// movePending keeps the index in step with a Workspace write: old is the
// record before it (nil for a new Workspace), w after it (nil for a
// delete).
func movePending(tx *bolt.Tx, old, w *api.Workspace) error {
	from, to := pendingNode(old), pendingNode(w)
	if from == to {
		return nil
	}
	idx := tx.Bucket(bucketWorkspaceCommands)
	if from != "" {
		if err := idx.Delete(wsNodeKey(from, old.WorkspaceID)); err != nil {
			return err
		}
	}
	if to != "" {
		return idx.Put(wsNodeKey(to, w.WorkspaceID), nil)
	}
	return nil
}

// PendingCommands returns the Workspaces with a command waiting for node,
// by Workspace id.
func PendingCommands(tx *bolt.Tx, node string) ([]api.Workspace, error) {
	ws, err := workspacesIndexed(tx, bucketWorkspaceCommands, node)
	if err != nil {
		return nil, err
	}
	var out []api.Workspace
	for _, w := range ws {
		if pendingNode(w) == node {
			out = append(out, *w)
		}
	}
	return out, nil
}

// checkWorkspaceCommands keeps the index a restored state brings if it is
// marked at the state's clock, and builds it anew otherwise.
func checkWorkspaceCommands(tx *bolt.Tx) error {
	return checkDerived(tx, keyWorkspaceCommandsAt, func() bool { return true }, rebuildWorkspaceCommands)
}

// rebuildWorkspaceCommands makes the index anew from the Workspace
// records. A record that does not decode gets no entry (and fails every
// read of it as before) rather than failing the restore of the state.
func rebuildWorkspaceCommands(tx *bolt.Tx) error {
	idx, err := freshBucket(tx, bucketWorkspaceCommands)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketWorkspaces).ForEach(func(k, v []byte) error {
		var w struct {
			Pending *struct {
				NodeID string `json:"node_id"`
			} `json:"pending"`
		}
		if jsonRecord(bucketWorkspaces, k, v, &w) != nil || w.Pending == nil || w.Pending.NodeID == "" {
			return nil
		}
		return idx.Put(wsNodeKey(w.Pending.NodeID, string(k)), nil) // keyed by id (wsKey)
	})
}
