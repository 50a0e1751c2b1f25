package fsm

import (
	"bytes"
	"fmt"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// The pools as ctrl shows them: record, use and members read together.

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
		n, err := getRecord[api.Node](tx, bucketNodes, []byte(node))
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
