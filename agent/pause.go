package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kibotos/kibotos/buildinfo"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/vmm/platform"
)

// Pause and resume on the node: a pause saves the Instance's guest into
// the snapshot directory beside the Workspace's layer in its pool and
// ends the Instance; a start that carries a snapshot restores it (the
// installation it ran, the same devices), and removes the files once the
// guest runs again. A snapshot the runtime finds unusable is removed and
// said so: ctrl then boots the Workspace afresh.

// snapshotDir is where a Workspace's snapshot lives in a pool.
func (a *Agent) snapshotDir(pool, ws string) (string, error) {
	dir := a.poolPath(pool)
	if dir == "" {
		return "", fmt.Errorf("storage pool %s is not configured on node %s", pool, a.cfg.NodeID)
	}
	return filepath.Join(dir, "snapshots", ws), nil
}

// pauseWorkspace saves the Workspace's running Instance and ends it.
func (a *Agent) pauseWorkspace(ctx context.Context, t api.WorkspaceTask, r *api.WorkspaceTaskResult) error {
	rt := a.cfg.Runtime
	id := t.Command.InstanceID
	if rt == nil {
		return fmt.Errorf("node %s runs no VMs", a.cfg.NodeID)
	}
	dir, err := a.snapshotDir(t.LayerPool, t.WorkspaceID)
	if err != nil {
		return err
	}
	st, err := rt.Status(id)
	if err != nil {
		return fmt.Errorf("instance %s is not on node %s: %w", id, a.cfg.NodeID, err)
	}
	meta, err := rt.Pause(ctx, id, dir)
	if errors.Is(err, runtime.ErrVMMGone) {
		// Nothing of the guest is left: the Instance goes, the layer stays.
		r.InstanceGone = true
		a.forget(ctx, id)
		return err
	}
	if err != nil {
		return err
	}
	if err := rt.Delete(ctx, id); err != nil {
		a.log.Warn("paused instance not deleted", "instance_id", id, "err", err)
	}
	a.releaseObjects(id, objectsOf(st))
	a.tasks.mu.Lock()
	delete(a.tasks.owners, id)
	a.saveOwners()
	a.tasks.mu.Unlock()
	r.Snapshot = &api.SnapshotReport{SizeBytes: meta.StateBytes, Compat: meta.Compat}
	return nil
}

// restoreInstallation is the runtime installation a snapshot needs, which
// must be on this node.
func (a *Agent) restoreInstallation(s *api.TaskSnapshot) (*platform.Installation, error) {
	plats, err := platform.List(a.cfg.DataDir.StorageRoot())
	if err != nil {
		return nil, err
	}
	for _, p := range plats {
		if p.ID != s.Compat.InstallationID {
			continue
		}
		// The restored guest's agent is the snapshot's: this build must
		// drive it like one it took over.
		if why := runtime.InstallationProblem(p.Dir, a.ownPlatformID(), buildinfo.Release); why != "" {
			return nil, fmt.Errorf("%w: node %s cannot drive its runtime installation: %s", runtime.ErrSnapshotUnusable, a.cfg.NodeID, why)
		}
		return p, nil
	}
	return nil, fmt.Errorf("%w: node %s lacks its runtime installation %s", runtime.ErrSnapshotUnusable, a.cfg.NodeID, s.Compat.InstallationID)
}

// ownPlatform is the Platform new Instances start on: the one whose
// guest agent is this node's own executable, never merely the newest
// (another binary's agent may speak a protocol this build does not).
func (a *Agent) ownPlatform() (*platform.Installation, error) {
	sha := a.cfg.PlatformAgent
	if sha == "" {
		var err error
		if sha, err = platform.SelfSHA256(); err != nil {
			return nil, fmt.Errorf("node %s: %w", a.cfg.NodeID, err)
		}
	}
	if in := platform.Own(a.cfg.DataDir.StorageRoot(), sha); in != nil {
		return in, nil
	}
	return nil, fmt.Errorf("node %s has no Platform whose guest agent is its own kibotos executable (sha256 %.12s): run kibotos platform build on it with the kibotos it runs", a.cfg.NodeID, sha)
}

// ownPlatformID is ownPlatform's id, "" when there is none.
func (a *Agent) ownPlatformID() string {
	if in, err := a.ownPlatform(); err == nil {
		return in.ID
	}
	return ""
}

// prepareFork makes a fork's layer and snapshot directory from its
// source's (t.Snapshot.From), in the pool both share.
func (a *Agent) prepareFork(ctx context.Context, t api.WorkspaceTask, layer, dir string) error {
	s := t.Snapshot
	srcLayer, err := a.layerPath(t.LayerPool, s.From)
	if err != nil {
		return err
	}
	srcDir, err := a.snapshotDir(s.PoolID, s.From)
	if err != nil {
		return err
	}
	return runtime.PrepareFork(ctx, a.cfg.NodeID, runtime.ForkFiles{Source: s.From, Fork: t.WorkspaceID, SourceInstance: s.FromInstance,
		SourceLayer: srcLayer, SourceSnapshot: srcDir, Layer: layer, Snapshot: dir})
}

// removeSnapshot removes a Workspace's snapshot files, if any.
func (a *Agent) removeSnapshot(t api.WorkspaceTask) error {
	if t.Snapshot == nil {
		return nil
	}
	return a.removeSnapshotIn(t.Snapshot.PoolID, t.WorkspaceID)
}

// removeSnapshots removes every snapshot a deleted Workspace may have: the
// one its task names, and the one a pause writes beside its layer. ctrl
// accepts a delete while a pause runs and takes the delete for the
// Workspace's command, so it ignores the pause's result and the delete
// names no snapshot; the node runs the pause first (one command per
// object at a time) and its snapshot is on the disk all the same.
func (a *Agent) removeSnapshots(t api.WorkspaceTask) error {
	err := a.removeSnapshot(t)
	// A pool not configured here: the layer's removal says so.
	if (t.Snapshot == nil || t.Snapshot.PoolID != t.LayerPool) && a.poolPath(t.LayerPool) != "" {
		err = errors.Join(err, a.removeSnapshotIn(t.LayerPool, t.WorkspaceID))
	}
	return err
}

func (a *Agent) removeSnapshotIn(pool, ws string) error {
	dir, err := a.snapshotDir(pool, ws)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove the snapshot %s: %w", dir, err)
	}
	return nil
}

// resumeInfo is what the node's VMM can restore, for its report.
func (a *Agent) resumeInfo() *api.ResumeInfo {
	rt := a.cfg.Runtime
	if rt == nil {
		return nil
	}
	r := rt.ResumeInfo()
	if r.QEMUVersion == "" {
		return nil
	}
	// Only installations this build drives: a snapshot of another is no
	// use here. Load checked sizes; digests are checked at the restore.
	plats, _ := platform.List(a.cfg.DataDir.StorageRoot())
	own := a.ownPlatformID()
	for _, p := range plats {
		if platform.Drivable(p, own, buildinfo.Release) == nil {
			r.Installations = append(r.Installations, p.ID)
		}
	}
	return &r
}

// failedResume is the answer to a start whose restore failed: an unusable
// snapshot is removed and said so.
func (a *Agent) failedResume(t api.WorkspaceTask, r *api.WorkspaceTaskResult, err error) {
	r.Outcome, r.Error = api.OutcomeFailed, err.Error()
	if errors.Is(err, runtime.ErrSnapshotUnusable) {
		if rerr := a.removeSnapshot(t); rerr != nil {
			a.log.Warn("unusable snapshot not removed", "workspace_id", t.WorkspaceID, "err", rerr)
			return
		}
		r.SnapshotDiscarded = true
	}
}
