package fsm

import (
	"bytes"
	"fmt"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// GetVolume returns one Volume by name or id, or not_found.
func GetVolume(tx *bolt.Tx, ns, ref string) (*api.Volume, error) { return resolveVolume(tx, ns, ref) }

// VolumeFilter selects Volumes for ListVolumes.
type VolumeFilter struct {
	PoolID      string
	WorkspaceID string
	// Namespace, when set, selects the Volumes of that namespace.
	Namespace *string
}

// ListVolumes returns one page of Volumes matching f, by id.
func ListVolumes(tx *bolt.Tx, f VolumeFilter, pageSize int, pageToken string) (*api.VolumeList, error) {
	out := &api.VolumeList{Volumes: []api.Volume{}}
	c := tx.Bucket(bucketVolumes).Cursor()
	var k, raw []byte
	if pageToken == "" {
		k, raw = c.First()
	} else if k, raw = c.Seek([]byte(pageToken)); k != nil && string(k) == pageToken {
		k, raw = c.Next()
	}
	for ; k != nil; k, raw = c.Next() {
		var v api.Volume
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("state record %s/%s is corrupt: %w", bucketVolumes, k, err)
		}
		if (f.PoolID != "" && v.PoolID != f.PoolID) || (f.WorkspaceID != "" && v.WorkspaceID != f.WorkspaceID) ||
			(f.Namespace != nil && api.StoredNamespace(*f.Namespace) != v.Namespace) {
			continue
		}
		if pageSize > 0 && len(out.Volumes) == pageSize {
			out.NextPageToken = out.Volumes[len(out.Volumes)-1].VolumeID
			break
		}
		out.Volumes = append(out.Volumes, v)
	}
	return out, nil
}

// PendingVolumeCommands returns the Volumes with a command waiting for node.
func PendingVolumeCommands(tx *bolt.Tx, node string) ([]api.Volume, error) {
	var out []api.Volume
	prefix := []byte(node + "\x00")
	c := tx.Bucket(bucketVolumeCommands).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		v, err := getVolume(tx, string(k[len(prefix):]))
		if err != nil {
			return nil, err
		}
		if v != nil && v.Pending != nil {
			out = append(out, *v)
		}
	}
	return out, nil
}

// TaskVolumes is what a start command tells the node of w's Volumes.
func TaskVolumes(tx *bolt.Tx, w *api.Workspace) ([]api.TaskVolume, error) {
	vols, err := loadVolumes(tx, w)
	if err != nil {
		return nil, err
	}
	out := make([]api.TaskVolume, len(vols))
	for i, v := range vols {
		out[i] = api.TaskVolume{VolumeID: v.VolumeID, PoolID: v.PoolID, Path: w.Volumes[i].Path, SizeBytes: v.SizeBytes, Create: !v.Made}
	}
	return out, nil
}
