package fsm

import (
	"bytes"
	"fmt"
	"strconv"
	"time"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/ctrl/placement"
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
	Name      string `json:"name"`
	SizeBytes uint64 `json:"size_bytes"`
	PoolID    string `json:"pool_id,omitempty"`
	NodeID    string `json:"node_id,omitempty"`
}

// VolumeArgs names a Volume by name or id (delete).
type VolumeArgs struct {
	Volume string `json:"volume"`
}

// VolumeResizeArgs grows a Volume.
type VolumeResizeArgs struct {
	Volume    string `json:"volume"`
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

// volCmdKey indexes a Volume under the node its pending command waits for.
func volCmdKey(node, vol string) []byte { return []byte(node + "\x00" + vol) }

func getVolume(tx *bolt.Tx, id string) (*api.Volume, error) {
	return getRecord[api.Volume](tx, bucketVolumes, volKey(id))
}

// resolveVolume finds a Volume by id or name.
func resolveVolume(tx *bolt.Tx, ref string) (*api.Volume, error) {
	if err := api.ValidVolumeRef(ref); err != nil {
		return nil, err
	}
	id := ref
	if !api.IsVolumeID(ref) {
		raw := tx.Bucket(bucketVolumeNames).Get([]byte(ref))
		if raw == nil {
			return nil, api.Errorf(api.CodeNotFound, "volume %s does not exist: check the name with kibo volume list", ref)
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
func putVolume(tx *bolt.Tx, e *Entry, old, v *api.Volume) error {
	if old == nil {
		if err := tx.Bucket(bucketVolumeNames).Put([]byte(v.Name), []byte(v.VolumeID)); err != nil {
			return err
		}
	}
	if err := moveVolumeIndexes(tx, old, v); err != nil {
		return err
	}
	v.Version++
	v.UpdatedAt = *at(e)
	return putJSON(tx, bucketVolumes, volKey(v.VolumeID), v)
}

// deleteVolume drops v's record for good: its id is never used again.
func deleteVolume(tx *bolt.Tx, e *Entry, v *api.Volume) error {
	if err := moveVolumeIndexes(tx, v, nil); err != nil {
		return err
	}
	if err := tx.Bucket(bucketVolumeNames).Delete([]byte(v.Name)); err != nil {
		return err
	}
	if err := tx.Bucket(bucketVolumeTombstones).Put(volKey(v.VolumeID), []byte(at(e).Format(time.RFC3339))); err != nil {
		return err
	}
	return tx.Bucket(bucketVolumes).Delete(volKey(v.VolumeID))
}

func moveVolumeIndexes(tx *bolt.Tx, old, v *api.Volume) error {
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

func volumeWrite(tx *bolt.Tx, e *Entry, ref string) (*api.Volume, error) {
	v, err := resolveVolume(tx, ref)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(e, v.Version, "volume "+v.Name); err != nil {
		return nil, err
	}
	return v, nil
}

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

// checkNewVolumeName refuses a name or id that is, or was, in use.
func checkNewVolumeName(tx *bolt.Tx, name, id string) error {
	if other := tx.Bucket(bucketVolumeNames).Get([]byte(name)); other != nil {
		return api.Errorf(api.CodeAlreadyExists, "volume name %s is taken by %s: choose another name", name, other)
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

func applyVolumeCreate(tx *bolt.Tx, e *Entry) (any, error) {
	var a VolumeCreateArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	if e.CommandID == "" {
		return nil, api.Errorf(api.CodeInvalidArgument, "volume create needs a command id (the Volume id is derived from it)")
	}
	if err := CheckVolumeCreate(a); err != nil {
		return nil, err
	}
	id := VolumeIDFor(e.CommandID)
	if err := checkNewVolumeName(tx, a.Name, id); err != nil {
		return nil, err
	}
	node, pool, err := volumeHome(tx, &a)
	if err != nil {
		return nil, err
	}
	rec, err := poolRoom(tx, pool, "volume "+a.Name, a.SizeBytes)
	if err != nil {
		return nil, err
	}
	v := &api.Volume{VolumeID: id, Name: a.Name, State: api.VolumeCreating, PoolID: pool, Shared: rec.Shared,
		SizeBytes: a.SizeBytes, NodeID: node, CreatedAt: *at(e)}
	setVolumePending(e, v, api.VolCmdCreate, node, a.SizeBytes, "")
	if err := putVolume(tx, e, nil, v); err != nil {
		return nil, err
	}
	return v, nil
}

// volumeHome is where a new Volume goes and the node that makes its file:
// --pool on --node or on its first available member; --node alone in
// that node's default pool; neither, the default pool of the node
// placement would choose for a Workspace (the one with most room).
func volumeHome(tx *bolt.Tx, a *VolumeCreateArgs) (node, pool string, err error) {
	if a.NodeID != "" {
		n, err := mustNode(tx, a.NodeID)
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
		p, err := mustPool(tx, a.PoolID)
		if err != nil {
			return "", "", err
		}
		v, err := poolView(tx, p)
		if err != nil {
			return "", "", err
		}
		// A member with a live session first: it makes the file now.
		var fallback string
		for _, m := range v.Nodes {
			n, err := getNode(tx, m.NodeID)
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
	_, cands, err := candidates(tx)
	if err != nil {
		return "", "", err
	}
	size := a.SizeBytes
	d := placement.DecideAmong(cands, placement.Request{OwnDefaultPool: true, What: "room for volume " + a.Name + " of " + api.FormatBytes(size) + " in its default storage pool",
		Room: func(n *api.Node) string { return defaultPoolRoom(tx, n, size) }})
	if node, err = d.Node, d.Err; err != nil {
		return "", "", err
	}
	n, err := mustNode(tx, node)
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

func applyVolumeResize(tx *bolt.Tx, e *Entry) (any, error) {
	var a VolumeResizeArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	v, err := volumeWrite(tx, e, a.Volume)
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
	rec, err := getPool(tx, v.PoolID)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, api.Errorf(api.CodeFailedPrecondition, "volume %s: its storage pool %s is not declared by any node", v.Name, v.PoolID)
	}
	if err := recordRoom(tx, rec, "the growth of volume "+v.Name, a.SizeBytes-v.SizeBytes); err != nil {
		return nil, err
	}
	node, instance := "", ""
	if v.WorkspaceID != "" {
		w, err := getWorkspace(tx, v.WorkspaceID)
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
		return v, putVolume(tx, e, old, v)
	}
	if node == "" {
		if node, err = deleteNode(tx, v.PoolID, v.NodeID, ""); err != nil {
			return nil, err
		}
		if node == "" {
			return nil, api.Errorf(api.CodeFailedPrecondition, "volume %s: no node that can still answer is a member of its storage pool %s; resize it once one is back", v.Name, v.PoolID)
		}
	}
	v.Expansion = &api.VolumeExpansion{TargetBytes: a.SizeBytes, Since: *at(e)}
	setVolumePending(e, v, api.VolCmdResize, node, a.SizeBytes, instance)
	return v, putVolume(tx, e, old, v)
}

func volumeBusy(v *api.Volume) *api.Error {
	return api.Errorf(api.CodeFailedPrecondition, "volume %s has a %s in progress on node %s since %s: wait for it (kibo volume get %s)",
		v.Name, v.Pending.Kind, v.Pending.NodeID, v.Pending.IssuedAt.Format(time.RFC3339), v.Name)
}

func applyVolumeDelete(tx *bolt.Tx, e *Entry) (any, error) {
	var a VolumeArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	v, err := volumeWrite(tx, e, a.Volume)
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
	files, err := deleteVolumeFiles(tx, e, v, "")
	if err != nil {
		return nil, err
	}
	if !files {
		if err := deleteVolume(tx, e, old); err != nil {
			return nil, err
		}
		v.DeletedAt = at(e)
		return v, nil
	}
	return v, putVolume(tx, e, old, v)
}

// deleteVolumeFiles sets up the delete of v's file: the command to a node
// that reaches its pool, or the wait for one (gone: a node this entry
// isolates or retires). It reports false when no file can exist (lost
// with its pool, or a create the node answered as failed): the caller
// drops the record.
func deleteVolumeFiles(tx *bolt.Tx, e *Entry, v *api.Volume, gone string) (bool, error) {
	if v.State == api.VolumeLost || (v.State == api.VolumeFailed && !v.Made) {
		return false, nil
	}
	v.State, v.Pending, v.DeleteWaitsForPool, v.Expansion = api.VolumeDeleting, nil, "", nil
	node, err := deleteNode(tx, v.PoolID, v.NodeID, gone)
	if err != nil {
		return false, err
	}
	if node == "" {
		v.DeleteWaitsForPool = v.PoolID
		return true, nil
	}
	v.NodeID = node
	setVolumePending(e, v, api.VolCmdDelete, node, 0, "")
	return true, nil
}

func applyVolumeResult(tx *bolt.Tx, e *Entry) (any, error) {
	var a VolumeResultArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	if err := checkSession(tx, a.NodeID, a.SessionID); err != nil {
		return nil, err
	}
	if !api.IsVolumeID(a.VolumeID) {
		return nil, api.Errorf(api.CodeInvalidArgument, "volume result: %q is not a volume id", a.VolumeID)
	}
	if len(a.Error) > maxNodeError {
		// A node's words are kept, not its whole output.
		a.Error = a.Error[:maxNodeError] + "..."
	}
	v, err := getVolume(tx, a.VolumeID)
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
			if err := deleteVolume(tx, e, old); err != nil {
				return nil, err
			}
			return map[string]bool{"applied": true}, nil
		}
		// The file may still be there: deleting again retries.
		v.State, v.Error = api.VolumeFailed, "delete: "+a.Error
	}
	if err := putVolume(tx, e, old, v); err != nil {
		return nil, err
	}
	return map[string]bool{"applied": true}, nil
}

// Volumes of Workspaces.

// attachedVolumes are the Volumes w occupies: all of its list, except
// while it is deleted with nothing running any more (its files wait for
// a node, its Volumes are free).
func attachedVolumes(w *api.Workspace) []api.VolumeMount {
	if w == nil || (w.State == api.WorkspaceDeleting && w.InstanceID == "") {
		return nil
	}
	return w.Volumes
}

// syncVolumes brings the records of the Volumes old and w occupy in step
// with w: attached ones get w's mount and the layer's use right, ones w no
// longer occupies are detached (and released).
func syncVolumes(tx *bolt.Tx, e *Entry, old, w *api.Workspace) error {
	keep := map[string]bool{}
	for _, m := range attachedVolumes(w) {
		keep[m.VolumeID] = true
		err := changeVolume(tx, e, m.VolumeID, func(v *api.Volume) {
			v.WorkspaceID, v.MountPath, v.Held = w.WorkspaceID, m.Path, false
			if w.Layer != nil {
				v.NodeID, v.Held = w.Layer.NodeID, w.Layer.Held
			}
		})
		if err != nil {
			return err
		}
	}
	for _, m := range attachedVolumes(old) {
		if keep[m.VolumeID] {
			continue
		}
		if err := changeVolume(tx, e, m.VolumeID, func(v *api.Volume) {
			if v.WorkspaceID == old.WorkspaceID {
				v.WorkspaceID, v.MountPath, v.Held = "", "", false
			}
		}); err != nil {
			return err
		}
	}
	return nil
}

// changeVolume applies change to Volume id and stores it if it changed.
func changeVolume(tx *bolt.Tx, e *Entry, id string, change func(v *api.Volume)) error {
	v, err := getVolume(tx, id)
	if err != nil || v == nil {
		return err
	}
	old := cloneVolume(v)
	change(v)
	if volumeEqual(old, v) {
		return nil
	}
	return putVolume(tx, e, old, v)
}

func volumeEqual(a, b *api.Volume) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// loadVolumes reads the records of w's Volumes, in w's order.
func loadVolumes(tx *bolt.Tx, w *api.Workspace) ([]*api.Volume, error) {
	out := make([]*api.Volume, 0, len(w.Volumes))
	for _, m := range w.Volumes {
		v, err := getVolume(tx, m.VolumeID)
		if err != nil {
			return nil, err
		}
		if v == nil {
			return nil, fmt.Errorf("state: workspace %s lists volume %s, which has no record", w.WorkspaceID, m.VolumeID)
		}
		out = append(out, v)
	}
	return out, nil
}

// workspaceVolumes resolves create's --volume and --new-volume into mounts
// and the new Volumes' records (not stored yet, without a pool: they go to
// the default pool of the node the first start is placed on).
func workspaceVolumes(tx *bolt.Tx, e *Entry, ws string, a *WorkspaceCreateArgs) ([]api.VolumeMount, []*api.Volume, error) {
	var mounts []api.VolumeMount
	var vols []*api.Volume
	for _, att := range a.Volumes {
		v, err := resolveVolume(tx, att.Volume)
		if err != nil {
			return nil, nil, err
		}
		switch {
		case v.WorkspaceID != "":
			return nil, nil, api.Errorf(api.CodeFailedPrecondition, "volume %s is attached to workspace %s already: a Volume is attached to one Workspace at a time", v.Name, v.WorkspaceID)
		case v.Pending != nil:
			return nil, nil, volumeBusy(v)
		case v.State != api.VolumeAvailable:
			return nil, nil, api.Errorf(api.CodeFailedPrecondition, "volume %s is %s: a Workspace can attach only an AVAILABLE Volume", v.Name, v.State)
		}
		for _, m := range mounts {
			if m.VolumeID == v.VolumeID {
				return nil, nil, api.Errorf(api.CodeInvalidArgument, "volume %s is given twice: attach it once", v.Name)
			}
		}
		mounts = append(mounts, api.VolumeMount{VolumeID: v.VolumeID, Name: v.Name, Path: att.Path})
		vols = append(vols, v)
	}
	for i, nv := range a.NewVolumes {
		id, name := newVolumeID(ws, i), newVolumeName(ws, i)
		if err := checkNewVolumeName(tx, name, id); err != nil {
			return nil, nil, err
		}
		v := &api.Volume{VolumeID: id, Name: name, State: api.VolumeCreating, SizeBytes: nv.SizeBytes, CreatedAt: *at(e)}
		mounts = append(mounts, api.VolumeMount{VolumeID: id, Name: name, Path: nv.Path})
		vols = append(vols, v)
	}
	return mounts, vols, nil
}

// validateVolumeMounts checks create's Volume arguments.
func validateVolumeMounts(a *WorkspaceCreateArgs) error {
	if n := len(a.Volumes) + len(a.NewVolumes); n > api.MaxWorkspaceVolumes {
		return api.Errorf(api.CodeInvalidArgument, "%d Volumes given: a Workspace has at most %d", n, api.MaxWorkspaceVolumes)
	}
	var paths []string
	for _, att := range a.Volumes {
		if err := api.ValidVolumeRef(att.Volume); err != nil {
			return err
		}
		paths = append(paths, att.Path)
	}
	for _, nv := range a.NewVolumes {
		if err := api.ValidVolumeSize("--new-volume", nv.SizeBytes); err != nil {
			return err
		}
		paths = append(paths, nv.Path)
	}
	for i, p := range paths {
		if err := api.ValidMountPath(p); err != nil {
			return err
		}
		for _, q := range paths[:i] {
			if api.MountsOverlap(p, q) {
				return api.Errorf(api.CodeInvalidArgument, "mount paths %s and %s overlap: give each Volume its own directory, neither inside the other", q, p)
			}
		}
	}
	return nil
}

// newVolumes are the Volumes that go to the default pool of the node an
// execution is placed on: not made yet, and the Workspace has no layer
// (its first start; an earlier placement was refused).
func newVolumes(w *api.Workspace, vols []*api.Volume) []*api.Volume {
	if w.Layer != nil {
		return nil
	}
	var out []*api.Volume
	for _, v := range vols {
		if !v.Made {
			out = append(out, v)
		}
	}
	return out
}

// newBytes is what the new objects of a first start take of pool: the
// layer and the new Volumes not already charged there.
func newBytes(vols []*api.Volume, pool string, layer uint64) uint64 {
	n := layer
	for _, v := range vols {
		if v.PoolID != pool {
			n += v.SizeBytes
		}
	}
	return n
}

// homeNewVolumes puts the new Volumes of an execution on node in pool
// (its default pool, whose room the caller checked) and stores them.
func homeNewVolumes(tx *bolt.Tx, e *Entry, vols []*api.Volume, node, pool string, shared bool) error {
	for _, v := range vols {
		old, err := getVolume(tx, v.VolumeID)
		if err != nil {
			return err
		}
		v.PoolID, v.Shared, v.NodeID = pool, shared, node
		if err := putVolume(tx, e, old, v); err != nil {
			return err
		}
	}
	return nil
}

// volumesMade marks w's Volumes made by its start (the node made the new
// ones and grew every filesystem to its file at the mount).
func volumesMade(tx *bolt.Tx, e *Entry, w *api.Workspace) error {
	for _, m := range w.Volumes {
		err := changeVolume(tx, e, m.VolumeID, func(v *api.Volume) {
			if !v.Made {
				v.Made, v.State = true, api.VolumeAvailable
			}
			if v.Expansion != nil && v.Expansion.FilesystemPending {
				v.Expansion = nil
			}
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// releaseVolumeCommands ends the Volume commands waiting for a node that
// will never answer them (isolated or retired): creates fail (the file may
// be there: deleting the Volume removes it), resizes are dropped, deletes
// go to another member of the pool or wait for one. It returns how many
// it ended.
func releaseVolumeCommands(tx *bolt.Tx, e *Entry, node, why string) (int, error) {
	var ids []string
	prefix := []byte(node + "\x00")
	c := tx.Bucket(bucketVolumeCommands).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		ids = append(ids, string(k[len(prefix):]))
	}
	for _, id := range ids {
		v, err := getVolume(tx, id)
		if err != nil {
			return 0, err
		}
		if v == nil || v.Pending == nil {
			continue
		}
		old := cloneVolume(v)
		p := v.Pending
		v.Pending = nil
		switch p.Kind {
		case api.VolCmdCreate:
			v.State, v.Made = api.VolumeFailed, true
			v.Error = "create: node " + node + " " + why + " before it answered; delete the Volume"
		case api.VolCmdResize:
			v.Expansion = nil
			v.Error = fmt.Sprintf("resize to %s: node %s %s before it answered; resize again", api.FormatBytes(p.SizeBytes), node, why)
		case api.VolCmdDelete:
			files, err := deleteVolumeFiles(tx, e, v, node)
			if err != nil {
				return 0, err
			}
			if !files {
				if err := deleteVolume(tx, e, old); err != nil {
					return 0, err
				}
				continue
			}
		}
		if err := putVolume(tx, e, old, v); err != nil {
			return 0, err
		}
	}
	return len(ids), nil
}

// resumeVolumeDelete hands a Volume delete waiting for its pool to node,
// a member of it now.
func resumeVolumeDelete(tx *bolt.Tx, e *Entry, id, node string) error {
	v, err := getVolume(tx, id)
	if err != nil || v == nil {
		return err
	}
	old := cloneVolume(v)
	v.DeleteWaitsForPool = ""
	v.NodeID = node
	setVolumePending(e, v, api.VolCmdDelete, node, 0, "")
	return putVolume(tx, e, old, v)
}

// loseVolumes ends the Volumes of a lost pool; a delete waiting for the
// pool completes. The caller checked no Instance uses one.
func loseVolumes(tx *bolt.Tx, e *Entry, pool string, res *api.PoolLostResult) error {
	var lost []*api.Volume
	err := tx.Bucket(bucketVolumes).ForEach(func(k, raw []byte) error {
		var v api.Volume
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("state record %s/%s is corrupt: %w", bucketVolumes, k, err)
		}
		if v.PoolID == pool && v.State != api.VolumeLost {
			lost = append(lost, &v)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, v := range lost {
		old := cloneVolume(v)
		res.Volumes++
		if v.WorkspaceID != "" && !containsString(res.Workspaces, v.WorkspaceID) {
			res.Workspaces = append(res.Workspaces, v.WorkspaceID)
		}
		if v.State == api.VolumeDeleting {
			if err := deleteVolume(tx, e, old); err != nil {
				return err
			}
			continue
		}
		v.State, v.Held, v.Pending, v.Expansion = api.VolumeLost, false, nil, nil
		v.Error = "lost with storage pool " + pool + " (declare-lost)"
		if err := putVolume(tx, e, old, v); err != nil {
			return err
		}
	}
	return nil
}

// volumeInUse is the precondition declare-lost checks of a pool's
// Volumes: none may be attached to a running Instance, and none may wait
// for a node's answer it could still give.
func volumeInUse(tx *bolt.Tx, pool string) error {
	return tx.Bucket(bucketVolumes).ForEach(func(k, raw []byte) error {
		var v api.Volume
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("state record %s/%s is corrupt: %w", bucketVolumes, k, err)
		}
		if v.PoolID != pool || v.State == api.VolumeLost {
			return nil
		}
		if v.Held {
			return api.Errorf(api.CodeFailedPrecondition, "volume %s in storage pool %s is held by node %s for workspace %s: stop it first (kibo workspace stop --force %s)", v.Name, pool, v.NodeID, v.WorkspaceID, v.WorkspaceID)
		}
		return nil
	})
}

// GetVolume returns one Volume by name or id, or not_found.
func GetVolume(tx *bolt.Tx, ref string) (*api.Volume, error) { return resolveVolume(tx, ref) }

// VolumeFilter selects Volumes for ListVolumes.
type VolumeFilter struct {
	PoolID      string
	WorkspaceID string
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
		if (f.PoolID != "" && v.PoolID != f.PoolID) || (f.WorkspaceID != "" && v.WorkspaceID != f.WorkspaceID) {
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
