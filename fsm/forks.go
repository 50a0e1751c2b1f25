package fsm

import (
	"bytes"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Forks (workspace create --from, LevelForks). A fork of a PAUSED
// Workspace is a new Workspace whose first start restores the source's
// snapshot instead of booting: the same template, CPU and memory, its
// layer in the source's pool (the node makes it a copy-on-write overlay
// of the source's layer as it was at the pause, and links the snapshot's
// state file, agent/runtime/fork.go). Placement is a resume's: a node
// that reaches the pool and can restore the snapshot. Until the fork's
// first start is over, its node reads the source's files, so the source
// is neither started, stopped nor deleted (the forks bucket); afterwards
// the two share nothing a write or a delete of one can reach.
//
// A source with Volumes is refused: a Volume is one disk with one
// holder, and a fork would need a copy of it as of the pause.

// LevelForks is the level of WorkspaceCreateArgs.From.
const LevelForks = 6

// forkKey indexes a fork whose first start reads its source's files.
func forkKey(source, fork string) []byte { return []byte(source + "\x00" + fork) }

// forkSource is the source whose files w's first start still reads, "".
func forkSource(w *api.Workspace) string {
	if w == nil || w.Snapshot == nil || w.Snapshot.Discarded {
		return ""
	}
	return w.Snapshot.From
}

// moveForks keeps the forks bucket in step with w (old before, either
// may be nil).
func moveForks(tx *bolt.Tx, old, w *api.Workspace) error {
	return moveIndex(tx.Bucket(bucketForks), old, w, func(x *api.Workspace) []byte {
		if src := forkSource(x); src != "" {
			return forkKey(src, x.WorkspaceID)
		}
		return nil
	})
}

// notForking refuses what of a source while a fork's first start reads
// its files.
func notForking(tx *bolt.Tx, w *api.Workspace, what string) error {
	prefix := []byte(w.WorkspaceID + "\x00")
	k, _ := tx.Bucket(bucketForks).Cursor().Seek(prefix)
	if k == nil || !bytes.HasPrefix(k, prefix) {
		return nil
	}
	fork := string(k[len(prefix):])
	return api.Errorf(api.CodeFailedPrecondition, "workspace %s is being forked by %s, whose first start reads its snapshot and layer: %s it once %s has started (kibo workspace get %s), or delete %s", w.WorkspaceID, fork, what, fork, fork, fork)
}

// forkOf checks a create --from against its source and returns the
// source: PAUSED with a snapshot to restore, no Volumes, and nothing the
// snapshot cannot be restored into.
func forkOf(tx *bolt.Tx, a *WorkspaceCreateArgs) (*api.Workspace, error) {
	src, err := mustWorkspace(tx, a.From)
	if err != nil {
		return nil, err
	}
	id := src.WorkspaceID
	switch {
	case a.Template != "" && a.Template != src.Template:
		return nil, api.Errorf(api.CodeInvalidArgument, "--template %s: a fork of workspace %s runs its template %s; leave --template out", a.Template, id, src.Template)
	case a.CPU != 0 && a.CPU != src.CPU, a.MemoryBytes != 0 && a.MemoryBytes != src.MemoryBytes:
		return nil, api.Errorf(api.CodeInvalidArgument, "a fork of workspace %s has its %s cores and %d MiB: a snapshot restores only into the vCPUs and memory it was saved with; leave --cpu and --memory out", id, src.CPU, src.MemoryBytes>>20)
	case len(a.Volumes) > 0 || len(a.NewVolumes) > 0:
		return nil, api.Errorf(api.CodeInvalidArgument, "a fork of workspace %s takes no --volume or --new-volume: a restored guest must have the devices it was saved with", id)
	case a.Import != nil:
		return nil, api.Errorf(api.CodeInvalidArgument, "a fork of workspace %s cannot also be a transfer import", id)
	case src.State != api.WorkspacePaused || src.Pending != nil:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s is %s: a fork needs it PAUSED with its snapshot; start it if it is not running, pause it with kibo workspace pause %s, then fork it", id, stateWithPending(src), id)
	case src.Snapshot == nil || src.Snapshot.Discarded:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s is PAUSED without a snapshot to restore (stopped while paused, which discarded it): start it, pause it again, then fork it", id)
	case len(src.Volumes) > 0:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s has %d Volumes attached: a fork copies only the writable layer and memory, and a Volume has one holder; fork a Workspace without Volumes", id, len(src.Volumes))
	case src.Layer == nil || src.Layer.Lost:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s has no writable layer to fork (lost with its pool): delete it", id)
	case src.Exporting != "":
		return nil, notExporting(src, "fork")
	}
	return src, nil
}

// newFork is the record of a fork of src, before placement: its layer
// right in the source's pool (made by the node of its first start) and
// the source's snapshot to restore.
func newFork(ac *applyCtx, id string, a *WorkspaceCreateArgs, src *api.Workspace) (*api.Workspace, error) {
	// The source's policy unless the create gives one.
	p := a.Network.Effective()
	if a.Network == nil && src.Network != nil {
		p = *src.Network
	}
	network, err := normalizeNetwork(ac.tx, id, src.Namespace, p, false)
	if err != nil {
		return nil, err
	}
	pool := api.LayerPoolID(src.Layer)
	if _, err := poolRoom(ac.tx, pool, "the writable layer of a fork of workspace "+src.WorkspaceID, src.Layer.SizeBytes); err != nil {
		return nil, err
	}
	s := *src.Snapshot
	s.From = src.WorkspaceID
	return &api.Workspace{WorkspaceID: id, Namespace: src.Namespace, Template: src.Template, CPU: src.CPU, MemoryBytes: src.MemoryBytes, Labels: a.Labels, Network: &network,
		CreatedAt: *at(ac.e), Platform: src.Platform, ForkedFrom: src.WorkspaceID, Snapshot: &s,
		Layer: &api.LayerRight{NodeID: src.Layer.NodeID, PoolID: src.Layer.PoolID, Shared: src.Layer.Shared, SizeBytes: src.Layer.SizeBytes}}, nil
}

// forkStartFailed applies a failed first start of a fork: its snapshot
// (its own names of the source's files, if made) is discarded, and the
// Workspace is FAILED; a start boots it afresh from its layer.
func forkStartFailed(e *Entry, w *api.Workspace, a *WorkspaceResultArgs) {
	w.Snapshot.Discarded = true
	w.State = api.WorkspaceFailed
	w.Failure = &api.WorkspaceFailure{Reason: api.FailureStart,
		Message: "the first restore of this fork of workspace " + w.ForkedFrom + " failed: " + a.Error + "; delete it and fork again (a start boots it afresh)", At: *at(e)}
}
