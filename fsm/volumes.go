package fsm

import (
	"cmp"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Volumes. A Volume record holds what ctrl decides: its pool, size, the
// Workspace it is attached to, the command a node must execute on its
// file. Its use right is not a decision of its own: it follows the
// Workspace's execution, exactly as the retained layer's does, and
// putWorkspace copies it into the attached Volumes' records (syncVolumes),
// so every rule that moves or releases a layer (placement, results,
// isolate, retire, declare-lost) moves or releases the Volumes with it.

// VolumeCreateArgs creates a Volume; its id derives from the command id.
type VolumeCreateArgs struct {
	// Namespace (LevelNamespaces) of the Volume; "" is default.
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	SizeBytes uint64 `json:"size_bytes"`
	PoolID    string `json:"pool_id,omitempty"`
	NodeID    string `json:"node_id,omitempty"`
}

// VolumeArgs names a Volume by name or id (delete).
type VolumeArgs struct {
	Volume string `json:"volume"`
	// Namespace a name is found in (LevelNamespaces); "" is default.
	Namespace string `json:"namespace,omitempty"`
}

// VolumeResizeArgs grows a Volume.
type VolumeResizeArgs struct {
	Volume    string `json:"volume"`
	Namespace string `json:"namespace,omitempty"`
	SizeBytes uint64 `json:"size_bytes"`
}

// VolumeResultArgs is a node's answer to a Volume's pending command.
type VolumeResultArgs struct {
	NodeID            string `json:"node_id"`
	SessionID         string `json:"session_id"`
	VolumeID          string `json:"volume_id"`
	CommandID         string `json:"command_id"`
	Outcome           string `json:"outcome"`
	Error             string `json:"error,omitempty"`
	FilesystemPending bool   `json:"filesystem_pending,omitempty"`
}

// maxNodeError bounds the error text a node's answer leaves in a record.
const maxNodeError = 4096

// VolumeIDFor derives the Volume id a create with this command id makes.
func VolumeIDFor(commandID string) string {
	return api.VolumeIDPrefix + hashID("volume\x00"+commandID)
}

// newVolumeID is the id of the i-th Volume created along with Workspace ws.
func newVolumeID(ws string, i int) string {
	return api.VolumeIDPrefix + hashID("workspace-volume\x00"+ws+"\x00"+strconv.Itoa(i))
}

// newVolumeName names the i-th Volume created along with Workspace ws.
func newVolumeName(ws string, i int) string { return ws + "-" + strconv.Itoa(i+1) }

func volKey(id string) []byte { return []byte(id) }

// volNameKey is the key of a Volume's name in bucketVolumeNames: the
// name alone in default (as before namespaces), else namespace NUL name.
func volNameKey(ns, name string) []byte {
	if ns = api.StoredNamespace(ns); ns == "" {
		return []byte(name)
	}
	return []byte(ns + "\x00" + name)
}

// volCmdKey indexes a Volume under the node its pending command waits for.
func volCmdKey(node, vol string) []byte { return []byte(node + "\x00" + vol) }

func getVolume(tx *bolt.Tx, id string) (*api.Volume, error) {
	return getRecord[api.Volume](tx, bucketVolumes, volKey(id))
}

// resolveVolume finds a Volume by id, or by name in namespace ns.
func resolveVolume(tx *bolt.Tx, ns, ref string) (*api.Volume, error) {
	if err := api.ValidVolumeRef(ref); err != nil {
		return nil, err
	}
	id := ref
	if !api.IsVolumeID(ref) {
		raw := tx.Bucket(bucketVolumeNames).Get(volNameKey(ns, ref))
		if raw == nil {
			return nil, api.Errorf(api.CodeNotFound, "volume %s does not exist in namespace %s: check the name with kibo volume list -n %s", ref, api.ShownNamespace(api.StoredNamespace(ns)), api.ShownNamespace(api.StoredNamespace(ns)))
		}
		id = string(raw)
	}
	v, err := getVolume(tx, id)
	if err != nil {
		return nil, err
	}
	if v == nil {
		return nil, api.Errorf(api.CodeNotFound, "volume %s does not exist: check the id with kibo volume list", ref)
	}
	return v, nil
}

func cloneVolume(v *api.Volume) *api.Volume {
	c := *v
	if v.Pending != nil {
		p := *v.Pending
		c.Pending = &p
	}
	if v.Expansion != nil {
		x := *v.Expansion
		c.Expansion = &x
	}
	return &c
}

// volumeCharge is what v takes of its pool: its size, or the size a
// pending resize grows it to (the room is reserved when ctrl accepts the
// resize). A lost Volume or one without a pool yet takes nothing.
func volumeCharge(v *api.Volume) (string, PoolUse) {
	if v == nil || v.PoolID == "" || v.State == api.VolumeLost {
		return "", PoolUse{}
	}
	size := v.SizeBytes
	if p := v.Pending; p != nil && p.Kind == api.VolCmdResize && p.SizeBytes > size {
		size = p.SizeBytes
	}
	return v.PoolID, PoolUse{Volumes: 1, UsedBytes: size}
}

// putVolume stores v with a new version and keeps the indexes (name,
// pending commands by node, pool waits) and its pool's use in step with
// what old (nil for a new Volume) had.
func putVolume(ac *applyCtx, old, v *api.Volume) error {
	if old == nil {
		if err := ac.tx.Bucket(bucketVolumeNames).Put(volNameKey(v.Namespace, v.Name), []byte(v.VolumeID)); err != nil {
			return err
		}
		if err := moveNamespaceIndex(ac.tx, nsKindVolume, v.Namespace, v.VolumeID, true, false); err != nil {
			return err
		}
	}
	if err := moveVolumeIndexes(ac.tx, old, v); err != nil {
		return err
	}
	v.Version++
	v.UpdatedAt = *at(ac.e)
	return putJSON(ac.tx, bucketVolumes, volKey(v.VolumeID), v)
}

// deleteVolume drops v's record for good: its id is never used again.
func deleteVolume(ac *applyCtx, v *api.Volume) error {
	if err := moveVolumeIndexes(ac.tx, v, nil); err != nil {
		return err
	}
	if err := ac.tx.Bucket(bucketVolumeNames).Delete(volNameKey(v.Namespace, v.Name)); err != nil {
		return err
	}
	if err := moveNamespaceIndex(ac.tx, nsKindVolume, v.Namespace, v.VolumeID, false, true); err != nil {
		return err
	}
	if err := ac.tx.Bucket(bucketVolumeTombstones).Put(volKey(v.VolumeID), []byte(at(ac.e).Format(time.RFC3339))); err != nil {
		return err
	}
	return ac.tx.Bucket(bucketVolumes).Delete(volKey(v.VolumeID))
}

func moveVolumeIndexes(tx *bolt.Tx, old, v *api.Volume) error {
	if x := cmp.Or(v, old); x != nil {
		if err := moveNamespaceUsage(tx, x.Namespace, volCharge(old), volCharge(v)); err != nil {
			return err
		}
	}
	op, ou := volumeCharge(old)
	np, nu := volumeCharge(v)
	if op != np || ou != nu {
		if op != "" {
			if err := addPoolUse(tx, op, ou, -1); err != nil {
				return err
			}
		}
		if np != "" {
			if err := addPoolUse(tx, np, nu, +1); err != nil {
				return err
			}
		}
	}
	cmdNode := func(x *api.Volume) string {
		if x == nil || x.Pending == nil {
			return ""
		}
		return x.Pending.NodeID
	}
	idx := tx.Bucket(bucketVolumeCommands)
	if before, after := cmdNode(old), cmdNode(v); before != after {
		if before != "" {
			if err := idx.Delete(volCmdKey(before, old.VolumeID)); err != nil {
				return err
			}
		}
		if after != "" {
			if err := idx.Put(volCmdKey(after, v.VolumeID), nil); err != nil {
				return err
			}
		}
	}
	return moveIndex(tx.Bucket(bucketPoolWaits), old, v, func(x *api.Volume) []byte {
		if x.DeleteWaitsForPool == "" {
			return nil
		}
		return poolWaitKey(x.DeleteWaitsForPool, x.VolumeID)
	})
}

// setVolumePending records the command a node must execute on v next. Its
// id names the version it was issued at, so a late answer to an older
// command is recognised and ignored.
func setVolumePending(e *Entry, v *api.Volume, kind, node string, size uint64, instance string) {
	v.Pending = &api.VolumeCommand{Kind: kind, CommandID: v.VolumeID + "/" + strconv.FormatUint(v.Version+1, 10),
		NodeID: node, IssuedAt: *at(e), SizeBytes: size, InstanceID: instance}
}

// volumeWrite finds the Volume a write names (by id, or by name in ns)
// within the entry's scope and checks the expected version.
func volumeWrite(ac *applyCtx, ns, ref string) (*api.Volume, error) {
	ns, err := ac.scope.namespaceFor(ns)
	if err != nil {
		return nil, err
	}
	v, err := resolveVolume(ac.tx, ns, ref)
	if err != nil {
		return nil, err
	}
	if err := ac.scope.permits(v.Namespace, "volume "+ref); err != nil {
		return nil, err
	}
	if err := checkVersion(ac.e, v.Version, "volume "+v.Name); err != nil {
		return nil, err
	}
	return v, nil
}
