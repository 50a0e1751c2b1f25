package fsm

import (
	"slices"
	"sort"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// What the objects ctrl placed take of each pool (pool_use), and whether
// a new one still fits.

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
	rec, err := getRecord[poolRecord](tx, bucketPools, []byte(id))
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
	rec, err := getRecord[poolRecord](tx, bucketPools, []byte(pool))
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
