package fsm

import (
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Storage pools. Nodes declare pools in their reports; the first
// declaration of an id makes the pool's record, which holds what only ctrl
// decides: the capacity and (in pool_use) what its objects take. Who is a
// member is read from the declarations (the pool_members index) and the
// nodes' records at read time, so a node retired, revoked or whose
// configuration changed stops being one without a write here.

// PoolCapacityArgs sets a pool's capacity.
type PoolCapacityArgs struct {
	PoolID        string `json:"pool_id"`
	CapacityBytes uint64 `json:"capacity_bytes"`
}

// PoolDeclareLostArgs ends the objects of a pool without members.
type PoolDeclareLostArgs struct {
	PoolID          string `json:"pool_id"`
	ConfirmDataLost bool   `json:"confirm_data_lost"`
}

// poolRecord is a pool as stored.
type poolRecord struct {
	PoolID        string    `json:"pool_id"`
	Shared        bool      `json:"shared"`
	CapacityBytes *uint64   `json:"capacity_bytes,omitempty"`
	Version       uint64    `json:"version"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// PoolUse is what the objects ctrl placed in a pool take.
type PoolUse struct {
	Layers    int    `json:"layers,omitempty"`
	Volumes   int    `json:"volumes,omitempty"`
	UsedBytes uint64 `json:"used_bytes,omitempty"`
}

// poolDecl is one node's declaration of a pool (the member index value).
type poolDecl struct {
	Shared bool `json:"shared,omitempty"`
}

func poolMemberKey(pool, node string) []byte { return []byte(pool + "\x00" + node) }

func mustPool(tx *bolt.Tx, id string) (*poolRecord, error) {
	if err := api.ValidPoolID(id); err != nil {
		return nil, err
	}
	p, err := getRecord[poolRecord](tx, bucketPools, []byte(id))
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, api.Errorf(api.CodeNotFound, "storage pool %s does not exist: no node declared it; check the id with kibo storage-pool list", id)
	}
	return p, nil
}

func poolUse(tx *bolt.Tx, id string) (PoolUse, error) {
	var u PoolUse
	_, err := getJSON(tx, bucketPoolUse, []byte(id), &u)
	return u, err
}

// checkReportPools validates and normalizes the pools of a report: the
// legacy private pool name becomes the node's private pool id.
func checkReportPools(node string, r *api.Report) error {
	if len(r.Pools) > api.MaxPoolsPerNode {
		return api.Errorf(api.CodeInvalidArgument, "report of node %s lists %d storage pools: at most %d", node, len(r.Pools), api.MaxPoolsPerNode)
	}
	pools := make([]api.Pool, len(r.Pools))
	for i, p := range r.Pools {
		p.PoolID = api.NormalizePoolID(node, p.PoolID)
		if err := api.ValidPoolID(p.PoolID); err != nil {
			return api.Errorf(api.CodeInvalidArgument, "report of node %s: %v", node, err)
		}
		if len(p.Path) > 4096 || len(p.Reason) > 1024 {
			return api.Errorf(api.CodeInvalidArgument, "report of node %s: storage pool %s has a path or reason over 4096/1024 bytes", node, p.PoolID)
		}
		for _, q := range pools[:i] {
			if q.PoolID == p.PoolID {
				return api.Errorf(api.CodeInvalidArgument, "report of node %s lists storage pool %s twice", node, p.PoolID)
			}
		}
		pools[i] = p
	}
	r.Pools = pools
	r.DefaultPool = api.NormalizePoolID(node, r.DefaultPool)
	if len(r.TemplateBytes) > 1024 {
		return api.Errorf(api.CodeInvalidArgument, "report of node %s sizes %d templates: at most 1024", node, len(r.TemplateBytes))
	}
	return nil
}

// declarePools brings the member index in step with the node's new report
// (old: the pools of its previous one, none before its first) and makes
// the record of a pool declared for the first time.
func declarePools(ac *applyCtx, node string, old []api.Pool, r *api.Report) error {
	idx := ac.tx.Bucket(bucketPoolMembers)
	for _, p := range old {
		if !reportsPool(r, p.PoolID) {
			if err := idx.Delete(poolMemberKey(p.PoolID, node)); err != nil {
				return err
			}
		}
	}
	for _, p := range r.Pools {
		// Written only when it changes: reports come every few seconds.
		var d poolDecl
		if ok, err := getJSON(ac.tx, bucketPoolMembers, poolMemberKey(p.PoolID, node), &d); err != nil {
			return err
		} else if !ok || d.Shared != p.Shared {
			if err := putJSON(ac.tx, bucketPoolMembers, poolMemberKey(p.PoolID, node), poolDecl{Shared: p.Shared}); err != nil {
				return err
			}
		}
		rec, err := getRecord[poolRecord](ac.tx, bucketPools, []byte(p.PoolID))
		if err != nil {
			return err
		}
		if rec == nil {
			rec = &poolRecord{PoolID: p.PoolID, Shared: p.Shared, Version: 1, CreatedAt: *at(ac.e), UpdatedAt: *at(ac.e)}
			if err := putJSON(ac.tx, bucketPools, []byte(p.PoolID), rec); err != nil {
				return err
			}
		}
	}
	return nil
}

func reportsPool(r *api.Report, id string) bool {
	if r == nil {
		return false
	}
	for _, p := range r.Pools {
		if p.PoolID == id {
			return true
		}
	}
	return false
}

// poolMoved reports whether a standalone pool's layer made by node may
// now be used by other members: node is no longer a member or is
// isolated, and another host declares the pool (its disk was moved there).
func poolMoved(tx *bolt.Tx, pool, node string) (bool, error) {
	rec, err := getRecord[poolRecord](tx, bucketPools, []byte(pool))
	if err != nil || rec == nil {
		return false, err
	}
	// Membership is poolView's rule, read once.
	v, err := poolView(tx, rec)
	if err != nil {
		return false, err
	}
	others := false
	for _, m := range v.Nodes {
		if m.NodeID != node {
			others = true
			continue
		}
		if n, err := getRecord[api.Node](tx, bucketNodes, []byte(node)); err != nil || !n.Isolated {
			return false, err // the maker is a member that can still use it
		}
	}
	return others, nil
}

func lostLayerError(w *api.Workspace) error {
	return api.Errorf(api.CodeFailedPrecondition, "workspace %s: its writable layer was lost with storage pool %s (declare-lost); it cannot start again, delete it with kibo workspace delete %s",
		w.WorkspaceID, api.LayerPoolID(w.Layer), w.WorkspaceID)
}
