package fsm

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
	"time"

	json "github.com/segmentio/encoding/json"
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

func getPool(tx *bolt.Tx, id string) (*poolRecord, error) {
	return getRecord[poolRecord](tx, bucketPools, []byte(id))
}

func mustPool(tx *bolt.Tx, id string) (*poolRecord, error) {
	if err := api.ValidPoolID(id); err != nil {
		return nil, err
	}
	p, err := getPool(tx, id)
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
		rec, err := getPool(ac.tx, p.PoolID)
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

// layerCharge is what w's retained layer takes of its pool ("" for none).
func layerCharge(w *api.Workspace) (string, PoolUse) {
	if w == nil || w.Layer == nil || w.Layer.Lost {
		return "", PoolUse{}
	}
	return api.LayerPoolID(w.Layer), PoolUse{Layers: 1, UsedBytes: w.Layer.SizeBytes}
}

// snapshotCharge is what w's snapshot takes of its pool: the snapshot's
// size, or, while a pause runs, the guest memory it may grow to (reserved
// when ctrl accepted the pause). "" for none.
func snapshotCharge(w *api.Workspace) (string, PoolUse) {
	switch {
	case w == nil || w.Layer == nil || w.Layer.Lost:
		return "", PoolUse{}
	case w.Snapshot != nil && w.Snapshot.From != "":
		// A fork's names of its source's state file: no more room.
		return "", PoolUse{}
	case w.Snapshot != nil:
		return w.Snapshot.PoolID, PoolUse{UsedBytes: w.Snapshot.SizeBytes}
	case w.State == api.WorkspacePausing:
		return api.LayerPoolID(w.Layer), PoolUse{UsedBytes: w.MemoryBytes}
	}
	return "", PoolUse{}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// workspaceCharges is what w takes of each pool: its layer and snapshot.
func workspaceCharges(w *api.Workspace) map[string]PoolUse {
	out := map[string]PoolUse{}
	for _, f := range []func(*api.Workspace) (string, PoolUse){layerCharge, snapshotCharge} {
		if pool, c := f(w); pool != "" {
			u := out[pool]
			u.Layers += c.Layers
			u.UsedBytes += c.UsedBytes
			out[pool] = u
		}
	}
	return out
}

// movePoolUse replaces old's charges to pools by w's (either may be nil).
func movePoolUse(tx *bolt.Tx, old, w *api.Workspace) error {
	before, after := workspaceCharges(old), workspaceCharges(w)
	// Sorted: the order of the writes must not depend on map order.
	pools := sortedKeys(before)
	for _, p := range sortedKeys(after) {
		if _, ok := before[p]; !ok {
			pools = append(pools, p)
		}
	}
	for _, p := range pools {
		if before[p] == after[p] {
			continue
		}
		if u, ok := before[p]; ok {
			if err := addPoolUse(tx, p, u, -1); err != nil {
				return err
			}
		}
		if u, ok := after[p]; ok {
			if err := addPoolUse(tx, p, u, +1); err != nil {
				return err
			}
		}
	}
	return nil
}

func addPoolUse(tx *bolt.Tx, pool string, d PoolUse, sign int) error {
	u, err := poolUse(tx, pool)
	if err != nil {
		return err
	}
	if sign > 0 {
		u.Layers += d.Layers
		u.Volumes += d.Volumes
		u.UsedBytes += d.UsedBytes
	} else {
		u.Layers -= d.Layers
		u.Volumes -= d.Volumes
		u.UsedBytes -= d.UsedBytes
	}
	if u == (PoolUse{}) {
		return tx.Bucket(bucketPoolUse).Delete([]byte(pool))
	}
	return putJSON(tx, bucketPoolUse, []byte(pool), u)
}

// recountPoolUse rebuilds pool_use from the Workspaces' layers and the
// Volumes (a state from a release that did not count them).
func recountPoolUse(tx *bolt.Tx) error {
	err := tx.Bucket(bucketWorkspaces).ForEach(func(k, _ []byte) error {
		w, err := getWorkspace(tx, string(k))
		if err != nil {
			return err
		}
		charges := workspaceCharges(w)
		for _, pool := range sortedKeys(charges) {
			if err := addPoolUse(tx, pool, charges[pool], +1); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tx.Bucket(bucketVolumes).ForEach(func(k, _ []byte) error {
		v, err := getVolume(tx, string(k))
		if err != nil {
			return err
		}
		if pool, c := volumeCharge(v); pool != "" {
			return addPoolUse(tx, pool, c, +1)
		}
		return nil
	})
}

// poolRoom is nil when a new object of size bytes fits in pool id, else
// the resource_exhausted error that says why; it returns the pool.
func poolRoom(tx *bolt.Tx, id, what string, size uint64) (*poolRecord, error) {
	rec, err := getPool(tx, id)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, api.Errorf(api.CodeResourceExhausted, "storage pool %s is not declared by any node and takes no objects", id)
	}
	return rec, recordRoom(tx, rec, what, size)
}

// recordRoom is poolRoom of an already-read pool.
func recordRoom(tx *bolt.Tx, rec *poolRecord, what string, size uint64) error {
	if rec.CapacityBytes == nil {
		return api.PoolRoomError(usageView(rec, PoolUse{}), what, size)
	}
	u, err := poolUse(tx, rec.PoolID)
	if err != nil {
		return err
	}
	v := usageView(rec, u) // no member scan: placement asks per candidate
	if v.AvailableBytes == nil || *v.AvailableBytes < size {
		return api.PoolRoomError(v, what, size)
	}
	return nil
}

// usageView is the pool's record and use, without members.
func usageView(rec *poolRecord, u PoolUse) *api.StoragePool {
	v := &api.StoragePool{PoolID: rec.PoolID, Version: rec.Version, Shared: rec.Shared, CapacityBytes: rec.CapacityBytes,
		UsedBytes: u.UsedBytes, Layers: u.Layers, Volumes: u.Volumes, Nodes: []api.PoolMember{}, CreatedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt}
	if rec.CapacityBytes != nil {
		free := uint64(0)
		if *rec.CapacityBytes > u.UsedBytes {
			free = *rec.CapacityBytes - u.UsedBytes
		}
		v.AvailableBytes = &free
	}
	return v
}

// poolView derives the shown pool: members, use, availability.
func poolView(tx *bolt.Tx, rec *poolRecord) (*api.StoragePool, error) {
	u, err := poolUse(tx, rec.PoolID)
	if err != nil {
		return nil, err
	}
	v := usageView(rec, u)
	prefix := []byte(rec.PoolID + "\x00")
	c := tx.Bucket(bucketPoolMembers).Cursor()
	for k, raw := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, raw = c.Next() {
		node := string(k[len(prefix):])
		var d poolDecl
		if err := json.Unmarshal(raw, &d); err != nil {
			return nil, fmt.Errorf("state record %s/%q is corrupt: %w", bucketPoolMembers, k, err)
		}
		n, err := getNode(tx, node)
		if err != nil {
			return nil, err
		}
		if n == nil || n.Admission != api.Admitted || n.Retired || n.Report == nil {
			continue
		}
		for _, p := range n.Report.Pools {
			if p.PoolID != rec.PoolID {
				continue
			}
			if d.Shared != rec.Shared {
				v.Conflicting = append(v.Conflicting, node)
				break
			}
			v.Nodes = append(v.Nodes, api.PoolMember{NodeID: node, Available: p.Available, Reason: p.Reason, Path: p.Path, FreeBytes: p.FreeBytes, ReportedAt: n.Report.ReportedAt})
		}
	}
	return v, nil
}

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

// GetStoragePool returns one pool, or not_found.
func GetStoragePool(tx *bolt.Tx, id string) (*api.StoragePool, error) {
	rec, err := mustPool(tx, id)
	if err != nil {
		return nil, err
	}
	return poolView(tx, rec)
}

// ListStoragePools returns one page of pools, by id.
func ListStoragePools(tx *bolt.Tx, pageSize int, pageToken string) (*api.StoragePoolList, error) {
	out := &api.StoragePoolList{Pools: []api.StoragePool{}}
	err := pageOf(tx, bucketPools, pageSize, pageToken, func(k, raw []byte) error {
		var rec poolRecord
		if err := json.Unmarshal(raw, &rec); err != nil {
			return fmt.Errorf("state record %s/%s is corrupt: %w", bucketPools, k, err)
		}
		v, err := poolView(tx, &rec)
		if err != nil {
			return err
		}
		out.Pools = append(out.Pools, *v)
		return nil
	}, &out.NextPageToken)
	return out, err
}

// templateBytes is what a new layer over template may grow to on node n
// (0 when the node does not say: an older build); on a node without the
// template, which fetches the published image pub, the image's size.
func templateBytes(n *api.Node, template string, pub *catalogRecord) uint64 {
	if n.Report != nil {
		if size, ok := n.Report.TemplateBytes[template]; ok {
			return size
		}
	}
	// A node that fetches the published image: the catalog's size.
	if pub != nil && (n.Report == nil || !slices.Contains(n.Report.Templates, template)) {
		return uint64(pub.SizeBytes)
	}
	return 0
}

// defaultPoolRoom is placement's pool check of new objects on n (a first
// start's layer and new Volumes, a new Volume): its default pool must
// take size bytes. Reasons are counted across nodes in the error, so they
// name no pool.
func defaultPoolRoom(tx *bolt.Tx, n *api.Node, size uint64) string {
	pool := api.DefaultPoolOf(n.NodeID, n.Report)
	rec, err := getPool(tx, pool)
	if err != nil || rec == nil {
		return "its default storage pool is not declared yet"
	}
	if rec.CapacityBytes == nil {
		return "its default storage pool has no capacity set (kibo storage-pool set-capacity POOL SIZE)"
	}
	if err := recordRoom(tx, rec, "new objects", size); err != nil {
		return "its default storage pool is full"
	}
	return ""
}

// poolMoved reports whether a standalone pool's layer made by node may
// now be used by other members: node is no longer a member or is
// isolated, and another host declares the pool (its disk was moved there).
func poolMoved(tx *bolt.Tx, pool, node string) (bool, error) {
	rec, err := getPool(tx, pool)
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
		if n, err := getNode(tx, node); err != nil || !n.Isolated {
			return false, err // the maker is a member that can still use it
		}
	}
	return others, nil
}

func lostLayerError(w *api.Workspace) error {
	return api.Errorf(api.CodeFailedPrecondition, "workspace %s: its writable layer was lost with storage pool %s (declare-lost); it cannot start again, delete it with kibo workspace delete %s",
		w.WorkspaceID, api.LayerPoolID(w.Layer), w.WorkspaceID)
}

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
	n, err := getNode(tx, maker)
	if err != nil {
		return "", err
	}
	if maker != gone && canAnswer(n) {
		return maker, nil
	}
	rec, err := getPool(tx, pool)
	if err != nil || rec == nil {
		return "", err
	}
	v, err := poolView(tx, rec)
	if err != nil {
		return "", err
	}
	for _, m := range v.Nodes {
		n, err := getNode(tx, m.NodeID)
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
		if rec, err := getPool(ac.tx, p.PoolID); err != nil {
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
